"""The same artifact on every backend present, compared: onnxruntime (CPU, CUDA, TensorRT EP), TensorRT, OpenVINO, ONNX's reference.

``kvembed verify DIR`` checks an artifact against PyTorch (the parity gate, on onnxruntime's CPU
provider). This module checks the artifact's graph against *itself* on the other backends this
machine has, through polygraphy's :class:`~polygraphy.comparator.Comparator` (the targets, their
probes are :mod:`kvembed.export.gate.targets`'; the runners are
:mod:`kvembed.export.gate.runners`'):

- ``onnxruntime-cpu``: always (the baseline every other backend is compared with);
- ``onnxruntime-cuda`` / ``onnxruntime-tensorrt``: when onnxruntime reports the CUDA / TensorRT
  execution provider (onnxruntime-gpu, ``pip install 'kvembed[gpu]'``);
- ``tensorrt``: polygraphy's ``TrtRunner`` on an engine built from ``model.onnx``, when
  ``import tensorrt`` works (PyPI has only stubs: TensorRT comes from NVIDIA). Not for int8
  artifacts, whose ``DynamicQuantizeLinear``/``MatMulInteger`` TensorRT's parser rejects;
- ``openvino-f32`` / ``openvino-bf16``: OpenVINO's CPU plugin (the runtime's ``provider="openvino"``,
  :mod:`kvembed.backends.openvino`) under the f32 and bf16 precision hints, when ``import openvino``
  works (``pip install 'kvembed[openvino]'``); ``openvino`` names both. ``auto`` runs bf16 only on
  CPUs that list BF16 (elsewhere OpenVINO would run f32 again: ask for it by name);
- ``onnx-reference``: ``onnx.reference.ReferenceEvaluator``, pure Python and slow, so ``auto``
  offers it only for models under 50 MB (ask for it by name otherwise). It is the independent
  one: it shares no kernel with onnxruntime.

Inputs are real, not random ids: texts of the parity set through the artifact's own text encoder
(tokenizer.json + manifest), in padded batches of mixed lengths, right- and left-padded, as
queries and as documents. Every output of the graph is compared.

Tolerances (:data:`BACKEND_TOLERANCES`), per precision of the artifact. Each backend pair runs the
*same* graph, so the bars are those of "the same computation, other kernels", not of "the graph
against PyTorch":

- fp32: atol 1e-4 on the L2-normalised ``embedding`` (METHODS.md's fp32 parity bound), rtol 1e-3,
  worst row cosine >= 0.99999. Kernels differ only in summation order.
- fp16: atol = rtol = 1e-2, cosine >= 0.999: fp16 kernels legitimately differ in where they
  accumulate in fp32 (onnxruntime's CPU MatMul, numpy, TensorRT's tactics), so two fp16 backends
  are as far apart as fp16 is from fp32.
- int8: atol = rtol = 2e-2, cosine >= 0.999. Both sides run the same quantised graph, but that
  does not make int8 "bit-exact": ``DynamicQuantizeLinear`` rounds activations to a step, so a
  1-ulp float difference before it (or onnxruntime's fused ``DynamicQuantizeMatMul`` computing the
  scale in another order) flips whole quantisation steps, which then propagate. The cosine bar
  stays much tighter than int8's 0.99 against PyTorch; the element bound is honest about steps.

A pair whose second backend computes in lower precision than the artifact gets both errors'
budgets, stacked (:func:`stacked`: element bounds add, cosine angles add): ``openvino-bf16``
(bf16 matmuls, 8-bit mantissa) brings fp16's bounds (:data:`PAIR_TOLERANCES`), so an fp32
artifact's pair is held to cosine >= 0.99879 and an int8 artifact's, whose quantisation steps
bf16 rounding flips too, to 0.9960.

Outputs that are not L2-normalised (``pooled``) get the same atol scaled by their largest row
norm, i.e. the tolerance is relative to the vectors' size, as it is for ``embedding``.
Polygraphy's verdict (element-wise: each element within atol *or* rtol) and our per-row cosine
(worst row over all outputs) must both pass.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ...artifact import MODEL, Manifest, load_manifest
from ...artifact.certificates import precision_name
from .targets import CPU, OV_BF16, OV_F16, TARGET_ALIASES, TARGET_NAMES, TARGETS
from ...backends.protocol import BackendUnavailableError
from ...runtime.artifact import encoder_from_manifest
from .parity import PADDING_SIDES, PARITY_TEXTS, cosine_rows
from .runners import make_runner, resolve_backends
from ...errors import InvalidInput, shown, with_hint


@dataclass(frozen=True)
class BackendTolerance:
    atol: float
    rtol: float
    min_cosine: float


#: see the module docstring for why each precision gets these bounds
BACKEND_TOLERANCES: dict[str, BackendTolerance] = {
    "fp32": BackendTolerance(atol=1e-4, rtol=1e-3, min_cosine=0.99999),
    "fp16": BackendTolerance(atol=1e-2, rtol=1e-2, min_cosine=0.999),
    "int8": BackendTolerance(atol=2e-2, rtol=2e-2, min_cosine=0.999),
}
#: backends computing below fp32 whatever the artifact: their pairs get at least these bounds
PAIR_TOLERANCES: dict[str, BackendTolerance] = {OV_BF16: BACKEND_TOLERANCES["fp16"], OV_F16: BACKEND_TOLERANCES["fp16"]}


def stacked(first: BackendTolerance, second: BackendTolerance) -> BackendTolerance:
    """The bar for two approximations applied one after the other (an int8 graph computed with bf16
    matmuls): element bounds add, and so do the angles the cosine bounds allow (the triangle
    inequality on the sphere), so each error keeps its own budget."""
    angle = math.acos(first.min_cosine) + math.acos(second.min_cosine)
    return BackendTolerance(atol=first.atol + second.atol, rtol=first.rtol + second.rtol, min_cosine=math.cos(angle))

#: (kind, text names) of the comparison batches; each is run right- and left-padded
COMPARE_PLAN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("document", ("sentence", "long", "unicode", "empty")),
    ("query", ("question", "short", "code")),
)



@dataclass
class PairComparison:
    """One backend against the baseline (``first``), over every comparison batch."""

    first: str
    second: str
    worst_cosine: float
    max_abs_diff: float  # on ``embedding`` (L2-normalised), the output users consume
    passed: bool
    polygraphy_passed: bool
    outputs: dict[str, dict[str, float]] = field(default_factory=dict)
    worst_row: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    tolerance: dict[str, float] = field(default_factory=dict)  # this pair's bar (PAIR_TOLERANCES)

    @property
    def name(self) -> str:
        return f"{self.first} vs {self.second}"


@dataclass
class BackendComparison:
    """What :func:`compare_backends` found: each pair's numbers and verdicts, and what was skipped."""

    precision: str
    backends: list[str]
    pairs: list[PairComparison]
    skipped: dict[str, str]
    tolerance: dict[str, float]
    batches: int = 0
    rows: int = 0
    problems: list[str] = field(default_factory=list)
    #: the precision each backend reported it ran (OpenVINO's hint may run another), by name
    ran: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.pairs) and not self.problems and all(pair.passed for pair in self.pairs)

    def certificates(self) -> list[dict[str, Any]]:
        """A certificate (against the baseline) for every pair that passed: ``kvembed verify --record``."""
        from .certify import certificate

        return [certificate(pair.second, self.ran.get(pair.second, ""), pair, against=pair.first, extra={"rows": self.rows})
                for pair in self.pairs if pair.passed and pair.second in TARGET_NAMES]

    @property
    def polygraphy_passed(self) -> bool:
        return bool(self.pairs) and all(pair.polygraphy_passed for pair in self.pairs)

    @property
    def worst_cosine(self) -> float:
        return min((pair.worst_cosine for pair in self.pairs), default=1.0)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(passed=self.passed, polygraphy_passed=self.polygraphy_passed)
        return data

    def summary(self) -> str:
        state = "passed" if self.passed else "FAILED"
        pairs = "; ".join(
            f"{p.name}: worst cosine {p.worst_cosine:.7f}, max abs {p.max_abs_diff:.3g}" for p in self.pairs
        )
        text = f"backend comparison {state} ({self.precision}): {pairs or 'no pairs'}"
        if self.problems:
            text += "; " + "; ".join(self.problems)
        return text


