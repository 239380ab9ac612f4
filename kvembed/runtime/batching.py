"""Length-sorted, token-budget batching: little padding waste, rows returned in input order."""

from __future__ import annotations

from typing import Sequence


def plan_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None,
                 max_padding: float | None = None) -> list[list[int]]:
    """Group the indices of ``lengths`` into batches, longest texts first.

    Each batch has at most ``batch_size`` rows and, when ``max_tokens`` is set, at most
    ``max_tokens`` padded tokens (rows x longest row); a text longer than the budget runs alone.
    Sorting by length keeps texts of similar length together, so padding waste stays small when
    there are many texts. A few texts of spread-out lengths (one dynamic-batcher merge) still pad
    a lot: ``max_padding`` starts a new batch where a row would be more than that fraction padding
    (Qwen3-0.6B-shaped, 48 texts of 62-239 tokens in 4,096-token calls: 29% padded tokens, 1.48x
    the CPU per text of one text per call; benchmarks/RESULTS.md).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if max_padding is not None and not 0 <= max_padding < 1:
        raise ValueError(f"max_padding must be in [0, 1), got {max_padding}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    plan: list[list[int]] = []
    current: list[int] = []
    for index in order:
        width = lengths[current[0]] if current else lengths[index]
        fits_rows = len(current) < batch_size
        fits_tokens = max_tokens is None or (len(current) + 1) * width <= max_tokens
        fits_padding = max_padding is None or lengths[index] >= (1 - max_padding) * width
        if current and not (fits_rows and fits_tokens and fits_padding):
            plan.append(current)
            current = []
        current.append(index)
    if current:
        plan.append(current)
    return plan
