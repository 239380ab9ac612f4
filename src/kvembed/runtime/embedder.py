"""``Embedder``: load an exported artifact and embed text on one of the backends. Torch-free."""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..backends.catalogue import Choice, Options, open_artifact, removed_keyword
from ..backends.protocol import Session
from ..methods.sharing import output_label, output_names
from ..methods.spec import ResolvedMethod
from ..artifact import Manifest, manifest_of, verify_signature
from .artifact import encoder_from_manifest
from .batching import CPU_CALL_TOKENS, BatchPolicy, policy_defaults, run_batches, run_in_slices
from .encoding import EncodedText, TextEncoder, check_padding_side, check_texts
from .vectors import unit_rows
from .windows import encode_all, id_windows, per_input, special_ends
from . import quantize as vector_types
from ..errors import InvalidInput
from ..extras import install_hint

__all__ = ["CPU_CALL_TOKENS", "Embedder"]

#: inputs with at least this many texts show a progress bar by default (when stderr is a terminal)
PROGRESS_THRESHOLD = 1024
#: every load says here, in one INFO line, what its provider ran the artifact on and why
log = logging.getLogger("kvembed.runtime")


class Embedder:
    """Embeds texts with an exported kvembed artifact, exactly as the PyTorch reference does.

    Build it with `load`. It is safe to call `encode` from several threads at once
    (onnxruntime sessions and tokenizers are thread-safe; no state is shared between calls).
    Every embedding method runs the runtime's one batching loop
    (`run_batches`) under a
    `BatchPolicy`, by default `policy`.
    """

    def __init__(
        self, directory: Path, manifest: Manifest, encoder: TextEncoder, session: Session,
        max_call_tokens: int | None | str = "auto",
        call_cost: int | None | str = "auto",
        choice: Choice | None = None,
    ) -> None:
        self.directory = directory
        #: what the provider chose and why (`choose_backend`)
        self.choice = choice
        #: the manifest, typed (`Manifest`), as the load read it; `manifest` is its JSON
        self.artifact: Manifest = manifest
        self.encoder = encoder
        self.session = session
        self._inputs = list(session.input_names)
        self._renormalise = session.renormalise
        self._ranges: dict[str, np.ndarray] = {}  # output name -> its vector ranges (`vector_ranges`)
        self._ranges_lock = threading.Lock()
        #: the default batching policy of every embedding method: the call budget and call cost
        #: given to `load` ("auto": the target's, `policy_defaults`), 32 rows per batch, no
        #: padded-token limit per batch
        calls, cost = policy_defaults(session.name)
        self.policy = BatchPolicy(
            max_call_tokens=calls if _auto(max_call_tokens) else max_call_tokens,  # type: ignore[arg-type]
            call_cost=cost if _auto(call_cost) else call_cost,  # type: ignore[arg-type]
        )

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike[str] | Manifest,
        provider: str = "auto",
        threads: int | None = None,
        *,
        options: Options = None,
        verify: bool = True,
        max_call_tokens: int | None | str = "auto",
        call_cost: int | None | str = "auto",
        trust_key: str | os.PathLike[str] | None = None,
        encoder: TextEncoder | None = None,
        **removed: Any,
    ) -> "Embedder":
        """Open an artifact directory (or its manifest, as `load_manifest`
        read it: the load reads no file twice).

        ``provider``: ``"auto"`` (CUDA when onnxruntime-gpu sees a GPU, else CPU; OpenVINO for a
        bf16, fp16 or int8 artifact certified there, see below), ``"cpu"``, ``"cuda"``,
        ``"tensorrt"`` or ``"openvino"`` (OpenVINO's CPU plugin instead of onnxruntime:
        ``pip install 'kvembed[openvino]'``). ``"auto"`` picks OpenVINO only for an artifact
        certified there, under the certified precision hint this CPU runs fastest
        (`choose_backend`); `target` and `choice` say what it picked and why, and one INFO line on
        the ``kvembed.runtime`` logger. ``threads``: the backend's inference threads (None: one per
        physical core). ``verify`` checks every file's sha256 against the manifest first (a
        corrupted or altered file is named in the error).

        ``options``: the backend's own options, passed through as they are: `OnnxRuntimeOptions`
        (memory arena, weight pre-packing, thread spinning, the GPU's ``device_id``, the TensorRT
        execution provider's engine cache and fp16 kernels), `OpenVINOOptions` (its precision
        hint, ``"f32"``, ``"bf16"`` or ``"f16"``, and its compiled-model cache directory) or
        `TensorRTOptions`; all three are importable from ``kvembed``. One of them for a backend that
        does not run the artifact is an error, never silently dropped; a list holds one per
        backend, for ``"auto"``, which may pick any: the picked backend's are used (its defaults
        where the list has none).

        ``max_call_tokens``: padded tokens per graph call; a bigger padded batch runs in slices of
        whole rows (at least one). ``"auto"``: `CPU_CALL_TOKENS` on the CPU and OpenVINO
        (less memory and faster there), None (one call) on GPUs. Vectors do not depend on it.

        ``call_cost``: padded tokens one more batch is worth when `encode` plans texts into
        batches: sorted texts are cut where the padding saved is worth more (see
        `plan_batches`). ``"auto"``: the target's own (a few dozen
        tokens on onnxruntime's CPU provider, more on OpenVINO, whose calls cost more), None (cut
        every ``batch_size`` rows) on GPUs.

        An engine directory (``kvembed build-engine``: ``engine.plan`` + ``engine.json`` beside the
        artifact's tokenizer and manifest) runs its plan with TensorRT (``provider`` ``"auto"`` or
        ``"tensorrt"``): batches are padded and cut to its profiles' sequence range and split to its
        largest batch. TensorRT and the GPU check are needed only when the first batch runs.

        ``trust_key``: the PEM public key of the key that signed the artifact (``kvembed sign``);
        before anything else is read, the signature ``kvembed.sig`` must verify with it and cover
        every file in the folder as it is (`verify_signature`; needs
        ``pip install 'kvembed[sign]'``): an unsigned artifact, one signed by another key, or one
        with a file changed, added or removed since signing raises
        `UntrustedArtifact`, also when the manifest's hashes were
        rewritten to match. None (the default): no signature is checked, and model-signing is not
        imported. ``verify=False`` does not skip it.

        ``encoder``: the artifact's `TextEncoder` where the caller built it already from this
        manifest (serve's preflight, which checks the prompt against the cap before the bind): it
        is used as it is, not built again.

        The flat backend keywords of earlier versions (``ov_precision=``, ``memory_arena=``, ...)
        are a TypeError that names the options field that holds each now.
        """
        if removed:
            raise TypeError(removed_keyword(sorted(removed)[0]))
        if trust_key is not None:
            verify_signature(directory.artifact_directory() if isinstance(directory, Manifest) else directory, trust_key)
        manifest = manifest_of(directory)
        path = manifest.artifact_directory()
        session, choice = open_artifact(manifest, provider, options, verify=verify, threads=threads)
        encoder = encoder if encoder is not None else encoder_from_manifest(path, manifest)
        if session.limits is not None:  # e.g. a TensorRT plan's profiles: inputs padded and cut to them
            encoder.cap_input_tokens(session.limits.max_sequence)
            encoder.pad_at_least(session.limits.min_sequence)
        embedder = cls(path, manifest, encoder, session, max_call_tokens, call_cost, choice)
        log.info("kvembed: %s runs on %s (provider %s: %s)", path, embedder.target, provider, choice.reason)
        return embedder

    # -- facts ---------------------------------------------------------------------------------

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest's JSON form (a copy), for callers that read it as a dict; `artifact` is the typed one."""
        return self.artifact.to_dict()

    @property
    def dim(self) -> int:
        return self.artifact.dim

    @property
    def method(self) -> ResolvedMethod:
        return self.encoder.method

    @property
    def outputs(self) -> list[str]:
        """The methods this artifact computes: the main one's name, then ``--also`` labels."""
        return [self.method.name, *self.artifact.also]

    def dim_of(self, output: str | None = None) -> int:
        """Width of ``output``'s embedding (the main method's when None)."""
        names = output_names(self._label(output))
        shape = next((o.shape for o in self.artifact.outputs if o.name == names[0]), None)
        return self.dim if shape is None else int(shape[-1])

    def _label(self, output: str | None) -> str | None:
        return output_label(output, self.method.name, list(self.artifact.also))

    @property
    def max_length(self) -> int:
        return self.encoder.max_length

    def cap_input_tokens(self, tokens: int) -> None:
        """Cut (and flag as truncated) every later input at ``tokens``, prompt included; a cap above
        the artifact's max_length changes nothing (a server's per-input limit)."""
        self.encoder.cap_input_tokens(tokens)

    @property
    def providers(self) -> list[str]:
        """Deprecated: `target` names what runs the graph (onnxruntime's chain stays on its session)."""
        warnings.warn("Embedder.providers is deprecated: use Embedder.target", DeprecationWarning, stacklevel=2)
        return list(getattr(self.session, "providers", [self.target]))

    @property
    def target(self) -> str:
        """The target that runs the graph (`kvembed.backends.targets`), named as certificates and
        ``kvembed verify --backends`` name it: ``onnxruntime-cpu``, ``onnxruntime-cuda``,
        ``onnxruntime-tensorrt``, ``openvino-bf16`` / ``openvino-f32`` (the precision OpenVINO
        reports it runs) or ``tensorrt``; `choice` says why."""
        return self.session.name

    @property
    def backend(self) -> str:
        """Deprecated: `target` (this name meant the target, not the catalogue's backend)."""
        warnings.warn("Embedder.backend is deprecated: use Embedder.target", DeprecationWarning, stacklevel=2)
        return self.target

    def runtime_line(self) -> str:
        """`runtime_line` of this artifact as loaded: what runs it and why."""
        return runtime_line(self.target, self.artifact.precision, self.choice)

    @property
    def padding_side(self) -> str:
        """Where batches are padded: the encoder's (from the manifest); never changes a vector."""
        return self.encoder.padding_side

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        self.encoder.padding_side = check_padding_side(side)

    @property
    def max_call_tokens(self) -> int | None:
        """Padded tokens per graph call (`policy`'s; None: a padded batch runs as one call)."""
        return self.policy.max_call_tokens

    @max_call_tokens.setter
    def max_call_tokens(self, value: int | None) -> None:
        self.policy = replace(self.policy, max_call_tokens=value)

    @property
    def call_cost(self) -> int | None:
        """Padded tokens one more batch is worth when inputs are planned (`policy`'s)."""
        return self.policy.call_cost

    @call_cost.setter
    def call_cost(self, value: int | None) -> None:
        self.policy = replace(self.policy, call_cost=value)

    # -- embedding -----------------------------------------------------------------------------

    def run(self, batch: Mapping[str, np.ndarray], output: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Run one padded batch (``TextEncoder.pad`` output); returns ``(embedding, pooled)`` of
        the main method, or of the extra method ``output``. Rows run in slices of
        `rows_per_call` (rows are independent: the vectors do not change)."""
        embedding, pooled = self.run_outputs(batch, output_names(self._label(output)))
        return embedding, pooled

    def run_outputs(self, batch: Mapping[str, np.ndarray], names: Sequence[str], policy: BatchPolicy | None = None) -> list[np.ndarray]:
        """The loop's run step: the graph outputs ``names`` of one padded batch, in graph calls of
        at most `rows_per_call` rows under ``policy`` (default `policy`)."""
        feeds = {name: batch[name] for name in self._inputs}
        width = next(iter(feeds.values())).shape[1]
        values = run_in_slices(feeds, self.rows_per_call(width, policy), lambda part: self.session.run(part, list(names)))
        if self._renormalise:
            values = [unit_rows(value) if name.split(".", 1)[0] == NORMALISED else value for name, value in zip(names, values)]
        return values

    def rows_per_call(self, width: int, policy: BatchPolicy | None = None) -> int | None:
        """How many rows of ``width`` padded tokens one graph call takes (None: any number): the
        policy's ``max_call_tokens`` budget (at least one row), and a TensorRT engine's profile limit."""
        caps = [cap for cap in [(policy or self.policy).rows_per_call(width)] if cap is not None]
        if self.session.limits is not None:  # a TensorRT engine's profiles cap the rows per call
            caps.append(self.session.limits.rows(width))
        return min(caps) if caps else None

    def encode(
        self,
        texts: Sequence[str] | str,
        kind: str = "document",
        batch_size: int = 32,
        max_batch_tokens: int | None = None,
        normalize: bool = True,
        show_progress_bar: bool | None = None,
        output: str | None = None,
        *,
        first_index: int = 0,
        precision: str = "float32",
        windows: bool = False,
    ) -> np.ndarray:
        """Embed ``texts`` as ``kind`` (``"query"``/``"document"``): float32 ``(n, dim)`` in input order.

        Texts are sorted by length and batched by at most ``batch_size`` rows and ``max_batch_tokens``
        padded tokens; each batch runs in graph calls of at most
        `max_call_tokens` padded tokens. A single str gives a 1-D vector. Over-long texts are
        cut (the prompt template stays whole) and named in one warning. ``output`` picks an extra
        method of an artifact exported with ``--also`` (see `outputs`). ``first_index`` is the
        position of ``texts[0]`` in a longer stream: errors and warnings name items by that index.
        ``precision`` (sentence-transformers' word for the vector type, `quantize`): ``"float32"``
        (or ``"float"``), ``"int8"`` or ``"uint8"`` (levels of `vector_ranges`; normalised vectors
        only), ``"binary"`` or ``"ubinary"`` (one bit per dimension, packed).
        ``windows=True``: a text over `max_length` is embedded whole instead of cut, as windows
        that each fit, batched with the other inputs, whose vectors `aggregate` makes its one
        vector (`kvembed.runtime.windows`).
        """
        label = self._label(output)
        kind_of_vector = vector_types.check_vector_type(precision, "precision")
        if kind_of_vector in vector_types.RANGED and not normalize:
            raise InvalidInput(f"precision={precision!r} needs normalize=True: the ranges are those of normalised vectors")
        single = isinstance(texts, str)
        items = check_texts([texts] if single else texts, first_index)
        counts = None
        if windows:  # no text is cut: an over-long one becomes windows
            encoded, counts = encode_all(self.encoder, items, kind, first_index)
        else:
            encoded = self.encoder.encode(items, kind, first_index)
        policy = BatchPolicy.from_options(self.policy, batch_size=batch_size, max_batch_tokens=max_batch_tokens)
        out = self.embed_encoded(encoded, label, policy=policy, normalize=normalize, show_progress_bar=show_progress_bar)
        if counts is not None:
            out = per_input(out, encoded, counts, normalize)
        if kind_of_vector != "float":
            ranges = self.vector_ranges(output) if kind_of_vector in vector_types.RANGED else None
            out = vector_types.quantize(out, kind_of_vector, ranges)
        return out[0] if single else out

    def token_inputs(self, ids: Sequence[Sequence[int]], kind: str = "document") -> list[EncodedText]:
        """Pre-tokenised inputs as the graph takes them: each row is the whole model input, fed verbatim
        (cut to `max_length` and flagged ``truncated`` when longer).

        Only methods that embed raw text (template ``{text}``, no clean-up, no placeholder, no pool
        span: ``va``, ``last-token``, ``mean``) accept ids: for them ``tokenizer.encode(text).ids`` gives
        exactly `encode`'s input. Prompt methods raise ValueError: wrapping ids in a prompt at the
        token level would not reproduce the ids of the prompted text (merges across the boundary).
        """
        method = self.method
        if kind not in method.templates:
            raise InvalidInput(f"kind must be one of {', '.join(method.templates)}, got {kind!r}")
        if not method.takes_ids(kind):
            raise InvalidInput(
                f"method {method.name!r} wraps text in a prompt ({method.templates[kind]!r}); token ids are "
                "accepted only by raw-text methods (va, last-token, mean): send text instead"
            )
        vocab = self.encoder.tokenizer.get_vocab_size(with_added_tokens=True)
        rows: list[EncodedText] = []
        for index, row in enumerate(ids):
            if isinstance(row, (str, bytes)) or not row or not all(_is_id(i, vocab) for i in row):
                raise InvalidInput(f"ids[{index}] must be a non-empty list of token ids in [0, {vocab}), got {str(row)[:60]}")
            rows.append(EncodedText(tuple(row[: self.max_length]), None, len(row) > self.max_length))
        return rows

    def token_windows(self, ids: Sequence[Sequence[int]], kind: str = "document") -> tuple[list[EncodedText], list[int]]:
        """Pre-tokenised rows (raw-text methods only, checked as `token_inputs` checks them) with every
        row over `max_length` split into windows of at most `max_length` ids (`id_windows`: the
        tokenizer's special tokens around a row, such as a BOS, repeated around each window):
        the items, flat and in order, and per row how many it became (for `aggregate`)."""
        items: list[EncodedText] = []
        counts: list[int] = []
        ends = special_ends(self.encoder)
        for row, item in zip(ids, self.token_inputs(ids, kind)):
            parts = id_windows(row, self.max_length, ends) if item.truncated else [item]
            items.extend(parts)
            counts.append(len(parts))
        return items, counts

    def encode_ids(
        self,
        ids: Sequence[Sequence[int]],
        kind: str = "document",
        batch_size: int = 32,
        max_batch_tokens: int | None = None,
        normalize: bool = True,
        output: str | None = None,
    ) -> np.ndarray:
        """Embed pre-tokenised rows (see `token_inputs`): float32 ``(n, dim)`` in input order."""
        policy = BatchPolicy.from_options(self.policy, batch_size=batch_size, max_batch_tokens=max_batch_tokens)
        return self.embed_encoded(self.token_inputs(ids, kind), output, policy=policy, normalize=normalize)

    def embed_encoded(
        self,
        items: Sequence[EncodedText],
        output: str | None = None,
        *,
        policy: BatchPolicy | None = None,
        normalize: bool = True,
        show_progress_bar: bool | None = False,
        on_batch: Callable[[list[int], Mapping[str, np.ndarray]], None] | None = None,
    ) -> np.ndarray:
        """Embed already-encoded inputs (`TextEncoder.encode`, `token_inputs`, a server's
        queue) under ``policy`` (default `policy`): float32 ``(n, dim)`` in input order, the
        normalised embedding of ``output`` (or its pooled vector with ``normalize=False``).
        ``on_batch(indices, padded_batch)`` follows every batch. The servers' entry point."""
        name = output_names(self._label(output))[0 if normalize else 1]
        return self.embed_outputs(items, [name], policy=policy, show_progress_bar=show_progress_bar, on_batch=on_batch)[name]

    def embed_outputs(
        self,
        items: Sequence[EncodedText],
        names: Sequence[str],
        *,
        policy: BatchPolicy | None = None,
        show_progress_bar: bool | None = False,
        on_batch: Callable[[list[int], Mapping[str, np.ndarray]], None] | None = None,
    ) -> dict[str, np.ndarray]:
        """The graph outputs ``names`` (e.g. ``embedding`` and ``embedding.<label>``) of encoded
        inputs in one pass: the batching loop with `TextEncoder.pad` and `run_outputs`."""
        policy = policy or self.policy
        outputs = {name: np.zeros((len(items), self._width(name)), dtype=np.float32) for name in names}
        with _progress(len(items), show_progress_bar) as advance:

            def after(chunk: list[int], batch: Mapping[str, np.ndarray]) -> None:
                advance(len(chunk))
                if on_batch is not None:
                    on_batch(chunk, batch)

            run_batches(items, policy, self.encoder.pad, lambda batch: self.run_outputs(batch, names, policy),
                        list(outputs.values()), on_batch=after)
        return outputs

    def _width(self, name: str) -> int:
        """Width of the graph output ``name`` (the manifest's; pooled outputs are as wide as their embedding)."""
        shapes = {o.name: o.shape for o in self.artifact.outputs}
        shape = shapes.get(name) or shapes.get(name.replace("pooled", "embedding", 1))
        return self.dim if not shape else int(shape[-1])

    def vector_ranges(self, output: str | None = None) -> np.ndarray:
        """``(2, dim)`` float32: the per-dimension minimum (row 0) and maximum (row 1) of ``output``'s
        normalised vectors, which int8 and uint8 vectors are levels of (`quantize`): the manifest's
        ``vector_ranges``, measured by the export. An artifact exported before them has none: they are
        measured once, on the bundled calibration texts through this embedder, kept, and a warning
        says so (re-exporting stores them)."""
        name = output_names(self._label(output))[0]
        with self._ranges_lock:
            if not self._ranges:
                stored = self.artifact.vector_ranges
                if stored:
                    self._ranges = {key: np.array([item.min, item.max], dtype=np.float32) for key, item in stored.items()}
                else:
                    warnings.warn(f"{self.directory}: the manifest has no vector_ranges (exported before them); measuring "
                                  "them on the bundled calibration texts at load (re-export the artifact to store them)",
                                  stacklevel=2)
                    self._ranges = vector_types.measure_ranges(self)
            if name not in self._ranges:
                raise InvalidInput(f"{self.directory}: the manifest's vector_ranges has none for output {name!r}; "
                                   "re-export the artifact to measure them")
            return self._ranges[name].copy()

    def encode_query(self, texts: Sequence[str] | str, **kwargs: Any) -> np.ndarray:
        return self.encode(texts, kind="query", **kwargs)

    def encode_document(self, texts: Sequence[str] | str, **kwargs: Any) -> np.ndarray:
        return self.encode(texts, kind="document", **kwargs)

    def encode_stream(
        self,
        texts: Iterable[str],
        kind: str = "document",
        chunk_size: int = 4096,
        show_progress_bar: bool | None = None,
        **kwargs: Any,
    ) -> Iterator[np.ndarray]:
        """Embed an iterable of any length chunk by chunk, yielding ``(<= chunk_size, dim)`` arrays
        in input order; memory stays bounded by the chunk, whatever the input size."""
        if chunk_size < 1:
            raise InvalidInput(f"chunk_size must be >= 1, got {chunk_size}")
        chunk: list[Any] = []
        offset = 0
        with _progress(None, show_progress_bar) as advance:
            for text in texts:
                chunk.append(text)
                if len(chunk) == chunk_size:
                    yield self._encode_chunk(chunk, offset, kind, kwargs)
                    offset += len(chunk)
                    advance(len(chunk))
                    chunk = []
            if chunk:
                yield self._encode_chunk(chunk, offset, kind, kwargs)
                advance(len(chunk))

    def _encode_chunk(self, chunk: list[Any], offset: int, kind: str, kwargs: dict[str, Any]) -> np.ndarray:
        return self.encode(chunk, kind=kind, show_progress_bar=False, first_index=offset, **kwargs)


#: the graph outputs the graph L2-normalises (``embedding``, ``embedding.<label>``)
NORMALISED = output_names(None)[0]


def runtime_line(backend: str, precision: str, choice: Choice | None = None, subject: str = "artifact") -> str:
    """One line naming what computes the vectors and why, e.g. ``runtime: openvino-bf16 running the
    bf16 artifact (provider auto: certified on OpenVINO (...), this CPU has ...)``: the commands
    print it (embed, serve, eval, embed-corpus) so a user knows which backend and precision
    answered, and why ``auto`` took it (`choose_backend`)."""
    head = f"runtime: {backend} running the {precision} {subject}"
    if choice is None:
        return head
    if not choice.auto:
        return f"{head} (provider {choice.provider}, as asked)"
    reason = choice.reason.removeprefix(f"{precision} artifact").lstrip(":, ").strip()
    return f"{head} (provider auto)" if reason in ("", choice.backend) else f"{head} (provider auto: {reason})"


def _auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


def _is_id(value: Any, vocab: int) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < vocab


class _progress:
    """A rich progress bar when asked for (or for large inputs on a terminal); a no-op otherwise.

    rich is optional for the runtime (it comes with the ``cli`` extra).
    """

    def __init__(self, total: int | None, show: bool | None) -> None:
        if show is None:
            show = sys.stderr.isatty() and (total is None or total >= PROGRESS_THRESHOLD)
        self.total, self.show, self.bar = total, show, None

    def __enter__(self):
        if self.show:
            try:
                from rich.progress import Progress
            except ImportError:
                warnings.warn(f"progress bars need rich: {install_hint('cli')}", stacklevel=3)
                return lambda n: None
            from rich.console import Console

            self.bar = Progress(transient=False, console=Console(stderr=True))
            self.bar.start()
            task = self.bar.add_task("embedding", total=self.total)
            return lambda n: self.bar.advance(task, n)
        return lambda n: None

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()