@dataclass
class FeedBatch:
    """One comparison batch: its feed dict and which text each row holds."""

    kind: str
    padding_side: str
    names: tuple[str, ...]
    feed: dict[str, np.ndarray]



# -- inputs -------------------------------------------------------------------------------------


def comparison_feeds(
    directory: str | os.PathLike[str],
    manifest: Manifest | None = None,
    texts: Mapping[str, str] | None = None,
) -> list[FeedBatch]:
    """Padded batches of real token ids from the artifact's own text encoder (both padding sides).

    Default: :data:`COMPARE_PLAN` over :data:`~kvembed.export.gate.parity.PARITY_TEXTS` (short, long,
    unicode and empty texts, as documents and queries); with ``texts``, all of them as one batch
    per kind.
    """
    manifest = load_manifest(directory) if manifest is None else manifest
    encoder = encoder_from_manifest(directory, manifest)
    pool = dict(PARITY_TEXTS if texts is None else texts)
    plan = COMPARE_PLAN if texts is None else tuple((kind, tuple(pool)) for kind, _ in COMPARE_PLAN)
    inputs = manifest.input_names
    batches = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the long text may be truncated to max_length
        for kind, names in plan:
            names = tuple(n for n in names if n in pool)
            if not names or kind not in encoder.method.templates:
                continue
            encoded = encoder.encode([pool[n] for n in names], kind)
            for side in PADDING_SIDES:
                feed = encoder.pad(encoded, side)
                if inputs:
                    feed = {key: value for key, value in feed.items() if key in inputs}
                batches.append(FeedBatch(kind, side, names, feed))
    if not batches:
        raise InvalidInput("no comparison batches: no texts")
    return batches


