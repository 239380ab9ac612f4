"""The one embedding path every route takes.

Tokenise with the model's own tokenizer and prompts (an input over the per-input cap is refused
with 413, cut with ``truncate``, or split into windows with ``windows``), embed in the model's
lanes, put each windowed input's vectors back together, keep the first ``dimensions`` values, and
quantise to each asked vector type. Routes differ only in how they read a request and write the
answer (:mod:`kvembed.serve.dialects`).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from ..runtime.encoding import EncodedText
from ..runtime.quantize import quantize
from ..runtime.vectors import unit_rows
from ..runtime.windows import per_input
from ..errors import shown
from .errors import ApiError
from .model import ServedModel
from .request import EmbedRequest, Inputs
from .state import ServerState

T = TypeVar("T")

#: characters (or token ids) of input, or floats of output, above which the work leaves the event loop
INLINE_LIMIT = 16384
#: what a refusal of token ids adds: the clients that send ids unasked tokenize for OpenAI's models
TIKTOKEN_HINT = ("clients that count tokens for OpenAI's models send tiktoken ids, not this model's (LangChain's "
                 "OpenAIEmbeddings does by default): send text instead, e.g. OpenAIEmbeddings(..., "
                 "check_embedding_ctx_length=False)")
#: vector types whose levels come from ranges calibrated on full-width, normalised vectors
RANGED = ("int8", "uint8")


@dataclass(frozen=True)
class Encoded:
    """A request's encoded rows: ``counts[i]`` rows (windows) for input ``i``, one unless windowed."""

    items: list[EncodedText]
    counts: list[int]

    @property
    def tokens(self) -> int:
        return sum(len(item.ids) for item in self.items)


@dataclass(frozen=True)
class Embedded:
    """The answer to an :class:`EmbedRequest`: one array per asked vector type, and its tokens."""

    vectors: dict[str, np.ndarray]
    tokens: int

    def __len__(self) -> int:
        return len(next(iter(self.vectors.values())))


async def offload(heavy: bool, job: Callable[..., T], *args: Any) -> T:
    """Run ``job`` in a thread when it is heavy; inline otherwise: for a few short texts the thread
    hop (a wake-up, a GIL hand-over) costs more than the work, and it is paid on every request."""
    return await asyncio.to_thread(job, *args) if heavy else job(*args)


async def embed_request(state: ServerState, served: ServedModel, request: EmbedRequest) -> Embedded:
    """Serve ``request`` on ``served``: the one path of every embeddings route."""
    check(state, served, request)
    with served.lanes.arriving():
        encoded = await encode_inputs(state, served, request.inputs, request)
    rows = await embed_encoded(served, encoded, request.output, request.normalize)
    if request.dimensions is not None and request.dimensions < rows.shape[1]:
        rows = unit_rows(rows[:, : request.dimensions]) if request.normalize else rows[:, : request.dimensions]
    vectors = {}
    for kind in request.vector_types:
        ranges = await asyncio.to_thread(served.embedder.vector_ranges, request.output) if kind in RANGED else None
        vectors[kind] = await offload(rows.size > INLINE_LIMIT, quantize, rows, kind, ranges)
    state.metrics.texts.labels(served.name).inc(len(rows))
    state.metrics.tokens.labels(served.name).inc(encoded.tokens)
    return Embedded(vectors, encoded.tokens)


def check_kind(served: ServedModel, kind: str, field: str) -> str:
    """``kind`` when it names one of the model's prompts (query, document, or a named prompt of a
    trained embedder's folder: GET /v1/models lists them), else 400 naming ``field``."""
    templates = served.embedder.method.templates
    if kind not in templates:
        raise ApiError(400, f"{field}={shown(kind)} is not a prompt of model {served.name!r}; one of {', '.join(templates)}",
                       param=field)
    return kind


