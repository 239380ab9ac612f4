"""Length-sorted, token-budget batching: little padding waste, rows returned in input order."""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: padded tokens one more graph call is worth on the CPU (``call_cost`` of :func:`plan_batches`):
#: a call's fixed cost is small there (stories260k: 0.3 ms for 1 x 16 tokens, ~13 us per token in a
#: 64 x 64 batch, so a call is worth ~15-25 tokens) and small calls run as fast per token as big ones
#: (SmolLM2-135M, a 256-text window of 1-400 characters: 1.21x faster than greedy cuts at 16, 1.13x at
#: 64). Unmeasured on GPUs, where launches cost more: greedy cuts there (benchmarks/RESULTS.md).
CPU_CALL_COST = 32


def plan_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None,
                 max_padding: float | None = None, call_cost: int | None = None) -> list[list[int]]:
    """Group the indices of ``lengths`` into batches, longest texts first.

    Each batch has at most ``batch_size`` rows and, when ``max_tokens`` is set, at most
    ``max_tokens`` padded tokens (rows x longest row); a text longer than the budget runs alone.
    Sorting by length keeps texts of similar length together, so padding waste stays small when
    there are many texts. A few texts of spread-out lengths (one dynamic-batcher merge) still pad
    a lot: ``max_padding`` starts a new batch where a row would be more than that fraction padding
    (Qwen3-0.6B-shaped, 48 texts of 62-239 tokens in 4,096-token calls: 29% padded tokens, 1.48x
    the CPU per text of one text per call; benchmarks/RESULTS.md).

    ``call_cost`` (tokens) plans instead the cheapest cut of the sorted lengths into calls, where a
    call costs its padded tokens plus ``call_cost``: it splits a batch only where that saves more
    padding than one more call costs, so calls stay full when lengths are close (see
    :func:`cheapest_cuts`).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if max_padding is not None and not 0 <= max_padding < 1:
        raise ValueError(f"max_padding must be in [0, 1), got {max_padding}")
    if call_cost is not None and call_cost < 0:
        raise ValueError(f"call_cost must be >= 0 tokens, got {call_cost}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if call_cost is not None:
        if max_padding is not None:
            raise ValueError("give max_padding or call_cost, not both")
        cuts = cheapest_cuts([lengths[i] for i in order], batch_size, max_tokens, call_cost)
        return [order[a:b] for a, b in zip(cuts, cuts[1:])]
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


def cheapest_cuts(widths: Sequence[int], batch_size: int, max_tokens: int | None, call_cost: int) -> list[int]:
    """Cut points ``0 = c0 < c1 < ... = n`` of ``widths`` (sorted longest first) minimising the sum
    over calls of rows x first width + ``call_cost``, each call within ``batch_size`` rows and
    ``max_tokens`` padded tokens (a lone row may exceed the budget). Dynamic programming over the
    last cut, vectorised over the at most ``batch_size`` candidates: O(n x batch_size)."""
    n = len(widths)
    width = np.asarray(widths, dtype=np.int64)
    best = np.zeros(n + 1, dtype=np.int64)
    last = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        start = np.arange(max(0, end - batch_size), end)
        cost = best[start] + (end - start) * width[start] + call_cost
        if max_tokens is not None:
            cost[((end - start) * width[start] > max_tokens) & (start < end - 1)] = np.iinfo(np.int64).max
        pick = int(np.argmin(cost))
        best[end], last[end] = cost[pick], start[pick]
    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(int(last[cuts[-1]]))
    return cuts[::-1]
