"""Request rows <-> batches inside Triton's python backend.

Triton hands a python-backend model the list of requests its dynamic batcher merged; these
helpers turn them into rows for the runtime's batching and the results back into per-request
rows, so every caller gets exactly its own rows. Copied into generated repositories with the
runtime (see :mod:`kvembed.triton.vendor`), so it imports nothing beyond numpy and the runtime.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..methods.spec import KINDS
from ..runtime.encoding import EncodedText
from ..errors import InvalidInput


def decode_strings(array: Any, name: str) -> list[str]:
    """A Triton BYTES tensor of shape ``[rows, 1]`` (or ``[rows]``) -> one str per row.

    Invalid UTF-8 is refused with the row's index rather than silently replaced: the runtime
    embeds ``str`` only, and guessing at broken bytes would embed something the caller never sent.
    """
    values = np.asarray(array, dtype=object)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise InvalidInput(f"{name} must have shape [batch, 1], got {list(np.asarray(array).shape)}")
    texts = []
    for row, value in enumerate(values):
        if isinstance(value, str):
            texts.append(value)
            continue
        try:
            texts.append(bytes(value).decode("utf-8"))
        except UnicodeDecodeError as err:
            raise InvalidInput(f"{name}[{row}] is not valid UTF-8 ({err.reason} at byte {err.start}); send UTF-8 text") from None
    return texts


def parse_kinds(values: Sequence[str] | None, rows: int, fixed: str | None) -> list[str]:
    """Per-row kinds: ``fixed`` when the repository was built for one kind, else the KIND input
    (``document`` when it is absent)."""
    if values is None:
        return [fixed or "document"] * rows
    if fixed is not None:
        raise InvalidInput(f"this model embeds {fixed}s only and takes no KIND input; rebuild with --kind both")
    if len(values) != rows:
        raise InvalidInput(f"KIND has {len(values)} rows, TEXT has {rows}; send one KIND per text")
    for row, kind in enumerate(values):
        if kind not in KINDS:
            raise InvalidInput(f"KIND[{row}] is {kind!r}; use one of {', '.join(KINDS)}")
    return list(values)


def is_client_error(err: BaseException) -> bool:
    """Whether ``err``, raised while reading and tokenising a request, is the caller's mistake
    (invalid UTF-8, a bad KIND, a text holding ``<PST>``: ValueErrors, which ``kvembed serve``
    answers with 400 too) rather than a fault of the server, which must stay a 500."""
    return isinstance(err, ValueError)


def encode_rows(encoder: Any, texts: Sequence[str], kinds: Sequence[str]) -> list[Any]:
    """``TextEncoder.encode`` per kind, rows back in input order (one call per kind keeps the
    runtime's truncation warning and checks)."""
    items: list[Any] = [None] * len(texts)
    for kind in dict.fromkeys(kinds):
        rows = [i for i, k in enumerate(kinds) if k == kind]
        for row, item in zip(rows, encoder.encode([texts[i] for i in rows], kind)):
            items[row] = item
    return items


def unpad_rows(feed: Mapping[str, np.ndarray]) -> list[EncodedText]:
    """One request's padded token tensors -> one ``EncodedText`` per row (its real tokens only),
    so rows from requests padded to different widths can be re-batched by the runtime's own
    length-sorted planner and ``TextEncoder.pad``. Works for left and right padding."""
    mask = np.asarray(feed["attention_mask"]).astype(bool)
    ids = np.asarray(feed["input_ids"])
    pool = feed.get("pool_mask")
    rows = []
    for row in range(mask.shape[0]):
        keep = np.flatnonzero(mask[row])
        positions = None if pool is None else tuple(int(i) for i in np.flatnonzero(np.asarray(pool)[row][keep]))
        rows.append(EncodedText(tuple(int(t) for t in ids[row][keep]), positions, False))
    return rows


def split_rows(arrays: Mapping[str, np.ndarray], counts: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """The merged requests' output rows split back (``counts[i]`` rows each): each request's rows, in request order."""
    out, start = [], 0
    for count in counts:
        out.append({name: array[start : start + count] for name, array in arrays.items()})
        start += count
    return out
