"""The parity gate: an exported graph against the PyTorch reference, on a fixed varied text set.

Both sides get identical token ids (the artifact's own tokenizer and manifest build them; they
are checked against the reference's encoder), in padded batches of mixed lengths, right- and
left-padded, as queries and as documents. Tolerances are METHODS.md's ("What the same means").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Tuple

import numpy as np

from ...artifact.certificates import TOLERANCES  # noqa: F401  (docs/methods.md's bars, re-exported)
from ...artifact.report import ParityReport  # noqa: F401  (the artifact contract's, re-exported)
from ...methods.architectures import sliding_window
from ...methods.sharing import output_names
from .texts import (  # noqa: F401  (re-exported)
    DECIDING_HELD_OUT_TEXTS, GATE, GATE_TEXTS, HELD_OUT, HELD_OUT_TEXTS, PARITY_TEXTS, WINDOW, WINDOW_KIND, gated_texts,
    held_out_texts, text_groups,
)
from ..graph.trace import ExportError

KINDS = ("query", "document")
PADDING_SIDES = ("right", "left")
#: every (kind, padding side): the core texts run in each
CASES = tuple((kind, side) for kind in KINDS for side in PADDING_SIDES)
#: each variety group runs in one case, the groups taking the cases in turn: the core already covers
#: every kind and side, so the variety texts pay for content, not for padding again
GATE_GROUP_CASES = tuple((case,) for case in CASES)
#: the held-out groups take the cases in turn as well
HELD_OUT_GROUP_CASES = ((("query", "left"),), (("document", "right"),))
#: the window text runs alone, once: one row has nothing to pad, so either side is the same batch
WINDOW_GROUP_CASES = (((WINDOW_KIND, "right"),),)
#: split -> the cases its groups take in turn
GROUP_CASES = {GATE: GATE_GROUP_CASES, HELD_OUT: HELD_OUT_GROUP_CASES, WINDOW: WINDOW_GROUP_CASES}


def batch_plan(names: Sequence[str]) -> list[list[str]]:
    """Batches of core text names: the short texts in one padded batch, the longest ones with the
    empty text (padded to them), and a single row. Padding the short ones to the longest would
    double the core's arithmetic, the larger part of a big model's export, without padding
    anything more extreme than the second batch already does."""
    padded = ("long", "unicode", "numbers", "code", "empty")
    return [[n for n in names if n not in padded], list(padded), ["sentence"]]


@dataclass(frozen=True)
class GateBatch:
    """One padded batch of the gate: its padding side and its rows, each ``(kind, text name)``.

    A batch may hold queries and documents together: their prompts differ, the padded machinery
    they run through does not, and every batch costs a pass over all the weights besides its
    tokens' arithmetic (on a big model, seconds per batch on each side of the gate)."""

    side: str
    rows: Tuple[Tuple[str, str], ...]

    @property
    def names(self) -> list[str]:
        return [name for _, name in self.rows]

    def cases(self) -> list[str]:
        """Each row's case, ``kind/side``, as the report groups them."""
        return [f"{kind}/{self.side}" for kind, _ in self.rows]

    def encode(self, encoder: Any, texts: Mapping[str, str]) -> list[Any]:
        """The rows through ``encoder`` (a TextEncoder), each text as its kind, in row order."""
        return [encoder.encode_one(texts[name], kind) for kind, name in self.rows]

    def pad(self, encoder: Any, texts: Mapping[str, str]) -> dict[str, np.ndarray]:
        """The padded batch ``encoder`` builds of the rows."""
        return encoder.pad(self.encode(encoder, texts), self.side)

    def pad_distinct(self, encoder: Any, texts: Mapping[str, str]) -> dict[str, np.ndarray]:
        """The padded batch of the rows' :func:`distinct` encodings: what each side of the gate runs."""
        return encoder.pad(distinct(self.encode(encoder, texts))[0], self.side)

    def describe(self) -> str:
        kinds = "/".join(dict.fromkeys(kind for kind, _ in self.rows))
        return f"{kinds} {self.side}-padded batch {self.names}"


