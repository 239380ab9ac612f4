"""The one batching policy and the one batching loop: plan -> pad -> run -> scatter, in input order.

Every caller that embeds many encoded inputs (``Embedder.encode``, ``kvembed serve``'s batcher,
corpus workers, Triton's python model; the torch reference can too) goes through
:func:`run_batches` under a :class:`BatchPolicy`, so the budgets mean the same everywhere.
Torch-free and backend-free: the pad and run steps are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from ..backends.targets import ORT_CPU_CALL_COST, TARGETS
from ..errors import InvalidInput

#: padded tokens per graph call on the CPU and OpenVINO (the ``max_call_tokens`` default there):
#: bigger batches run in row slices, whose activations stay cache-sized, which is both leaner and
#: faster there (benchmarks/log/goals-and-profile.md, "call slicing").
CPU_CALL_TOKENS = 2048

#: padded tokens per batch where many requests' or files' rows are batched together (``kvembed
#: serve``'s and ``kvembed embed-corpus``' ``--max-batch-tokens`` default): the runtime runs such a
#: batch in graph calls of at most its per-call budget, so this bounds a batch's memory, not a call's.
SERVICE_BATCH_TOKENS = 16384


def policy_defaults(target: str) -> tuple[int | None, int | None]:
    """``(max_call_tokens, call_cost)`` a session of ``target`` is run under unless told otherwise:
    :data:`CPU_CALL_TOKENS` and the target's call cost on the CPU (a target the registry does not
    know counts as onnxruntime's CPU), one call per batch and greedy cuts on a GPU."""
    spec = TARGETS.get(target)
    if spec is None:
        return CPU_CALL_TOKENS, ORT_CPU_CALL_COST
    return (CPU_CALL_TOKENS, spec.call_cost) if spec.on_cpu else (None, None)


Item = TypeVar("Item")
Batch = TypeVar("Batch")


