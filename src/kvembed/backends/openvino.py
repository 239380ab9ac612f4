"""OpenVINO backend: runs an artifact's ``model.onnx`` with OpenVINO's CPU plugin instead of onnxruntime.

``openvino`` is optional (``pip install 'kvembed[openvino]'``) and imported only when a session is
made, so the runtime imports without it. :class:`OpenVINOSession` implements the backends'
:class:`~kvembed.backends.protocol.Session` protocol. Dynamic batch and sequence dimensions stay
dynamic (the model is compiled as exported, never reshaped).

OpenVINO 2026.4's ONNX frontend reads the opset-23 ``Attention`` op but gives its output the head
count of K/V, so grouped-query graphs (fewer K/V heads than query heads: every modern LLM) fail to
compile. :func:`repeat_kv_heads` mends the model OpenVINO read, before compiling: each attention
node gets K and V with their heads repeated to the query's count, which is what grouped-query
attention means, so the function is unchanged and OpenVINO compiles it. (Rewriting the ONNX graph
instead would not do: OpenVINO refuses external data outside the directory of the graph it reads.)

An fp16 graph under the bf16 hint (a CPU with BF16 but no FP16: Zen 4 and 5, Cooper Lake) is compiled
from a copy retyped to bf16 (:func:`write_bf16_graph`). The plugin cannot keep fp16 weights as they
are there: it converts an fp16 graph's constants through f32 while compiling (twice the weights,
then its bf16 copy), and its weight-decompression kernels take integer weights only; a graph whose
weights and activations are bf16 already compiles with its weights as they are
(benchmarks/log/fp16-on-cpu.md). fp16 to bf16 keeps the range and loses mantissa bits (10 to 7): weights
that came from a bf16 checkpoint, as 4B-8B models ship, come back exactly; how close the outputs
come is what the export's advisory check on ``openvino-bf16`` measures.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import mmap
import os
import re
import shutil
import sys
import tempfile
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..artifact.external_data import Scratch, stream_initializers, tensor_bytes
from ..artifact.layout import MODEL
from ..artifact.staging import write_bytes_atomic, write_text_atomic
from ..cache import cache_root
from ..errors import InvalidInput, MissingDependency
from ..extras import install_hint
from .cpu import cpu_features
from ..status import waiting

NAME = "openvino"
OPENVINO = "OpenVINO"
PRECISIONS = ("f32", "bf16", "f16")
#: the hints that may compute the graph's final normalisation in 16-bit floats (:attr:`OpenVINOSession.renormalise`)
HALF_PRECISIONS = frozenset({"f16", "bf16"})
INSTALL = install_hint("openvino")
MEND_VERSION = 2  # bump when what is compiled changes (repeat_kv_heads, the bf16 graph): kept blobs are then rebuilt
#: resident bytes per byte of graph files at the first load, which compiles from the ONNX and holds
#: the weights read and their converted copy at once (later loads import the blob and hold about
#: one copy: benchmarks/log/export-memory-4b.md). An int8 artifact's weights stay int8 (and the blob streams to
#: disk, not through memory); an fp16 file's are converted to wider copies while compiling under
#: the f32 hint (the f16 and bf16 hints keep them at two bytes: :data:`NATIVE_FP16_FACTOR`); a bf16
#: artifact holds the fp32 graph. Unknown precisions get the largest.
OPENVINO_WEIGHT_FACTOR = {"fp32": 2.5, "bf16": 2.5, "int8": 1.3, "fp16": 5.0}
#: an fp16 graph under the f16 hint on a CPU with FP16 (the plugin packs the fp16 weights as they
#: are) or under the bf16 hint on one with BF16 (it packs the bf16 graph's: :func:`write_bf16_graph`)
NATIVE_FP16_FACTOR = 1.3


@dataclass(frozen=True)
class OpenVINOOptions:
    """How an OpenVINO session is made (see :class:`OpenVINOSession`): inference threads, the
    precision hint (None: bf16 only where the CPU has it) and the compiled-model cache directory
    (None: :func:`default_cache_dir`; False: none). ``Embedder.load``'s flat keywords for the last
    two are ``ov_precision`` and ``ov_cache_dir`` (each field's ``keyword``)."""

    threads: int | None = None
    precision: str | None = field(default=None, metadata={"keyword": "ov_precision"})
    cache_dir: str | os.PathLike[str] | None | bool = field(default=None, metadata={"keyword": "ov_cache_dir"})


def probe(provider: str | None = None) -> str | None:
    """Why OpenVINO cannot be used here, or None (it serves one provider, ``"openvino"``)."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return f"openvino is not installed ({INSTALL})"
    except Exception as err:  # a broken install
        return f"import openvino failed ({type(err).__name__}); {INSTALL}"
    return None


def weight_factor(precision: str, options: OpenVINOOptions | None = None) -> float:
    """Resident bytes per byte of graph file while OpenVINO compiles it under the options' precision
    hint (see :data:`OPENVINO_WEIGHT_FACTOR`)."""
    if precision == "fp16" and hint_for((options or OpenVINOOptions()).precision) in ("f16", "bf16"):
        return NATIVE_FP16_FACTOR
    return OPENVINO_WEIGHT_FACTOR.get(precision, max(OPENVINO_WEIGHT_FACTOR.values()))


def import_openvino() -> Any:
    try:
        import openvino
    except ImportError as err:
        raise MissingDependency(f"provider 'openvino' needs the openvino package: {INSTALL} ({err})") from None
    return openvino


def repeat_kv_heads(model: Any) -> int:
    """Give every ``ScaledDotProductAttention`` of ``model`` (an ``openvino.Model`` read from ONNX,
    changed in place) K and V with as many heads as Q; return how many nodes were changed.

    [B, Hkv, S, D] -> Unsqueeze(2) -> Broadcast [B, Hkv, Hq/Hkv, S, D] -> Reshape [B, Hq, S, D]:
    head ``h`` of the result is K/V head ``h // (Hq/Hkv)``, the grouping of grouped-query
    attention. Head counts are read at run time (Q's is dynamic after the ONNX frontend); where
    they are equal the group is 1 and the result is K/V unchanged. Nodes of another rank are left."""
    from openvino import opset13 as ops

    def pick(shape: Any, *dims: int) -> Any:
        return ops.gather(shape, ops.constant(np.array(dims, dtype=np.int64)), ops.constant(np.int64(0)))

    changed = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "ScaledDotProductAttention":
            continue
        ranks = [node.input_value(i).get_partial_shape().rank for i in range(3)]
        if not all(rank.is_static and rank.get_length() == 4 for rank in ranks):
            continue
        q_heads = pick(ops.shape_of(node.input_value(0)), 1)
        for slot in (1, 2):
            source = node.input_value(slot)
            shape = ops.shape_of(source)
            group = ops.divide(q_heads, pick(shape, 1))
            grouped = ops.concat([pick(shape, 0, 1), group, pick(shape, 2, 3)], 0)
            repeated = ops.concat([pick(shape, 0), q_heads, pick(shape, 2, 3)], 0)
            widened = ops.broadcast(ops.unsqueeze(source, ops.constant(np.int64(2))), grouped)
            node.input(slot).replace_source_output(ops.reshape(widened, repeated, special_zero=False).output(0))
        changed += 1
    if changed:
        model.validate_nodes_and_infer_types()
    return changed


def default_precision(core: Any = None) -> str:
    """``"bf16"`` when this CPU has BF16 (:func:`~kvembed.backends.cpu.cpu_features`: its flags,
    OpenVINO's plugin, or ``KVEMBED_CPU_FEATURES``), else ``"f32"``. ``core`` is not needed any more."""
    return "bf16" if cpu_features().bf16 else "f32"


def hint_for(precision: str | None) -> str:
    """The precision hint a session compiles with: ``precision`` (None: :func:`default_precision`),
    except bf16 on a CPU without BF16 and f16 on one without FP16, which run f32: OpenVINO itself
    does so there, and saying it here makes a stated CPU (``KVEMBED_CPU_FEATURES``) behave as that
    CPU would."""
    if precision is None:
        return default_precision()
    return precision if cpu_features().runs(precision) else "f32"


def ran_precision(compiled: Any, fallback: str) -> str:
    """The inference precision a compiled model reports it runs (``"bf16"``, ``"f32"``), or ``fallback``."""
    try:
        return str(compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name())
    except Exception:  # an old plugin without the property
        return fallback


class CompiledCache:
    """Compiled models kept on disk, so a second load skips reading, mending and compiling the ONNX.

    One slot per (model file, precision): ``<dir>/<slot>.blob`` is the compiled model as OpenVINO
    exports it and ``<slot>.json`` the fingerprint it was made from (OpenVINO's version, the
    precision, size and mtime of every ``model*`` file beside the graph, external data included); a
    stale slot is rebuilt in place, so the cache grows with the number of models, not of
    re-exports. The blob is imported from a memory map (the weights stay file-backed pages).

    The blob is written by OpenVINO's own ``CACHE_DIR`` into a fresh folder (:meth:`staging`) and
    then moved into its slot (:meth:`adopt`): OpenVINO streams it to the file as it exports, where
    ``export_model()`` would hold all of it in memory, once more the weights. ``CACHE_DIR`` is not
    used to look blobs up: it keys them by a hash of the model, which costs a read of every weight
    (no faster than compiling, benchmarks/log/openvino.md), where the fingerprint costs a ``stat``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).expanduser()

    def fingerprint(self, model_path: Path, precision: str, version: str) -> dict[str, Any]:
        # every model.* file: an int8 artifact's OpenVINO graph reads model.onnx.data, not a file of its own
        base = model_path.name.split(".")[0]
        files = sorted(p for p in model_path.parent.iterdir() if p.is_file() and p.name.split(".")[0] == base)
        return {
            "model": str(model_path.resolve()),
            "openvino": version,
            "precision": precision,
            "mend": MEND_VERSION,
            "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files],
        }

    def slot(self, fingerprint: Mapping[str, Any]) -> Path:
        key = hashlib.sha256(f"{fingerprint['model']}|{fingerprint['precision']}".encode()).hexdigest()[:20]
        return self.directory / key

    def load(self, fingerprint: Mapping[str, Any]) -> Path | None:
        """The blob made from exactly ``fingerprint``, or None."""
        slot = self.slot(fingerprint)
        try:
            if json.loads(slot.with_suffix(".json").read_text()) == fingerprint and slot.with_suffix(".blob").is_file():
                return slot.with_suffix(".blob")
        except (OSError, ValueError):
            pass
        return None

    def store(self, fingerprint: Mapping[str, Any], compiled: Any) -> None:
        """Write ``compiled``'s blob from memory, then its fingerprint (each by atomic rename:
        readers never see half of one); the fallback where :meth:`staging` wrote no blob."""
        slot = self.slot(fingerprint)
        self.directory.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(slot.with_suffix(".blob"), compiled.export_model().getbuffer())
        write_text_atomic(slot.with_suffix(".json"), json.dumps(fingerprint))

    def staging(self) -> Path:
        """A fresh folder in the cache directory for OpenVINO's ``CACHE_DIR`` to write one blob into
        (on the cache's filesystem, so :meth:`adopt` is a rename). Folders left by processes that
        died while compiling (a partial blob each, as big as the weights) are removed first."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for left in self.directory.glob(f"{STAGING_PREFIX}*"):
            if not _alive(left.name[len(STAGING_PREFIX):].split("-", 1)[0]):
                shutil.rmtree(left, ignore_errors=True)
        return Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=self.directory))

    def adopt(self, fingerprint: Mapping[str, Any], blob: Path) -> None:
        """Move ``blob`` (written by OpenVINO into :meth:`staging`) into ``fingerprint``'s slot, then
        write the fingerprint: a reader sees the old slot, no slot, or the new one whole."""
        slot = self.slot(fingerprint)
        slot.with_suffix(".json").unlink(missing_ok=True)  # the old fingerprint never names the new blob
        os.replace(blob, slot.with_suffix(".blob"))
        write_text_atomic(slot.with_suffix(".json"), json.dumps(fingerprint))


#: the cache's staging folders: ``.compiling-<pid>-<random>``
STAGING_PREFIX = ".compiling-"


def _alive(pid: str) -> bool:
    """Whether the process ``pid`` (a string from a folder name) runs; a name that is no pid is not."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # someone else's process
        return True
    return True


#: OpenVINO's ``CACHE_DIR`` blobs begin with one XML header line before what ``export_model()`` writes
_HEADER = re.compile(rb"<\?xml[^\n]*?<compiled_blob[^\n]*?/>\n")
_ALIGNMENT = re.compile(rb'header_size_alignment="(\d+)"')


def payload_offset(blob: bytes | mmap.mmap) -> int:
    """Where the compiled model starts in ``blob``: after the header line OpenVINO's ``CACHE_DIR``
    writes, which OpenVINO pads with zeros to a multiple of its ``header_size_alignment`` where that
    is not 0 (``CompiledBlobHeader``'s writer); 0 for a blob without the header (``export_model()``)."""
    head = bytes(blob[:4096])
    match = _HEADER.match(head)
    if match is None:
        return 0
    alignment = _ALIGNMENT.search(match.group(0))
    step = int(alignment.group(1)) if alignment else 0
    end = match.end()
    return -(-end // step) * step if step > 1 else end


#: Linux's MADV_PAGEOUT (5.4+; Python 3.11's mmap module does not name it)
MADV_PAGEOUT = getattr(mmap, "MADV_PAGEOUT", 21 if sys.platform.startswith("linux") else None)


def release_pages(mapped: mmap.mmap) -> bool:
    """Ask the kernel to reclaim ``mapped``'s resident pages; True when it accepted.

    Importing a blob reads every constant once, and the CPU plugin keeps its own repacked copy of
    the matmul weights; the blob's pages stay resident (counted in RSS) though most are not read
    again. ``MADV_PAGEOUT`` only reclaims: a page still needed is read back from the file on its
    next touch, so this is safe whatever OpenVINO maps where; a later call reads back only the
    small part of the blob it touches."""
    if MADV_PAGEOUT is None or not hasattr(mapped, "madvise"):
        return False
    try:
        mapped.madvise(MADV_PAGEOUT)
    except OSError:  # EINVAL before Linux 5.4
        return False
    return True


@contextlib.contextmanager
def pages_released_meanwhile(mapped: mmap.mmap, interval: float = 0.05) -> Iterator[None]:
    """Release ``mapped``'s pages every ``interval`` seconds while the body runs, and once after.

    OpenVINO's import reads the whole blob (every constant, as f32) while it builds
    its own, smaller copy; released only at the end, both are resident at once and set the
    process's peak. Released as the import goes, the peak is the plugin's copy plus what was read
    in the last ``interval``."""
    done = threading.Event()

    def pager() -> None:
        while not done.wait(interval):
            release_pages(mapped)

    thread = threading.Thread(target=pager, name="kvembed-ov-pageout", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        release_pages(mapped)


#: compile properties beyond the precision hint: none, so threads stay pinned (OpenVINO's default), faster
#: on a quiet server than unpinned, which only help beside other busy processes (benchmarks/log/openvino.md)
RUN_PROPERTIES: dict[str, Any] = {}

#: a session's ``call_cost``: each call streams every weight, so a split must save more padding than on onnxruntime
CALL_COST = 128  # (benchmarks/log/openvino.md, "Short inputs")
#: the first calls of an imported model, during which the blob's pages are released (:meth:`OpenVINOSession._paging`)
PAGED_CALLS = 2


def default_cache_dir() -> Path:
    """``KVEMBED_CACHE_DIR``/openvino (default ``~/.cache/kvembed/openvino``)."""
    return cache_root() / "openvino"


class OpenVINOSession:
    """A model compiled for OpenVINO's CPU device, behind the :class:`~kvembed.backends.protocol.Session` protocol.

    ``precision``: ``INFERENCE_PRECISION_HINT`` (``"f32"``, ``"bf16"`` or ``"f16"``; None = bf16 only
    where the CPU has it; bf16 or f16 on a CPU without it runs f32, see :func:`hint_for`); :attr:`precision`
    is what the compiled model reports it runs. ``threads``: ``INFERENCE_NUM_THREADS`` (None = OpenVINO's choice).
    ``cache_dir``: where compiled models are kept (:class:`CompiledCache`; None = the default
    :func:`default_cache_dir`, False = no cache). A cache that cannot be read or written is a
    warning, never a failure. ``from_cache`` says whether this load imported a kept blob. Each
    :meth:`run` holds an infer request of its own while it runs (idle ones are reused), so
    concurrent calls from several threads are safe.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        threads: int | None = None,
        precision: str | None = None,
        cache_dir: str | os.PathLike[str] | None | bool = None,
    ) -> None:
        if precision is not None and precision not in PRECISIONS:
            raise InvalidInput(f"ov_precision must be one of {', '.join(PRECISIONS)} (or None for automatic), got {precision!r}")
        if threads is not None and int(threads) < 1:
            raise InvalidInput(f"threads must be >= 1, got {threads}")
        ov = import_openvino()
        self._ov = ov
        self.core = ov.Core()
        #: the precision asked for (None: the CPU's default); :attr:`precision` is what runs
        self.hint = precision
        self.precision = hint_for(precision)
        self.config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": self.precision, **RUN_PROPERTIES}
        if threads is not None:
            self.config["INFERENCE_NUM_THREADS"] = int(threads)
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise FileNotFoundError(f"no ONNX graph at {str(self.model_path)!r}")
        self._blob: Any = None  # the memory-mapped blob an imported model reads from: kept alive with it
        self._paged_calls = 0  # calls run with the blob's pages released meanwhile (:meth:`_paging`)
        cache = None if cache_dir is False else CompiledCache(default_cache_dir() if cache_dir in (None, True) else cache_dir)
        fingerprint = cache.fingerprint(self.model_path, self.precision, ov.get_version()) if cache else None
        blob = cache.load(fingerprint) if cache else None
        name = self.model_path.name
        if blob is not None:
            with waiting(f"reading the compiled {name} from the OpenVINO cache ({self.precision} hint)"):
                self.compiled = self._import(blob)
        else:
            self.compiled = None
        self.from_cache = self.compiled is not None
        if self.compiled is None:
            kept = "uncached" if cache is None else f"first load: kept in {cache.directory} for the next"
            with waiting(f"compiling {name} for OpenVINO ({self.precision} hint; {kept})"):
                self.compiled = self._compile() if cache is None else self._compile_into(cache, fingerprint)
        self._inputs = [port.get_any_name() for port in self.compiled.inputs]
        self.precision = ran_precision(self.compiled, self.precision)
        self._lock, self._idle = threading.Lock(), []  # infer requests no call is using (:meth:`run`)

    def _compile_into(self, cache: CompiledCache, fingerprint: Mapping[str, Any]) -> Any:
        """Compile, keep the blob in ``cache`` and return the model imported from it.

        The model compiled from ONNX holds the constants it read (anonymous memory, or the ONNX
        file's pages); the one imported from the blob holds them as pages the session releases
        (:meth:`_import`, :meth:`_paging`). The compiled one is dropped before the import, so the
        two never coexist; should OpenVINO refuse its own blob, the model is compiled again, uncached."""
        def uncached(err: Exception) -> None:
            warnings.warn(f"OpenVINO cache {str(cache.directory)!r} not written ({err}); loads stay uncached", stacklevel=6)

        try:
            staging = cache.staging()
        except OSError as err:
            uncached(err)
            return self._compile()
        try:
            compiled = self._compile({"CACHE_DIR": str(staging)}, staging)
            written = sorted(staging.glob("*.blob"))
            if len(written) == 1:
                cache.adopt(fingerprint, written[0])
            else:  # a plugin that did not cache: its export, from memory
                cache.store(fingerprint, compiled)
        except OSError as err:
            uncached(err)
            return compiled
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        del compiled
        return self._import(cache.load(fingerprint)) or self._compile()

    def _compile(self, extra: Mapping[str, Any] | None = None, workdir: Path | None = None) -> Any:
        """Read the ONNX (:meth:`_graph_to_compile`), mend its attention, compile (with :attr:`config`
        and ``extra``); OpenVINO's errors as one line."""
        try:
            model = self.core.read_model(str(self._graph_to_compile(workdir)))
            repeat_kv_heads(model)
            return self.core.compile_model(model, "CPU", {**self.config, **(extra or {})})
        except RuntimeError as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            detail = (lines[-1] if lines else type(err).__name__)[:300]  # OpenVINO puts the cause last
            raise InvalidInput(
                f"OpenVINO cannot compile {self.model_path} ({detail}); if the file is damaged re-export it, "
                "else run it with provider='cpu' (onnxruntime)"
            ) from err

    def _graph_to_compile(self, workdir: Path | None) -> Path:
        """The graph file to compile: :attr:`model_path`, or under the bf16 hint, when its weights are
        fp16, that graph retyped to bf16 (:func:`write_bf16_graph`; OpenVINO would widen fp16 weights
        through f32, twice their memory) written into ``workdir`` (the cache's staging folder; None:
        one of the default cache's, removed with this session). Where it cannot be written, an
        error saying what to do: compiling the fp16 graph instead can exhaust memory with a big model."""
        if self.precision != "bf16":
            return self.model_path
        try:
            model = fp16_graph(self.model_path)
        except ImportError:
            warnings.warn(f"onnx is not installed ({INSTALL}), so {self.model_path.name} is compiled as it is: were its "
                          "weights fp16, OpenVINO's bf16 hint would widen them through f32 (twice their memory)", stacklevel=6)
            return self.model_path
        except Exception:  # not a graph onnx can read: OpenVINO's own read says what is wrong with it
            return self.model_path
        if model is None:
            return self.model_path
        try:
            if workdir is None:
                workdir = CompiledCache(default_cache_dir()).staging()
                weakref.finalize(self, shutil.rmtree, workdir, True)  # the compiled model reads it while it lives
            return write_bf16_graph(model, self.model_path, workdir)
        except (OSError, ValueError) as err:
            raise InvalidInput(
                f"OpenVINO bf16 runs {self.model_path.name}'s fp16 weights from a bf16 copy, which was not written ({err}); "
                "free disk space or pass ov_cache_dir on a disk with room, or run ov_precision='f32' or provider='cpu'"
            ) from err

    def _import(self, blob: Path | None) -> Any:
        """The compiled model kept in ``blob``, or None (with a warning) when OpenVINO refuses it.

        The blob is mapped copy-on-write and shared with OpenVINO (no copy of the weights), kept
        alive with the model, and its pages released as the import reads them (:func:`pages_released_meanwhile`)."""
        if blob is None:
            return None
        try:
            with open(blob, "rb") as handle:
                mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            tensor = self._ov.Tensor(np.frombuffer(mapped, dtype=np.uint8, offset=payload_offset(mapped)), shared_memory=True)
            with pages_released_meanwhile(mapped):
                compiled = self.core.import_model(tensor, "CPU", self.config)
        except (RuntimeError, OSError, ValueError) as err:
            detail = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
            warnings.warn(f"OpenVINO cache blob {str(blob)!r} unusable, recompiling ({detail})", stacklevel=6)
            return None
        self._blob = (mapped, tensor)
        return compiled

    backend = NAME
    limits = None  # any shape
    on_cpu = True
    call_cost = CALL_COST

    @property
    def name(self) -> str:
        """``openvino-`` and the precision the compiled model reports it runs (``openvino-bf16``)."""
        return f"{NAME}-{self.precision}"

    @property
    def renormalise(self) -> bool:
        """True under the f16 and bf16 hints (every op fp16; an fp16 graph retyped to bf16): unit vectors
        come back with norms up to ~1e-4 (f16) or ~1e-3 (bf16) off 1 (an fp32 graph's: no harm)."""
        return self.precision in HALF_PRECISIONS

    @property
    def input_names(self) -> list[str]:
        return list(self._inputs)

    @property
    def providers(self) -> list[str]:
        return [OPENVINO, self.precision]

    def max_rows(self, width: int) -> int | None:
        return None

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """One call on an idle kept infer request (a new one when all are busy: no call makes one
        otherwise); the inputs are shared with OpenVINO, the outputs copied out before it is kept."""
        with self._lock:
            request = self._idle.pop() if self._idle else self.compiled.create_infer_request()
        try:
            with self._paging():
                request.infer({name: np.ascontiguousarray(array) for name, array in feeds.items()}, share_inputs=True)
            return [np.array(request.get_tensor(name).data, copy=True) for name in output_names]
        finally:
            with self._lock:
                self._idle.append(request)

    def _paging(self) -> Any:
        """The blob's pages released while one of the first :data:`PAGED_CALLS` calls runs.

        The CPU plugin repacks compressed (int8) weights during the first inference, not at import:
        it reads them from the blob, which would leave the blob resident beside the plugin's copy,
        twice the weights. Released as the call goes, the peak is the plugin's copy plus what was
        read in the last interval; later calls read the packed copy only."""
        if self._blob is None or self._paged_calls >= PAGED_CALLS:
            return contextlib.nullcontext()
        self._paged_calls += 1
        return pages_released_meanwhile(self._blob[0])


def open_graph(model_path: str | os.PathLike[str], provider: str = NAME, options: OpenVINOOptions | None = None) -> OpenVINOSession:
    """``model_path`` compiled for OpenVINO's CPU plugin with ``options`` (``provider`` is always ``"openvino"``)."""
    o = options or OpenVINOOptions()
    return OpenVINOSession(model_path, o.threads, o.precision, o.cache_dir)


# -- an fp16 graph retyped to bf16 (see the module docstring) -------------------------------------

#: free disk the bf16 graph's data file may not leave less than, beyond its own bytes
DISK_MARGIN = 256 * 1024**2


def fp16_graph(source: Path) -> Any:
    """The graph at ``source`` (an ``onnx.ModelProto`` without its external data) when it has fp16
    weights, else None."""
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    return model if any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer) else None


def write_bf16_graph(model: Any, source: Path, folder: Path) -> Path:
    """Write ``model`` (:func:`fp16_graph` of ``source``) with every fp16 type bf16 as
    ``folder``/model.onnx, its weights in ``model.onnx.data`` there, and return that path: the
    initializers converted one tensor at a time on their way to the data file (as the exporter
    streams them), the ``Cast`` targets, the constants in node attributes and the value types; the
    fp16 graph's fp32 islands stay fp32. An OSError when ``folder``'s disk lacks the room (the
    weights' bytes plus :data:`DISK_MARGIN`) or the write fails; a ValueError for a graph with
    subgraphs (kvembed's exporter writes none)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        raise ValueError(f"{source.name} has subgraphs, which the bf16 retyping does not cover")
    needed = sum(tensor_bytes(t) for t in graph.initializer) + DISK_MARGIN
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(errno.ENOSPC, f"a bf16 copy of {source.name}'s weights needs {needed / 1e9:.1f} GB free in {folder}, "
                                    f"there are {free / 1e9:.1f} GB")
    bf16 = helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.INT and attribute.name in ("to", "dtype") and attribute.i == TensorProto.FLOAT16:
                attribute.i = TensorProto.BFLOAT16
            elif attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == TensorProto.FLOAT16:
                attribute.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attribute.t).astype(bf16), attribute.t.name))
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
            value.type.tensor_type.elem_type = TensorProto.BFLOAT16

    def to_bf16(tensor: Any, values: np.ndarray | None, scratch: Scratch) -> np.ndarray | None:
        if values is None or tensor.data_type != TensorProto.FLOAT16:
            return None
        out = scratch.array("bf16", values.shape, bf16)
        out[...] = values  # fp16 -> bf16, rounded to nearest even
        return out

    target = folder / MODEL
    stream_initializers(model, source.parent, target, to_bf16)
    return target
