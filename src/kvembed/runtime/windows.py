"""Windows: an input longer than the per-input cap embedded whole, as consecutive pieces.

Opt-in (``Embedder.encode(windows=True)``, ``kvembed embed --windows``, ``embed-corpus
--windows``): an input over the cap is cut at token boundaries into *windows* that each fit it with
the method's prompt around each one (`TextEncoder.encode_windows`; pre-tokenised rows:
`id_windows`), the windows ride the same token-budget batches as every other input (the runtime's
one batching loop), and their vectors become the input's one vector by :func:`aggregate`: the
mean of the normalised window vectors weighted by each window's share of the text's tokens,
normalised again (docs/methods.md, "Long inputs: windows"). Windows do not overlap. Torch-free.
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np

from ..errors import InvalidInput
from .encoding import EncodedText, TextEncoder, tokenize, truncation_message
from .vectors import unit_rows


def aggregate(vectors: np.ndarray, counts: Sequence[int], weights: Sequence[int], normalize: bool = True) -> np.ndarray:
    """One vector per input from its windows' vectors.

    ``vectors``: ``(n_windows, dim)``, the normalised vectors of every input's windows, inputs in
    order and each input's windows in order; ``counts[i]``: how many windows input ``i`` became
    (one for an input that fits); ``weights``: one per window, its share of the text's tokens
    (`window_weights`: content tokens, prompt and special tokens not counted). Returns float32
    ``(n_inputs, dim)``: per input, the weighted mean of its window vectors, L2-normalised. An
    input of one window keeps its vector as it is. ``normalize=False`` (pooled window vectors, as
    TEI's ``normalize=false`` asks): the weighted mean is not normalised again.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    counts = [int(c) for c in counts]
    if vectors.ndim != 2 or sum(counts) != len(vectors) or len(weights) != len(vectors) or min(counts, default=1) < 1:
        raise InvalidInput(f"aggregate needs one row and one weight per window and counts >= 1 that add up to the rows: "
                           f"{vectors.shape} vectors, {len(weights)} weights, counts adding up to {sum(counts)}")
    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    out = np.empty((len(counts), vectors.shape[1]), dtype=np.float32)
    start = 0
    for index, count in enumerate(counts):
        rows, share = vectors[start : start + count], w[start : start + count]
        if count == 1:
            out[index] = rows[0]
        else:
            share = share if share.sum() > 0 else np.ones_like(share)
            out[index] = (share @ rows.astype(np.float64)) / share.sum()
        start += count
    multi = np.asarray(counts) > 1
    if multi.any() and normalize:
        out[multi] = unit_rows(out[multi])
    return out


def window_weights(items: Sequence[EncodedText]) -> list[int]:
    """Each item's weight for :func:`aggregate`: a window's ``text_tokens`` (its tokens of the
    text), or for a whole input its length (it is an input's only item: its weight changes nothing)."""
    return [item.text_tokens if item.text_tokens is not None else len(item.ids) for item in items]


def encode_all(encoder: TextEncoder, texts: Sequence[str], kind: str = "document",
               first_index: int = 0) -> tuple[list[EncodedText], list[int]]:
    """Every text's windows (`TextEncoder.encode_windows`), flat and in order, and per text how many
    it became. An error names the text by its index (from ``first_index``); a window still cut
    (a prompt whose merges leave not one token of room) is named in one warning, as `encode` does."""
    if kind not in encoder.method.templates:
        raise InvalidInput(f"kind must be one of {', '.join(encoder.method.templates)}, got {kind!r}")
    items: list[EncodedText] = []
    counts: list[int] = []
    cut: list[int] = []
    for index, text in enumerate(texts):
        try:
            windows = encoder.encode_windows(text, kind)
        except InvalidInput as err:
            raise type(err)(f"texts[{first_index + index}]: {err}") from None
        if any(item.truncated for item in windows):
            cut.append(first_index + index)
        items.extend(windows)
        counts.append(len(windows))
    if cut:
        warnings.warn(truncation_message(cut, len(texts), encoder.max_length), stacklevel=3)
    return items, counts


def special_ends(encoder: TextEncoder) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The special tokens the artifact's tokenizer puts before and after a text (e.g. a BOS), as
    ``tokenizer.encode(text).ids`` holds them: what every window of a pre-tokenised row repeats."""
    encoding = tokenize(encoder.tokenizer, "a")
    special = list(encoding.special_tokens_mask)
    ids = list(encoding.ids)
    if 0 not in special:
        return (), ()
    head = special.index(0)
    tail = len(special) - special[::-1].index(0)
    return tuple(ids[:head]), tuple(ids[tail:])


def id_windows(row: Sequence[int], cap: int, ends: tuple[Sequence[int], Sequence[int]] = ((), ())) -> list[EncodedText]:
    """A pre-tokenised row (the whole model input of a raw-text method) as windows of at most
    ``cap`` ids: a row that fits is one item, as it is; a longer one that starts and ends with the
    tokenizer's special ``ends`` (`special_ends`) is cut between them into pieces, each wrapped in
    them again, and any other row is cut into consecutive ``cap``-id pieces. No overlap."""
    row = tuple(int(i) for i in row)
    if len(row) <= cap:
        return [EncodedText(row, None, False)]
    head, tail = tuple(ends[0]), tuple(ends[1])
    wrapped = bool(head or tail) and row[: len(head)] == head and row[len(row) - len(tail):] == tail
    if not wrapped:
        head = tail = ()
    body = row[len(head) : len(row) - len(tail)]
    room = cap - len(head) - len(tail)
    if room < 1:
        raise InvalidInput(f"a window of cap={cap} ids has no room beside the tokenizer's special tokens")
    return [EncodedText(head + body[i : i + room] + tail, None, False, text_tokens=len(body[i : i + room]))
            for i in range(0, len(body), room)]


def per_input(vectors: np.ndarray, items: Sequence[EncodedText], counts: Sequence[int], normalize: bool = True) -> np.ndarray:
    """One row per input from the rows of ``items`` (``counts[i]`` rows for input ``i``): as they
    are when no input became windows, else :func:`aggregate` with :func:`window_weights`."""
    if len(counts) == len(items):
        return vectors
    return aggregate(vectors, counts, window_weights(items), normalize)