@dataclass(frozen=True)
class BatchPolicy:
    """How encoded inputs are grouped into batches and graph calls; one name per idea.

    A *batch* is what one pad step builds (rows padded to their longest); the run step may run it
    in several *graph calls* of whole rows. Vectors never depend on the policy (rows are independent).
    """

    batch_size: int = 32
    """Rows per batch."""
    max_batch_tokens: int | None = None
    """Padded tokens per batch (rows x longest row; None: no limit); a longer row runs alone."""
    max_call_tokens: int | None = None
    """Padded tokens per graph call: the run step runs a bigger batch in row slices (None: one call)."""
    call_cost: int | None = None
    """Padded tokens one more batch is worth: sorted rows are cut where that saves more padding (None: greedy cuts)."""
    max_padding: float | None = None
    """Largest fraction of a row that may be padding: a row padded more starts a new batch (None: any)."""

    def __post_init__(self) -> None:
        _integer("batch_size", self.batch_size, 1)
        for name in ("max_batch_tokens", "max_call_tokens"):
            if getattr(self, name) is not None:
                _integer(name, getattr(self, name), 1)
        if self.call_cost is not None:
            _integer("call_cost", self.call_cost, 0, "(tokens)")
        if self.max_padding is not None and (isinstance(self.max_padding, bool) or not 0 <= self.max_padding < 1):
            raise InvalidInput(f"max_padding must be in [0, 1), got {self.max_padding!r}")
        if self.call_cost is not None and self.max_padding is not None:
            raise InvalidInput("give max_padding or call_cost, not both")

    @classmethod
    def from_options(cls, base: "BatchPolicy | None" = None, **options: Any) -> "BatchPolicy":
        """``base`` (default: the defaults) with ``options`` replaced; an unknown name is refused by name."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"unknown batching option {', '.join(map(repr, unknown))}; the options are {', '.join(sorted(names))}")
        return replace(base or cls(), **options)

    def plan(self, lengths: Sequence[int]) -> list[list[int]]:
        """Group the indices of ``lengths`` into batches, longest first (see :func:`plan_batches`)."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        if self.call_cost is not None:
            cuts = cheapest_cuts([lengths[i] for i in order], self.batch_size, self.max_batch_tokens, self.call_cost)
            return [order[a:b] for a, b in zip(cuts, cuts[1:])]
        plan: list[list[int]] = []
        current: list[int] = []
        for index in order:
            width = lengths[current[0]] if current else lengths[index]
            fits_rows = len(current) < self.batch_size
            fits_tokens = self.max_batch_tokens is None or (len(current) + 1) * width <= self.max_batch_tokens
            fits_padding = self.max_padding is None or lengths[index] >= (1 - self.max_padding) * width
            if current and not (fits_rows and fits_tokens and fits_padding):
                plan.append(current)
                current = []
            current.append(index)
        if current:
            plan.append(current)
        return plan

    def rows_per_call(self, width: int) -> int | None:
        """Rows of ``width`` padded tokens one graph call takes under :attr:`max_call_tokens`
        (at least one; None: any number)."""
        return None if self.max_call_tokens is None else max(1, self.max_call_tokens // max(1, width))


def _integer(name: str, value: Any, low: int, unit: str = "") -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise InvalidInput(f"{name} must be an integer >= {low}{' ' + unit if unit else ''}, got {value!r}")


def plan_batches(lengths: Sequence[int], batch_size: int, max_batch_tokens: int | None = None,
                 max_padding: float | None = None, call_cost: int | None = None) -> list[list[int]]:
    """Group the indices of ``lengths`` into batches, longest texts first (``BatchPolicy.plan``).

    Each batch has at most ``batch_size`` rows and, when ``max_batch_tokens`` is set, at most
    ``max_batch_tokens`` padded tokens (rows x longest row); a text longer than the budget runs alone.
    Sorting by length keeps texts of similar length together, so padding waste stays small when
    there are many texts. A few texts of spread-out lengths (one dynamic-batcher merge) still pad
    a lot: ``max_padding`` starts a new batch where a row would be more than that fraction padding.

    ``call_cost`` (tokens) plans instead the cheapest cut of the sorted lengths into calls, where a
    call costs its padded tokens plus ``call_cost``: it splits a batch only where that saves more
    padding than one more call costs, so calls stay full when lengths are close (see
    :func:`cheapest_cuts`).
    """
    return BatchPolicy(batch_size, max_batch_tokens, None, call_cost, max_padding).plan(lengths)


def cheapest_cuts(widths: Sequence[int], batch_size: int, max_batch_tokens: int | None, call_cost: int) -> list[int]:
    """Cut points ``0 = c0 < c1 < ... = n`` of ``widths`` (sorted longest first) minimising the sum
    over calls of rows x first width + ``call_cost``, each call within ``batch_size`` rows and
    ``max_batch_tokens`` padded tokens (a lone row may exceed the budget). Dynamic programming over the
    last cut, vectorised over the at most ``batch_size`` candidates: O(n x batch_size)."""
    n = len(widths)
    width = np.asarray(widths, dtype=np.int64)
    best = np.zeros(n + 1, dtype=np.int64)
    last = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        start = np.arange(max(0, end - batch_size), end)
        cost = best[start] + (end - start) * width[start] + call_cost
        if max_batch_tokens is not None:
            cost[((end - start) * width[start] > max_batch_tokens) & (start < end - 1)] = np.iinfo(np.int64).max
        pick = int(np.argmin(cost))
        best[end], last[end] = cost[pick], start[pick]
    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(int(last[cuts[-1]]))
    return cuts[::-1]


def run_batches(
    items: Sequence[Item],
    policy: BatchPolicy,
    pad: Callable[[Sequence[Item]], Batch],
    run: Callable[[Batch], Sequence[Any]],
    outputs: Sequence[np.ndarray],
    *,
    lengths: Sequence[int] | None = None,
    on_batch: Callable[[list[int], Batch], None] | None = None,
) -> Sequence[np.ndarray]:
    """The batching loop: plan ``items`` under ``policy``, ``pad`` each batch, ``run`` it, and
    scatter its rows into ``outputs`` (preallocated, one row per item) at their input positions.

    ``pad(items) -> batch`` and ``run(batch) -> arrays`` (one per output, rows in batch order) are
    the caller's: the runtime's are ``TextEncoder.pad`` and ``Embedder.run``; the torch reference
    passes its own forward. ``run`` owns the per-call budget (:meth:`BatchPolicy.rows_per_call`).
    ``lengths`` defaults to ``len(item.ids)``; ``on_batch(indices, batch)`` follows each batch
    (progress bars, metrics). Returns ``outputs``.
    """
    if lengths is None:
        lengths = [len(item.ids) for item in items]  # type: ignore[attr-defined]
    for chunk in policy.plan(lengths):
        batch = pad([items[i] for i in chunk])
        for out, array in zip(outputs, run(batch), strict=True):
            out[chunk] = array
        if on_batch is not None:
            on_batch(chunk, batch)
    return outputs


def run_in_slices(
    batch: Mapping[str, np.ndarray], rows_per_call: int | None, call: Callable[[Mapping[str, np.ndarray]], Sequence[np.ndarray]],
) -> list[np.ndarray]:
    """Run one padded ``batch`` as graph calls of at most ``rows_per_call`` whole rows (None: one
    call) and join the outputs; rows are independent, so the vectors do not change."""
    rows = len(next(iter(batch.values())))
    step = rows_per_call or rows
    if rows <= step:
        return list(call(batch))
    parts = [call({k: v[i : i + step] for k, v in batch.items()}) for i in range(0, rows, step)]
    return [np.concatenate(column) for column in zip(*parts)]
