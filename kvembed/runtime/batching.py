"""Length-sorted, token-budget batching: little padding waste, rows returned in input order."""

from __future__ import annotations

from typing import Sequence


def plan_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Group the indices of ``lengths`` into batches, longest texts first.

    Each batch has at most ``batch_size`` rows and, when ``max_tokens`` is set, at most
    ``max_tokens`` padded tokens (rows x longest row); a text longer than the budget runs alone.
    Sorting by length keeps texts of similar length together, so padding waste stays small.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    plan: list[list[int]] = []
    current: list[int] = []
    for index in order:
        width = lengths[current[0]] if current else lengths[index]
        fits_rows = len(current) < batch_size
        fits_tokens = max_tokens is None or (len(current) + 1) * width <= max_tokens
        if current and not (fits_rows and fits_tokens):
            plan.append(current)
            current = []
        current.append(index)
    if current:
        plan.append(current)
    return plan