def check(state: ServerState, served: ServedModel, request: EmbedRequest) -> None:
    """What the request asks that this model or server cannot give: 400 naming the field."""
    check_kind(served, request.kind, request.kind_field)
    if len(request.inputs) > state.config.max_client_batch_size:
        # 400 as OpenAI answers it: the document's maxItems says so, unlike a body over --payload-limit (413)
        raise ApiError(400, f"{len(request.inputs)} inputs in one request, over the limit of {state.config.max_client_batch_size}; "
                       "split the request", param=request.field, code="too_many_inputs")
    try:
        dim = served.embedder.dim_of(request.output)
    except ValueError as err:
        raise ApiError(400, str(err), param="output") from None
    if request.dimensions is not None and request.dimensions > dim:
        raise ApiError(400, f"dimensions={request.dimensions} is over this model's {dim}; ask for at most {dim}", param="dimensions")
    ranged = [kind for kind in request.vector_types if kind in RANGED]
    if ranged and request.dimensions is not None and request.dimensions < dim:
        raise ApiError(400, f"{ranged[0]} vectors use ranges calibrated on this model's full {dim} values; ask for them "
                       "without dimensions, or ask for float, binary or ubinary", param="embedding_types")
    if ranged and not request.normalize:
        raise ApiError(400, f"{ranged[0]} vectors use ranges calibrated on normalised vectors; ask for them with "
                       "normalize=true", param="embedding_types")


async def encode_inputs(state: ServerState, served: ServedModel, inputs: Inputs, request: EmbedRequest) -> Encoded:
    """``inputs`` tokenised as ``request`` asks (in a thread when large)."""
    config = state.config
    truncate = config.auto_truncate if request.truncate is None else request.truncate
    windows = config.windows if request.windows is None else request.windows
    from_start = truncate and request.truncate_from == "start"
    stop = threading.Event()  # a thread cannot be cancelled: told to stop at its next input instead
    try:
        return await offload(inputs.size > INLINE_LIMIT, _encode, served, inputs, request.kind, truncate, windows, request.field,
                             from_start, stop)
    except asyncio.CancelledError:  # the client went away or the server shuts down
        stop.set()
        raise


async def embed_encoded(served: ServedModel, encoded: Encoded, output: str | None, normalize: bool = True) -> np.ndarray:
    """One row per input: its row from the lanes, or its windows' rows put together."""
    return per_input(await served.lanes.embed(encoded.items, output, normalize), encoded.items, encoded.counts, normalize)


def _encode(served: ServedModel, inputs: Inputs, kind: str, truncate: bool, windows: bool, field: str,
            from_start: bool = False, stop: threading.Event | None = None) -> Encoded:
    """Inputs -> the runtime's encoded rows, cut (at their end, or ``from_start``) or windowed at
    the model's per-input cap; an input over it -> 413 unless ``truncate`` or ``windows``. Ends
    early, with nothing, once ``stop`` is set (no one waits for the answer)."""
    embedder = served.embedder
    one = embedder.encoder.encode_tail if from_start else embedder.encoder.encode_one
    items: list[EncodedText] = []
    counts: list[int] = []
    if inputs.texts is not None:
        for index, text in enumerate(inputs.texts):
            if stop is not None and stop.is_set():
                return Encoded([], [])
            try:
                rows = embedder.encoder.encode_windows(text, kind) if windows else [one(text, kind)]
            except ValueError as err:  # not Unicode text, a tokenizer panic, a placeholder typed by the user
                raise ApiError(400, f"{field}[{index}]: {err}", param=field) from None
            items.extend(rows)
            counts.append(len(rows))
    else:
        try:
            if windows:
                items, counts = embedder.token_windows(inputs.ids or [], kind)
            else:
                cap = embedder.max_length
                rows = [row[-cap:] for row in inputs.ids or []] if from_start else inputs.ids or []
                items = embedder.token_inputs(rows, kind)
                counts = [1] * len(items)
        except ValueError as err:
            raise ApiError(400, f"{str(err).replace('ids[', f'{field}[')}; {TIKTOKEN_HINT}", param=field) from None
    if not truncate and not windows:
        _refuse_long(served, items, field)
    return Encoded(items, counts)


def _refuse_long(served: ServedModel, items: Sequence[EncodedText], field: str) -> None:
    cut = [index for index, item in enumerate(items) if item.truncated]
    if cut:
        cap = served.max_input_tokens
        raise ApiError(
            413, f"{field}[{cut[0]}] ({len(cut)} input(s) in all) is longer than this model's limit of {cap} tokens per "
            f"input, prompt included (kvembed serve --max-input-tokens, at most the artifact's max_length of "
            f"{served.max_length}); shorten or split it, send truncate=true to embed its first {cap} tokens, or "
            "windows=true to embed all of it in windows of the cap",
            param=field, code="input_too_long",
        )