# -- comparing ----------------------------------------------------------------------------------


def _compare_func(tolerance: BackendTolerance, atol: dict[str, float]) -> Any:
    """polygraphy's element-wise compare function (``SimpleCompareFunc``; ``CompareFunc.simple`` before it existed)."""
    from polygraphy import comparator

    simple = getattr(comparator, "SimpleCompareFunc", None)
    if simple is None:  # polygraphy < 0.50
        simple = comparator.CompareFunc.simple
    return simple(atol=atol, rtol=tolerance.rtol, check_shapes=True)


def compare_runners(
    runners: Sequence[Any],
    batches: Sequence[FeedBatch],
    tolerance: BackendTolerance,
    *,
    labels: Sequence[str] | None = None,
    failures: dict[str, BaseException] | None = None,
) -> list[PairComparison]:
    """Run every runner on ``batches`` (polygraphy's Comparator) and compare each with the first.

    Each runner runs on its own, so one that cannot build or run does not stop the others: with
    ``failures`` (a dict) its exception is recorded there under its label and the rest are
    compared; without, it propagates. No pairs when the first runner (the baseline) failed.
    """
    from polygraphy.comparator import Comparator, RunResults
    from polygraphy.logger import G_LOGGER

    labels = list(labels or [r.name for r in runners])
    feeds = [dict(b.feed) for b in batches]
    results = RunResults()
    kept: list[str] = []
    for runner, label in zip(runners, labels):
        try:
            with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
                run = Comparator.run([runner], data_loader=feeds)
        except Exception as err:
            if failures is None:
                raise
            failures[label] = err
            continue
        results.append(run[0])
        kept.append(label)
    if not kept or kept[0] != labels[0]:
        return []
    labels = kept
    base_iterations = results[0][1]
    # atol per output: as is for L2-normalised outputs, scaled by the largest row norm otherwise
    scales: dict[str, float] = {}  # polygraphy takes per-output tolerances, "" being the default
    for iteration in base_iterations:
        for key, value in iteration.items():
            arr = np.asarray(value, dtype=np.float64)
            scale = float(np.linalg.norm(arr, axis=-1).max()) if arr.ndim >= 2 and arr.size else float(np.abs(arr).max(initial=0.0))
            scales[key] = max(scales.get(key, 0.0), scale if np.isfinite(scale) else 1.0)
    pairs = []
    for index in range(1, len(labels)):
        bar = stacked(tolerance, PAIR_TOLERANCES[labels[index]]) if labels[index] in PAIR_TOLERANCES else tolerance
        atol = {key: bar.atol * scale for key, scale in scales.items()}
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
            verdict = bool(
                Comparator.compare_accuracy(results, comparisons=[(0, index)], compare_func=_compare_func(bar, atol))
            )
        pairs.append(_pair_numbers(labels[0], labels[index], base_iterations, results[index][1], batches, bar, verdict))
    return pairs


