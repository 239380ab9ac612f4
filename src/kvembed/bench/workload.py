"""Deterministic synthetic inputs of exact token lengths. Torch-free.

Latency depends on tokens, not characters, so every row is cut to the prefix of a fixed English
word stream (``kvembed/data/calibration.txt``) whose *encoded* length, prompt template and special
tokens included, is the requested number of tokens. Lengths are measured with the artifact's own
:class:`~kvembed.runtime.encoding.TextEncoder`, so the runtime and the PyTorch reference (which
share it) see exactly these ids. Where a length cannot be hit (shorter than the prompt alone, or a
tokenizer merge skips it) the closest shorter one is used and the actual lengths are recorded.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..runtime.encoding import EncodedText, TextEncoder
from ..errors import InvalidInput

WORDS_FILE = Path(__file__).resolve().parents[1] / "data" / "calibration.txt"
#: used only if the package data is missing (a stripped install)
FALLBACK_WORDS = (
    "the quick brown fox jumps over the lazy dog while a small child reads a long book about "
    "rivers mountains cities and the people who built bridges across them in early spring"
)
#: how many characters around the binary search's answer to look for an exact length
_SCAN = 48


@functools.lru_cache(maxsize=1)
def source_lines() -> tuple[str, ...]:
    """The sentences rows are cut from (fixed, so runs are comparable)."""
    if WORDS_FILE.is_file():
        lines = [line.strip() for line in WORDS_FILE.read_text(encoding="utf-8").splitlines()]
        lines = [line for line in lines if line]
        if lines:
            return tuple(lines)
    return (FALLBACK_WORDS,)


def word_stream(start: int, min_chars: int) -> str:
    """Sentences from line ``start`` on (wrapping around), joined until ``min_chars`` long."""
    lines = source_lines()
    parts: list[str] = []
    size, index = 0, start
    while size < min_chars:
        line = lines[index % len(lines)]
        parts.append(line)
        size += len(line) + 1
        index += 1
    return " ".join(parts)


@dataclass(frozen=True)
class Rows:
    """Texts and their encodings; ``targets`` are the requested token counts per row."""

    targets: tuple[int, ...]
    texts: tuple[str, ...]
    encoded: tuple[EncodedText, ...]

    @property
    def lengths(self) -> tuple[int, ...]:
        """Actual token counts (prompt and special tokens included)."""
        return tuple(len(item.ids) for item in self.encoded)

    @property
    def exact(self) -> bool:
        return self.lengths == self.targets

    def __len__(self) -> int:
        return len(self.texts)


def text_of_length(encoder: TextEncoder, target: int, start: int = 0, kind: str = "document") -> tuple[str, EncodedText]:
    """The prefix of the word stream at line ``start`` that encodes to ``target`` tokens.

    Binary search on the prefix length in characters (tokens grow with characters, nearly
    monotonically), then a scan of nearby prefixes for an exact hit; failing that, the longest
    prefix found that does not exceed ``target`` (the prompt alone when ``target`` is shorter).
    """
    if target < 1:
        raise InvalidInput(f"a row needs at least 1 token, got {target}")
    if target > encoder.max_length:
        raise InvalidInput(f"{target} tokens is more than the artifact's max_length={encoder.max_length}")
    empty = encoder.encode_one("", kind)
    if len(empty.ids) >= target:
        return "", empty

    cache: dict[int, EncodedText] = {}
    truncated_from = [1 << 62]  # prefixes this long or longer exceed max_length (no need to encode)

    def encode(chars: int) -> EncodedText:
        if chars not in cache:
            cache[chars] = encoder.encode_one(text[:chars], kind)
            if cache[chars].truncated:
                truncated_from[0] = min(truncated_from[0], chars)
        return cache[chars]

    def length(chars: int) -> int:
        if chars >= truncated_from[0]:
            return encoder.max_length + 1
        item = encode(chars)
        return encoder.max_length + 1 if item.truncated else len(item.ids)

    chars = max(64, 3 * target)
    while True:  # a stream long enough to reach target tokens
        text = word_stream(start, chars)
        cache.clear()
        truncated_from[0] = 1 << 62
        if length(len(text)) >= target or chars > 1 << 24:
            break
        chars *= 2
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if length(mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    best = lo
    if length(lo) != target:  # merges (or appended punctuation) can skip a count: look around
        window = sorted(range(max(0, lo - _SCAN), min(len(text), lo + _SCAN) + 1), key=lambda c: abs(c - lo))
        best = next((c for c in window if length(c) == target), lo)
    return text[:best], encode(best)


def row_of_length(
    encoder: TextEncoder, target: int, start: int = 0, kind: str = "document", tries: int = 4
) -> tuple[str, EncodedText]:
    """:func:`text_of_length`, retried from the next ``tries - 1`` start lines when a length is
    skipped (e.g. a clean-up that appends '.' changes merges); the closest row wins."""
    if encoder.method.templates[kind].count("{text}") > 1:
        tries = 1  # echo: lengths move in steps of the copy count; other lines skip the same ones
    best: tuple[str, EncodedText] | None = None
    for attempt in range(max(1, tries)):
        text, item = text_of_length(encoder, target, start + attempt, kind)
        if best is None or len(item.ids) > len(best[1].ids):
            best = (text, item)
        if len(item.ids) == target or not text:  # exact, or the prompt alone is too long already
            break
    assert best is not None
    return best


def exact_rows(encoder: TextEncoder, seq_len: int, count: int, kind: str = "document", seed: int = 0) -> Rows:
    """``count`` different rows of ``seq_len`` tokens each (where the tokenizer allows)."""
    if count < 1:
        raise InvalidInput(f"count must be >= 1, got {count}")
    lines = len(source_lines())
    made = [row_of_length(encoder, seq_len, (seed * 7919 + row * 13) % lines, kind) for row in range(count)]
    return Rows((seq_len,) * count, tuple(t for t, _ in made), tuple(e for _, e in made))


def mixed_corpus(
    encoder: TextEncoder,
    count: int,
    min_tokens: int = 8,
    max_tokens: int = 512,
    seed: int = 0,
    kind: str = "document",
) -> Rows:
    """``count`` rows with lengths drawn uniformly from ``[min_tokens, max_tokens]`` (seeded): the
    realistic mixed-length corpus on which length-sorted batching pays off."""
    if not 1 <= min_tokens <= max_tokens:
        raise InvalidInput(f"need 1 <= min_tokens <= max_tokens, got {min_tokens}..{max_tokens}")
    max_tokens = min(max_tokens, encoder.max_length)
    min_tokens = min(min_tokens, max_tokens)
    rng = random.Random(seed)
    lines = len(source_lines())
    targets = [rng.randint(min_tokens, max_tokens) for _ in range(count)]
    made = [row_of_length(encoder, t, rng.randrange(lines), kind) for t in targets]
    return Rows(tuple(targets), tuple(t for t, _ in made), tuple(e for _, e in made))


@dataclass(frozen=True)
class Batch:
    """One padded batch, exactly what the graph takes (``TextEncoder.pad`` output)."""

    inputs: dict[str, np.ndarray]
    seq_len: int
    lengths: tuple[int, ...]

    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    @property
    def real_tokens(self) -> int:
        """Tokens that are not padding: what tokens/s counts."""
        return int(sum(self.lengths))

    @property
    def width(self) -> int:
        return int(self.inputs["input_ids"].shape[1])


def make_batch(encoder: TextEncoder, rows: Rows, batch_size: int, padding_side: str = "right") -> Batch:
    """The first ``batch_size`` rows padded together (batches of one grid share their rows)."""
    if not 1 <= batch_size <= len(rows):
        raise InvalidInput(f"batch_size must be 1..{len(rows)}, got {batch_size}")
    items: Sequence[EncodedText] = rows.encoded[:batch_size]
    inputs = encoder.pad(items, padding_side)
    return Batch(inputs, int(max(rows.targets[:batch_size])), tuple(len(i.ids) for i in items))


def raw_token_batch(encoder: TextEncoder, batch: int, seq: int) -> dict[str, np.ndarray]:
    """``batch`` rows of exactly ``seq`` real token ids (English text, no prompt, no padding):
    graph inputs of any length, below the prompt's own length too (e.g. 1 x 32)."""
    rows = []
    for row in range(batch):
        ids = encoder.tokenizer.encode(word_stream(row * 17, 8 * seq)).ids[:seq]
        if len(ids) < seq:
            raise InvalidInput(f"the word stream gives only {len(ids)} tokens, {seq} asked")
        rows.append(ids)
    return {"input_ids": np.array(rows, dtype=np.int64), "attention_mask": np.ones((batch, seq), dtype=np.int64)}
