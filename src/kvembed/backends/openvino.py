"""OpenVINO backend: runs an artifact's ``model.onnx`` with OpenVINO's CPU plugin instead of onnxruntime.

``openvino`` is optional (``pip install 'kvembed[openvino]'``) and imported only when a session is
made, so the runtime imports without it. :class:`OpenVINOSession` implements the backends'
:class:`~kvembed.backends.protocol.Session` protocol. Dynamic batch and sequence dimensions stay
dynamic (the model is compiled as exported, never reshaped).

Its helpers live in :mod:`kvembed.backends.openvino_support`, one job a module, and their public
names are importable from here too: the compiled-model cache (:class:`CompiledCache`,
:func:`default_cache_dir`), reading and paging a compiled blob (:func:`payload_offset`,
:func:`pages_released_meanwhile`) and the graph rewrites made before compiling
(:func:`repeat_kv_heads`, which mends grouped-query attention for OpenVINO's ONNX frontend, and
:func:`write_bf16_graph`, an fp16 graph's GEMM weights retyped to bf16 for the bf16 hint; why each is needed is
said in :mod:`~kvembed.backends.openvino_support.rewrites`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import threading
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InvalidInput, MissingDependency
from ..extras import install_hint
from .cpu import cpu_features
from ..status import waiting
# the helpers' public names stay importable from here (the names this module does not use: re-exported)
from .openvino_support.blob import MADV_PAGEOUT, pages_released_meanwhile, payload_offset, release_pages  # noqa: F401
from .openvino_support.compiled_cache import MEND_VERSION, STAGING_PREFIX, CompiledCache, default_cache_dir  # noqa: F401
from .openvino_support.rewrites import DISK_MARGIN, fp16_graph, repeat_kv_heads, write_bf16_graph

NAME = "openvino"
OPENVINO = "OpenVINO"
PRECISIONS = ("f32", "bf16", "f16")
#: the hints that may compute the graph's final normalisation in 16-bit floats (:attr:`OpenVINOSession.renormalise`)
HALF_PRECISIONS = frozenset({"f16", "bf16"})
INSTALL = install_hint("openvino")
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
    """How an OpenVINO session is made: ``Embedder.load(dir, provider="openvino",
    options=OpenVINOOptions(...))``.

    ``threads``: inference threads (``Embedder.load``'s ``threads`` fills it). ``precision``: the
    inference precision hint, ``"f32"``, ``"bf16"`` or ``"f16"`` (None: bf16 only where the CPU has
    BF16; the CLIs' ``--ov-precision``). ``cache_dir``: where compiled models are kept (None:
    ``$KVEMBED_CACHE_DIR/openvino``; False: none), so a second load imports the compiled blob
    instead of compiling."""

    threads: int | None = None
    precision: str | None = None
    cache_dir: str | os.PathLike[str] | None | bool = None


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


#: compile properties beyond the precision hint: none, so threads stay pinned (OpenVINO's default), faster
#: on a quiet server than unpinned, which only help beside other busy processes (benchmarks/log/openvino.md)
RUN_PROPERTIES: dict[str, Any] = {}

#: the first calls of an imported model, during which the blob's pages are released (:meth:`OpenVINOSession._paging`)
PAGED_CALLS = 2


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
            raise InvalidInput(f"OpenVINOOptions(precision=...) must be one of {', '.join(PRECISIONS)} (or None for automatic), got {precision!r}")
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
        fp16, that graph with its GEMM weights bf16 (:func:`write_bf16_graph`; OpenVINO would widen fp16 weights
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
            return write_bf16_graph(model, self.model_path, workdir, margin=DISK_MARGIN)
        except (OSError, ValueError) as err:
            raise InvalidInput(
                f"OpenVINO bf16 runs {self.model_path.name}'s fp16 weights from a bf16 copy, which was not written ({err}); "
                "free disk space or give OpenVINOOptions(cache_dir=...) on a disk with room, or run precision='f32' or provider='cpu'"
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

    limits = None  # any shape

    @property
    def name(self) -> str:
        """``openvino-`` and the precision the compiled model reports it runs (``openvino-bf16``)."""
        return f"{NAME}-{self.precision}"

    @property
    def renormalise(self) -> bool:
        """True under the f16 and bf16 hints (every op fp16; bf16 GEMMs): unit vectors
        come back with norms up to ~1e-4 (f16) or ~1e-3 (bf16) off 1 (an fp32 graph's: no harm)."""
        return self.precision in HALF_PRECISIONS

    @property
    def input_names(self) -> list[str]:
        return list(self._inputs)

    @property
    def providers(self) -> list[str]:
        return [OPENVINO, self.precision]

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