def _pair_numbers(
    first: str,
    second: str,
    ours: Sequence[Any],
    theirs: Sequence[Any],
    batches: Sequence[FeedBatch],
    tolerance: BackendTolerance,
    polygraphy_passed: bool,
) -> PairComparison:
    outputs: dict[str, dict[str, float]] = {}
    worst_cos, worst_row = 1.0, {}
    problems: list[str] = []
    for batch, a_iter, b_iter in zip(batches, ours, theirs):
        b_items = dict(b_iter.items())
        for key, a_value in a_iter.items():
            if key not in b_items:
                problems.append(f"{second} has no output {key!r}")
                continue
            a = np.asarray(a_value, dtype=np.float64)
            b = np.asarray(b_items[key], dtype=np.float64)
            stats = outputs.setdefault(key, {"worst_cosine": 1.0, "max_abs_diff": 0.0})
            if a.shape != b.shape:
                problems.append(f"output {key!r}: shape {a.shape} vs {b.shape}")
                stats["worst_cosine"] = -1.0
                continue
            if not (np.isfinite(a).all() and np.isfinite(b).all()):
                problems.append(f"output {key!r}: non-finite values ({batch.kind}/{batch.padding_side})")
            diff = np.abs(a - b)
            stats["max_abs_diff"] = max(stats["max_abs_diff"], float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0)))
            if a.ndim >= 2 and a.shape[0] == len(batch.names):
                cos = np.nan_to_num(cosine_rows(a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)), nan=-1.0)
                row = int(np.argmin(cos))
                stats["worst_cosine"] = min(stats["worst_cosine"], float(cos[row]))
                if float(cos[row]) < worst_cos:
                    worst_cos = float(cos[row])
                    worst_row = {"output": key, "text": batch.names[row], "kind": batch.kind,
                                 "padding_side": batch.padding_side, "batch_size": len(batch.names)}
    if not outputs:
        problems.append("no outputs compared")
    worst_cos = min([worst_cos] + [s["worst_cosine"] for s in outputs.values()])
    main = outputs.get("embedding") or next(iter(outputs.values()), {"max_abs_diff": float("inf")})
    problems = sorted(set(problems))
    passed = polygraphy_passed and not problems and worst_cos >= tolerance.min_cosine
    return PairComparison(
        first=first, second=second, worst_cosine=worst_cos, max_abs_diff=float(main["max_abs_diff"]),
        passed=bool(passed), polygraphy_passed=bool(polygraphy_passed), outputs=outputs,
        worst_row=worst_row, problems=problems, tolerance=asdict(tolerance),
    )


def _tolerance(precision: str, tolerance: BackendTolerance | None) -> BackendTolerance:
    if tolerance is not None:
        return tolerance
    if precision not in BACKEND_TOLERANCES:
        raise InvalidInput(f"precision must be one of {', '.join(BACKEND_TOLERANCES)}, got {precision!r}")
    return BACKEND_TOLERANCES[precision]