def distinct(encoded: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """``encoded`` rows without repeats, and each row's index among them. A query and a document
    that tokenise alike (a method without prompts) are the same input: the gate runs it once on
    each side and compares both rows on that run, so no padded token is computed twice."""
    unique: list[Any] = []
    index: list[int] = []
    seen: dict[tuple, int] = {}
    for item in encoded:
        key = (item.ids, item.pool, item.context)
        if key not in seen:
            seen[key] = len(unique)
            unique.append(item)
        index.append(seen[key])
    return unique, index


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    num = (a64 * b64).sum(-1)
    den = np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(np.abs(a64 - b64).max(-1) == 0, 1.0, 0.0))
    return cos


#: ``batch -> (embedding, pooled)``: one side of a comparison, run on a padded batch
RunBatch = Callable[[Mapping[str, np.ndarray]], Tuple[np.ndarray, np.ndarray]]
#: ``advance(done, total)``: work done so far in a long stage, for a progress line with the time left
Advance = Callable[[int, int], None]


def _padded_tokens(batch: Mapping[str, np.ndarray]) -> int:
    """A padded batch's size in tokens: the unit of the gate's work (each side runs every one)."""
    return int(np.asarray(batch["input_ids"]).size)


def run_parity(
    session: Any,
    encoder: Any,
    reference: Any,
    precision: str,
    texts: dict[str, str] | None = None,
    cache: dict[Any, Any] | None = None,
    outputs: tuple[str, str] = ("embedding", "pooled"),
    advance: Advance | None = None,
    stop_at_miss: bool = False,
) -> ParityReport:
    """Compare ``session`` (an onnxruntime session, or any backend's :class:`~kvembed.backends.protocol.Session`)
    against ``reference`` (a TorchEmbedder).

    ``encoder`` is the artifact's TextEncoder (rebuilt from its tokenizer.json and manifest); its
    token ids must equal the reference encoder's, else the artifact would tokenise differently.
    ``cache`` (a dict owned by the caller, one per reference) keeps the reference's outputs for
    the next precision exported from the same trace. ``outputs`` names the graph's
    (embedding, pooled) pair to check; the reference's first pair is what it is checked against.
    ``stop_at_miss``: as :func:`compare_runs`'s.
    """
    protocol = hasattr(session, "input_names")  # a backends Session (OpenVINO's too), else a bare onnxruntime one
    feeds = set(session.input_names) if protocol else {i.name for i in session.get_inputs()}

    def ours(batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        fed = {k: v for k, v in batch.items() if k in feeds}
        got = session.run(fed, list(outputs)) if protocol else session.run(list(outputs), fed)
        return got[0], got[1]

    def theirs(batch: Mapping[str, np.ndarray], key: tuple) -> tuple[np.ndarray, np.ndarray]:
        key = (outputs, *key)
        if cache is not None and key in cache:
            ran = cache[key]
            if not ran.ran_on(batch):
                raise ExportError(f"the gate's {key[1]}-padded batch {[n for _, n in key[2]]} differs from the one "
                                  "the reference ran on")
            return ran.embedding, ran.pooled
        ran = run_reference(reference, batch)
        if cache is not None:
            cache[key] = ran
        return ran.embedding, ran.pooled

    def same_tokens(batch: GateBatch, texts: Mapping[str, str], ours_encoded: list[Any]) -> bool:
        theirs_encoded = batch.encode(reference.encoder, texts)
        return ([e.ids for e in ours_encoded] == [e.ids for e in theirs_encoded]
                and [e.pool for e in ours_encoded] == [e.pool for e in theirs_encoded])

    return compare_runs(ours, theirs, encoder, precision, texts, same_tokens, advance, stop_at_miss)


@dataclass
class ReferenceRun:
    """The reference's (embedding, pooled) on one padded batch, and the batch it ran on: kept so
    the gate can compare a graph after the PyTorch weights are gone (:func:`reference_runs`)."""

    embedding: np.ndarray
    pooled: np.ndarray
    inputs: dict[str, np.ndarray]

    def ran_on(self, batch: Mapping[str, np.ndarray]) -> bool:
        """Whether ``batch`` is exactly the batch these outputs came from."""
        return set(batch) == set(self.inputs) and all(np.array_equal(batch[k], self.inputs[k]) for k in batch)


def run_reference(reference: Any, batch: Mapping[str, np.ndarray]) -> ReferenceRun:
    """``reference`` (a TorchEmbedder) on a padded batch: its first (embedding, pooled) pair."""
    import torch

    parameter = next(reference.model.parameters(), None)
    if parameter is not None and parameter.is_meta:
        raise ExportError("the PyTorch weights were freed before the reference ran on this batch of the gate")
    with torch.inference_mode(), reference.model.patched():
        want = reference.model(**{k: torch.from_numpy(v) for k, v in batch.items()})
    embedding, pooled = (w.float().numpy() for w in want[:2])
    return ReferenceRun(embedding, pooled, {k: np.array(v) for k, v in batch.items()})


def batch_key(batch: GateBatch, texts: Mapping[str, str]) -> tuple:
    """What names a batch's reference outputs in the cache: its side, its rows and their texts."""
    return (batch.side, batch.rows, tuple(texts[name] for name in batch.names))


def gate_batches(texts: Mapping[str, str]) -> list[GateBatch]:
    """The gate's padded batches in order, each padding side's in turn.

    The core texts (every text not in the data file's groups; :func:`batch_plan`) run in every
    case: each batch of several rows once per padding side, holding each of its texts as a query
    and as a document; a one-row batch once per kind (one row has nothing to pad: either side is
    the same batch). Texts of the data file's groups (:func:`~kvembed.export.gate.texts.text_groups`)
    run as their group, in its split's cases (:data:`GROUP_CASES`)."""
    groups = text_groups()
    grouped = {name for names in groups.values() for name in names}
    core = [[n for n in names if n in texts] for names in batch_plan([n for n in texts if n not in grouped])]
    planned: list[tuple[list[str], tuple]] = []
    counts: dict[str, int] = {}
    for key, names in groups.items():
        present = [n for n in names if n in texts]
        if present:
            split = key.split("/", 1)[0]
            rotation = GROUP_CASES[split]
            index = counts[split] = counts.get(split, -1) + 1
            planned.append((present, rotation[index % len(rotation)]))
    batches: list[GateBatch] = []
    for side in PADDING_SIDES:
        for names in core:
            if len(names) > 1:
                batches.append(GateBatch(side, tuple((kind, n) for kind in KINDS for n in names)))
            elif names and side == PADDING_SIDES[0]:
                batches += [GateBatch(side, ((kind, names[0]),)) for kind in KINDS]
        for kind in KINDS:
            batches += [GateBatch(side, tuple((kind, n) for n in names)) for names, cases in planned if (kind, side) in cases]
    return batches


def model_gate_texts(embedder: Any) -> dict[str, str]:
    """What the gate decides on for ``embedder`` (a TorchEmbedder, its weights freed or not):
    :func:`~kvembed.export.gate.texts.gated_texts` for its encoder and its model's sliding window."""
    return gated_texts(embedder.encoder, sliding_window(embedder.model.decoder.config))


def gate_tokens(encoder: Any, texts: Mapping[str, str]) -> int:
    """The padded tokens of the gate's batches of ``texts`` through ``encoder``: the work each side
    (the reference and the graph) runs."""
    return sum(_padded_tokens(batch.pad_distinct(encoder, texts)) for batch in gate_batches(texts))


def reference_runs(
    reference: Any,
    cache: dict[Any, Any],
    texts: dict[str, str] | None = None,
    outputs: tuple[str, str] = ("embedding", "pooled"),
    advance: Advance | None = None,
) -> None:
    """Run ``reference`` on every batch of the gate now, filling ``cache`` as :func:`run_parity`
    would: the exporter does this before tracing, so that the PyTorch model can be freed before
    any onnxruntime session is built. Each batch is built by the reference's own encoder; the gate
    later checks that the artifact's encoder builds the very same batch."""
    texts = dict(GATE_TEXTS if texts is None else texts)
    batches = {(outputs, *batch_key(batch, texts)): batch.pad_distinct(reference.encoder, texts) for batch in gate_batches(texts)}
    total, done = sum(_padded_tokens(b) for b in batches.values()), 0
    for key, batch in batches.items():
        if key not in cache:
            cache[key] = run_reference(reference, batch)
        done += _padded_tokens(batch)
        if advance is not None:
            advance(done, total)


def compare_runs(
    run: RunBatch,
    reference: Callable[[Mapping[str, np.ndarray], tuple], Tuple[np.ndarray, np.ndarray]],
    encoder: Any,
    precision: str,
    texts: dict[str, str] | None = None,
    same_tokens: Callable[[GateBatch, Mapping[str, str], list[Any]], bool] | None = None,
    advance: Advance | None = None,
    stop_at_miss: bool = False,
) -> ParityReport:
    """The gate's comparison, for any two ways of running a padded batch: the parity texts through
    ``encoder`` in the gate's batches (:func:`gate_batches`), as queries and documents, right- and
    left-padded; ``run(batch)`` against ``reference(batch, key)`` (``key``, :func:`batch_key`, names
    the batch, for caching) by METHODS.md's tolerance for ``precision``. ``same_tokens(batch, texts,
    encoded)``, when given, must hold for a batch to be compared (the reference tokenises on its
    own). ``advance(done, total)`` is told the batches' padded tokens run so far.

    ``stop_at_miss``: stop before the next batch once the verdict is a miss (no later batch can
    undo a problem, a cosine below the bar or a difference over its bound), for a gate whose miss
    only sends the export on to another recipe; the report says so (``stopped_early``). Off, every
    batch is compared and the report is complete."""
    texts = dict(GATE_TEXTS if texts is None else texts)
    tolerance = TOLERANCES[precision]
    min_cos, max_abs = tolerance["min_cosine"], tolerance.get("max_abs")
    worst_cos, worst_abs, worst_pooled = 1.0, 0.0, 1.0
    worst_row: dict[str, Any] = {}
    by_case: dict[str, dict[str, float]] = {}
    problems: list[str] = []
    rows = batches = 0
    stopped = False
    planned = gate_batches(texts)  # each padding side's batches in turn
    encoded = [batch.encode(encoder, texts) for batch in planned]
    runs = [distinct(items) for items in encoded]  # what each side runs: each distinct row once
    total = sum(len(unique) * max((len(x.ids) for x in unique), default=0) for unique, _ in runs)
    longest = max((len(x.ids) for items in encoded for x in items), default=0)
    done = 0
    for batch, ours, (unique, index) in zip(planned, encoded, runs):
        if stop_at_miss and _misses(problems, worst_cos, worst_abs, min_cos, max_abs):
            stopped = True
            break
        cases = batch.cases()
        if same_tokens is not None and not same_tokens(batch, texts, ours):
            problems.append(f"token ids differ from the reference's for the {batch.describe()}")
            continue
        padded = encoder.pad(unique, batch.side)
        want_e, want_p = reference(padded, batch_key(batch, texts))
        got_e, got_p = (np.asarray(g, dtype=np.float32) for g in run(padded))
        done += _padded_tokens(padded)
        if advance is not None:
            advance(done, max(total, done))
        if got_e.shape != want_e.shape:
            problems.append(f"output shape {got_e.shape} != reference {want_e.shape}")
            continue
        want_e, want_p, got_e, got_p = (np.asarray(a)[index] for a in (want_e, want_p, got_e, got_p))  # every row
        cos = cosine_rows(got_e, want_e)
        if not np.isfinite(got_e).all():
            problems.append(f"non-finite values in the graph's output for the {batch.describe()}")
            cos = np.where(np.isfinite(got_e).all(-1), cos, -1.0)
        diff = np.abs(got_e.astype(np.float64) - want_e)
        diff = np.where(np.isfinite(diff), diff, np.inf).max(-1)
        pooled_cos = cosine_rows(got_p, want_p)
        rows += len(batch.rows)
        batches += 1
        worst_pooled = min(worst_pooled, float(np.nan_to_num(pooled_cos, nan=-1.0).min()))
        row = int(np.argmin(cos))
        if float(cos[row]) < worst_cos:
            worst_cos = float(cos[row])
            kind, name = batch.rows[row]
            worst_row = {"text": name, "kind": kind, "padding_side": batch.side, "batch_size": len(batch.rows)}
        worst_abs = max(worst_abs, float(diff.max()))
        for case, row_cos, row_diff in zip(cases, cos, diff):
            seen = by_case.setdefault(case, {"worst_cosine": 1.0, "max_abs_diff": 0.0})
            seen["worst_cosine"] = min(seen["worst_cosine"], float(row_cos))
            seen["max_abs_diff"] = max(seen["max_abs_diff"], float(row_diff))
    if not stopped:  # every case in its place, one these texts have no batch in too
        by_case = {case: by_case.get(case, {"worst_cosine": 1.0, "max_abs_diff": 0.0}) for case in (f"{k}/{s}" for k, s in CASES)}
    passed = rows > 0 and not _misses(problems, worst_cos, worst_abs, min_cos, max_abs)
    if rows == 0 and not problems:
        problems.append("no rows compared")
    return ParityReport(
        precision=precision,
        passed=bool(passed),
        worst_cosine=_finite(worst_cos),
        max_abs_diff=_finite(worst_abs),
        min_cosine_required=min_cos,
        max_abs_allowed=max_abs,
        rows=rows,
        batches=batches,
        texts=len(texts),
        worst_row=worst_row,
        pooled_worst_cosine=_finite(worst_pooled),
        by_case=by_case,
        problems=sorted(set(problems)),
        longest_tokens=longest,
        stopped_early=stopped,
    )


def _misses(problems: Sequence[str], worst_cos: float, worst_abs: float, min_cos: float, max_abs: float | None) -> bool:
    """Whether the figures so far already decide a miss: more batches can only add problems, lower
    the worst cosine and raise the largest difference."""
    return bool(problems) or not worst_cos >= min_cos or (max_abs is not None and not worst_abs <= max_abs)


def _finite(x: float) -> float:
    """JSON has no inf/nan: report them as large sentinels."""
    if math.isnan(x):
        return -1.0
    if math.isinf(x):
        return 1e30 if x > 0 else -1e30
    return float(x)


def parity_reports(
    session: Any,
    encoder: Any,
    references: Mapping[str | None, Any],
    precision: str,
    cache: dict[Any, Any] | None = None,
    advance: Callable[[int, int], None] | None = None,
    texts: dict[str, str] | None = None,
    stop_at_miss: bool = False,
) -> dict[str | None, ParityReport]:
    """Parity of every output pair of the graph (label None: the main one) against its
    single-method reference (:meth:`TorchEmbedder.references`), on ``texts`` (default
    :data:`GATE_TEXTS`; a sliding-window model's: :func:`~kvembed.export.gate.texts.gated_texts`).

    ``stop_at_miss``: each comparison stops at its first miss (:func:`compare_runs`), and once one
    output missed the later ones are not run (the graph is refused whatever they say)."""
    reports: dict[str | None, ParityReport] = {}
    for label, reference in references.items():
        reports[label] = run_parity(session, encoder, reference, precision, texts=texts, cache=cache,
                                    outputs=output_names(label), advance=advance, stop_at_miss=stop_at_miss)
        if stop_at_miss and not reports[label].passed:
            break
    return reports