def compare_backends(
    directory: str | os.PathLike[str],
    backends: str | Sequence[str] = "auto",
    *,
    texts: Mapping[str, str] | None = None,
    tolerance: BackendTolerance | None = None,
) -> BackendComparison:
    """Run an artifact's ``model.onnx`` on ``backends`` (see :func:`resolve_backends`) and compare
    every backend with the first (``onnxruntime-cpu`` when present) on real token ids.

    With fewer than two backends the result has no pairs (``passed`` is False: nothing was
    compared). A backend that fails to build or run is a problem of the result, not an exception.
    """
    directory = Path(directory).expanduser()
    manifest = load_manifest(directory)
    model_path = directory / MODEL
    names, skipped = resolve_backends(directory, backends, manifest=manifest, model_path=model_path)
    precision = manifest.precision
    tol = _tolerance(manifest.graph_precision, tolerance)  # a bf16 artifact's graph is the fp32 one
    batches = comparison_feeds(directory, manifest, texts)
    comparison = BackendComparison(
        precision=precision, backends=names, pairs=[], skipped=skipped, tolerance=asdict(tol),
        batches=len(batches), rows=sum(len(b.names) for b in batches),
    )
    if len(names) < 2:
        return comparison
    feeds = [b.feed for b in batches]
    asked = {n.strip().lower() for n in (backends.split(",") if isinstance(backends, str) else backends)}
    asked |= {member for alias, members in TARGET_ALIASES.items() if alias in asked for member in members}
    failures: dict[str, BaseException] = {}
    runners, labels = [], []
    for name in names:
        try:
            graph = directory / manifest.graph_file(TARGETS[name].backend)  # an int8 artifact's OpenVINO graph
            runners.append(make_runner(name, graph, feeds=feeds, fp16=manifest.graph_precision == "fp16"))
            labels.append(name)
        except Exception as err:
            failures[name] = err
    if labels and labels[0] == names[0]:
        comparison.pairs = compare_runners(runners, batches, tol, labels=labels, failures=failures)
    comparison.ran = {label: precision_name(getattr(runner, "ran", manifest.graph_precision)) for runner, label in zip(runners, labels)}
    for name, err in failures.items():
        if isinstance(err, BackendUnavailableError) and name not in asked:  # auto picked it, it cannot start
            comparison.skipped[name] = str(err).split(": ", 1)[-1]
            comparison.backends.remove(name)
        else:  # a backend that cannot build or run: report it, do not crash verify
            comparison.problems.append(f"{name}: {_describe(err)}")
    return comparison


def compare_graphs(
    model_a: str | os.PathLike[str],
    model_b: str | os.PathLike[str],
    batches: Sequence[FeedBatch] | Sequence[Mapping[str, np.ndarray]],
    *,
    precision: str = "fp32",
    backend_a: str = CPU,
    backend_b: str = CPU,
    tolerance: BackendTolerance | None = None,
) -> BackendComparison:
    """The lower level: two ONNX files (each on a backend) on the same feeds, compared as
    :func:`compare_backends` compares backends. ``batches`` are :class:`FeedBatch` es (from
    :func:`comparison_feeds`) or plain feed dicts."""
    for backend in (backend_a, backend_b):
        if backend not in TARGET_NAMES:
            raise InvalidInput(with_hint(f"unknown backend {shown(backend)}; valid: {', '.join(TARGET_NAMES)}", backend, TARGET_NAMES))
    tol = _tolerance(precision, tolerance)
    items = [
        b if isinstance(b, FeedBatch)
        else FeedBatch("", "", tuple(str(i) for i in range(len(next(iter(b.values()))))), dict(b))
        for b in batches
    ]
    label_a, label_b = f"{backend_a}:{Path(model_a).parent.name or model_a}", f"{backend_b}:{Path(model_b).parent.name or model_b}"
    if label_a == label_b:
        label_a, label_b = label_a + "#a", label_b + "#b"
    feeds = [b.feed for b in items]
    comparison = BackendComparison(
        precision=precision, backends=[label_a, label_b], pairs=[], skipped={}, tolerance=asdict(tol),
        batches=len(items), rows=sum(len(b.names) for b in items),
    )
    failures: dict[str, BaseException] = {}
    try:
        runners = [
            make_runner(backend_a, model_a, feeds=feeds, fp16=precision == "fp16", name=label_a),
            make_runner(backend_b, model_b, feeds=feeds, fp16=precision == "fp16", name=label_b),
        ]
        comparison.pairs = compare_runners(runners, items, tol, failures=failures)
    except Exception as err:
        failures["setup"] = err
    comparison.problems.extend(f"{name}: {_describe(err)}" for name, err in failures.items())
    return comparison


def _describe(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    return f"{type(err).__name__}: {first[:300]}".strip(": ")


def describe_skipped(skipped: Mapping[str, str]) -> Iterable[str]:
    for name, reason in skipped.items():
        yield f"{name}: {reason}"


__all__ = [
    "BACKEND_TOLERANCES",
    "COMPARE_PLAN",
    "BackendComparison",
    "BackendTolerance",
    "FeedBatch",
    "PairComparison",
    "compare_backends",
    "compare_graphs",
    "compare_runners",
    "comparison_feeds",
    "resolve_backends",
]
