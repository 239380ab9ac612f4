"""The same artifact on every backend present: onnxruntime (CPU, CUDA, TensorRT EP), TensorRT, ONNX's reference.

``kvembed verify DIR`` checks an artifact against PyTorch (the parity gate, on onnxruntime's CPU
provider). This module checks the artifact's graph against *itself* on the other backends this
machine has, through polygraphy's :class:`~polygraphy.comparator.Comparator`:

- ``onnxruntime-cpu``: always (the baseline every other backend is compared with);
- ``onnxruntime-cuda`` / ``onnxruntime-tensorrt``: when onnxruntime reports the CUDA / TensorRT
  execution provider (onnxruntime-gpu, ``pip install 'kvembed[gpu]'``);
- ``tensorrt``: polygraphy's ``TrtRunner`` on an engine built from ``model.onnx``, when
  ``import tensorrt`` works (PyPI has only stubs: TensorRT comes from NVIDIA). Not for int8
  artifacts, whose ``DynamicQuantizeLinear``/``MatMulInteger`` TensorRT's parser rejects;
- ``openvino-f32`` / ``openvino-bf16``: OpenVINO's CPU plugin (the runtime's ``provider="openvino"``,
  :mod:`kvembed.runtime.openvino`) under the f32 and bf16 precision hints, when ``import openvino``
  works (``pip install 'kvembed[openvino]'``); ``openvino`` names both. ``auto`` runs bf16 only on
  CPUs that list BF16 (elsewhere OpenVINO would run f32 again: ask for it by name);
- ``onnx-reference``: ``onnx.reference.ReferenceEvaluator``, pure Python and slow, so ``auto``
  offers it only for models under 50 MB (ask for it by name otherwise). It is the independent
  one: it shares no kernel with onnxruntime. Three of its ops are replaced: ``GatherElements``
  (onnx's uses ``np.choose``, limited to 64 choices, so it fails past 64 tokens), and fp16
  ``MatMul`` / ``MatMulInteger`` routed through BLAS with identical results (10x faster).

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

Measured, onnxruntime-cpu vs onnx-reference on stories260k kv-embedding (max abs on ``embedding``,
worst cosine): fp32 3e-7, 1.0000000; fp16 8e-4, 0.999998; int8 8e-3, 0.99981.

Outputs that are not L2-normalised (``pooled``) get the same atol scaled by their largest row
norm, i.e. the tolerance is relative to the vectors' size, as it is for ``embedding``.
Polygraphy's verdict (element-wise: each element within atol *or* rtol) and our per-row cosine
(worst row over all outputs) must both pass.

Everything GPU and TensorRT is imported lazily and guarded: this module imports (and the CPU
backends run) without CUDA, onnxruntime-gpu or TensorRT.
"""

from __future__ import annotations

import importlib
import math
import os
import time
import warnings
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..artifact import MODEL, read_manifest
from ..runtime.artifact import encoder_from_manifest
from .parity import PADDING_SIDES, PARITY_TEXTS, cosine_rows

try:  # the export extra brings polygraphy; the module still imports without it
    from polygraphy.backend.base import BaseRunner as _BaseRunner

    POLYGRAPHY_ERROR: str | None = None
except ImportError as _err:  # pragma: no cover - only without the export extra
    _BaseRunner = object  # type: ignore[assignment,misc]
    POLYGRAPHY_ERROR = f"polygraphy is not installed (pip install 'kvembed[export]'): {_err}"

CPU, CUDA, ORT_TENSORRT, TENSORRT, OV_F32, OV_BF16, REFERENCE = (
    "onnxruntime-cpu", "onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt", "openvino-f32", "openvino-bf16",
    "onnx-reference",
)
#: every backend name, in the order they are run and reported (the first is the baseline)
BACKENDS: tuple[str, ...] = (CPU, CUDA, ORT_TENSORRT, TENSORRT, OV_F32, OV_BF16, REFERENCE)
#: names that stand for several backends
ALIASES: dict[str, tuple[str, ...]] = {"openvino": (OV_F32, OV_BF16)}
#: ``auto`` offers onnx-reference only below this model size (model.onnx + external data)
REFERENCE_AUTO_LIMIT = 50 * 1024 * 1024

GPU_HINT = "pip install 'kvembed[gpu]'"
TENSORRT_HINT = "install TensorRT from NVIDIA, https://developer.nvidia.com/tensorrt"
OPENVINO_HINT = "pip install 'kvembed[openvino]'"
_OPENVINO_PRECISION = {OV_F32: "f32", OV_BF16: "bf16"}

_ORT_PROVIDERS = {
    CPU: ["CPUExecutionProvider"],
    CUDA: ["CUDAExecutionProvider", "CPUExecutionProvider"],
    ORT_TENSORRT: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}


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
PAIR_TOLERANCES: dict[str, BackendTolerance] = {OV_BF16: BACKEND_TOLERANCES["fp16"]}


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


class BackendUnavailableError(ValueError):
    """A backend asked for by name is not present on this machine (the message says what to install)."""


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

    @property
    def passed(self) -> bool:
        return bool(self.pairs) and not self.problems and all(pair.passed for pair in self.pairs)

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


# -- what is present ----------------------------------------------------------------------------


def ort_providers() -> list[str]:
    try:
        import onnxruntime as ort

        return list(ort.get_available_providers())
    except Exception:  # pragma: no cover - onnxruntime is a hard dependency
        return []


def tensorrt_problem() -> str | None:
    """Why TensorRT cannot be used here, or None when ``import tensorrt`` gives a real TensorRT."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return f"not installed (pip has only stubs; {TENSORRT_HINT})"
    except Exception as err:  # a broken install (missing libnvinfer, CUDA driver)
        return f"import tensorrt failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); {TENSORRT_HINT}"
    if not hasattr(tensorrt, "Builder"):
        return f"the installed tensorrt package is a stub without TensorRT; {TENSORRT_HINT}"
    return None


def openvino_problem() -> str | None:
    """Why OpenVINO cannot be used here, or None."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return f"openvino is not installed ({OPENVINO_HINT})"
    except Exception as err:  # a broken install
        return f"import openvino failed ({type(err).__name__}); {OPENVINO_HINT}"
    return None


def cpu_has_bf16() -> bool:
    from ..runtime.openvino import default_precision, import_openvino

    return default_precision(import_openvino().Core()) == "bf16"


def model_bytes(path: str | os.PathLike[str]) -> int:
    """Size of an ONNX file plus its external data (``model.onnx.data``) if any."""
    path = Path(path)
    data = path.with_name(path.name + ".data")
    return sum(p.stat().st_size for p in (path, data) if p.is_file())


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB" if n < 1024 ** 3 else f"{n / 1024 ** 3:.1f} GB"


def backend_problems(manifest: Mapping[str, Any] | None = None) -> dict[str, str]:
    """``name -> why it cannot run here`` for every backend this machine lacks (absent ones only)."""
    problems: dict[str, str] = {}
    available = ort_providers()
    if "CUDAExecutionProvider" not in available:
        problems[CUDA] = f"this onnxruntime has no CUDAExecutionProvider ({GPU_HINT})"
    if "TensorrtExecutionProvider" not in available:
        problems[ORT_TENSORRT] = (
            f"this onnxruntime has no TensorrtExecutionProvider ({GPU_HINT}, plus TensorRT's libraries from NVIDIA)"
        )
    graph = (manifest or {}).get("graph", {})
    trt = tensorrt_problem()
    if trt is not None:
        problems[TENSORRT] = trt
    elif graph and not graph.get("tensorrt_ready", True):
        ops = ", ".join(graph.get("non_portable_ops", [])) or "non-portable ops"
        problems[TENSORRT] = f"TensorRT's parser does not take this graph ({ops}); export fp32 or fp16 for TensorRT"
    openvino = openvino_problem()
    if openvino is not None:
        problems[OV_F32] = problems[OV_BF16] = openvino
    if POLYGRAPHY_ERROR is not None:
        for name in BACKENDS:
            problems.setdefault(name, POLYGRAPHY_ERROR)
    try:
        importlib.import_module("onnx.reference")
    except ImportError:
        problems[REFERENCE] = "onnx is not installed (pip install 'kvembed[export]')"
    return problems


def resolve_backends(
    directory: str | os.PathLike[str] | None = None,
    backends: str | Sequence[str] = "auto",
    *,
    manifest: Mapping[str, Any] | None = None,
    model_path: str | os.PathLike[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The backends to compare and ``{skipped backend: reason}``.

    ``backends`` is ``"auto"`` (every present backend; onnx-reference only for models under
    50 MB), a comma list of names, or a sequence; ``auto`` may be combined with names
    (``"auto,onnx-reference"``). Unknown names raise ValueError naming the valid ones; a backend
    asked for by name that this machine lacks raises :class:`BackendUnavailableError` saying what
    to install. Skipped backends (with reasons) are reported only for ``auto``.
    """
    if directory is not None:
        manifest = read_manifest(directory) if manifest is None else manifest
        model_path = Path(directory) / MODEL if model_path is None else model_path
    if model_path is None:
        raise ValueError("give an artifact directory or a model path")
    names = [n.strip().lower() for n in (backends.split(",") if isinstance(backends, str) else backends)]
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"--backends is empty; give 'auto' or a comma list of {', '.join(BACKENDS)}")
    unknown = [n for n in names if n != "auto" and n not in BACKENDS and n not in ALIASES]
    if unknown:
        raise ValueError(
            f"unknown backend{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"valid: auto, {', '.join(BACKENDS)}, {', '.join(ALIASES)}"
        )
    names = [member for n in names for member in ALIASES.get(n, (n,))]
    problems = backend_problems(manifest)
    chosen: set[str] = set()
    skipped: dict[str, str] = {}
    if "auto" in names:
        size = model_bytes(model_path)
        for name in BACKENDS:
            if name in problems:
                skipped[name] = problems[name]
            elif name == REFERENCE and size >= REFERENCE_AUTO_LIMIT and REFERENCE not in names:
                skipped[name] = (
                    f"model is {_mb(size)} (auto takes it below {_mb(REFERENCE_AUTO_LIMIT)}: pure Python is slow); "
                    f"ask for it with --backends auto,{REFERENCE}"
                )
            elif name == OV_BF16 and OV_BF16 not in names and not cpu_has_bf16():
                skipped[name] = f"this CPU has no BF16 (OpenVINO would run f32 again); ask for it with --backends auto,{OV_BF16}"
            else:
                chosen.add(name)
    for name in names:
        if name == "auto":
            continue
        if name in problems:
            raise BackendUnavailableError(f"backend {name} is not available here: {problems[name]}")
        chosen.add(name)
        skipped.pop(name, None)
    if CPU not in problems:  # the baseline every backend is compared with, asked for or not
        chosen.add(CPU)
    return [name for name in BACKENDS if name in chosen], skipped


# -- runners ------------------------------------------------------------------------------------


def _gather_elements_op() -> Any:
    """``GatherElements`` for the reference evaluator via ``np.take_along_axis``.

    onnx's own implementation goes through ``np.choose``, which takes at most 64 choices, so it
    fails on any gather over an axis longer than 64 (here: a sequence of 65+ tokens).
    """
    from onnx.reference.op_run import OpRun

    class GatherElements(OpRun):
        op_domain = ""

        def _run(self, data: np.ndarray, indices: np.ndarray, axis: int | None = None) -> tuple[np.ndarray]:
            axis = int(axis or 0) % data.ndim
            index = np.where(indices < 0, indices + data.shape[axis], indices)
            cut = tuple(slice(None) if i == axis else slice(0, n) for i, n in enumerate(index.shape))
            return (np.take_along_axis(data[cut], index, axis=axis),)

    return GatherElements


def _matmul_op() -> Any:
    """``MatMul`` for the reference evaluator: fp16 operands multiplied in fp32 (BLAS) and rounded back.

    numpy's own fp16 matmul already accumulates in fp32 (as onnxruntime and GPUs do) but without
    BLAS, about 10x slower; this gives the same values at fp32 speed. Other dtypes are unchanged.
    """
    from onnx.reference.op_run import OpRun

    class MatMul(OpRun):
        op_domain = ""

        def _run(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
            if a.dtype == np.float16 and b.dtype == np.float16:
                return (np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16),)
            return (np.matmul(a, b),)

    return MatMul


def _matmul_integer_op() -> Any:
    """``MatMulInteger`` (int8 artifacts) for the reference evaluator: the same integers, through BLAS.

    onnx's implementation multiplies int32 arrays, which numpy does without BLAS (minutes for a
    mid-sized model). Products of 8-bit values summed in float64 stay exact integers (< 2**53),
    so this is bit-identical, only faster.
    """
    from onnx.reference.op_run import OpRun

    class MatMulInteger(OpRun):
        op_domain = ""

        def _run(self, a: np.ndarray, b: np.ndarray, a_zero_point: Any = None, b_zero_point: Any = None) -> tuple[np.ndarray]:
            a64 = a.astype(np.float64) - (0.0 if a_zero_point is None else np.asarray(a_zero_point, np.float64))
            b64 = b.astype(np.float64) - (0.0 if b_zero_point is None else np.asarray(b_zero_point, np.float64))
            return (np.rint(np.matmul(a64, b64)).astype(np.int32),)

    return MatMulInteger


class OnnxReferenceRunner(_BaseRunner):  # type: ignore[misc,valid-type]
    """A polygraphy runner around ``onnx.reference.ReferenceEvaluator`` (pure Python, no kernels shared
    with onnxruntime or TensorRT; slow: meant for small models)."""

    def __init__(self, model_path: str | os.PathLike[str], name: str | None = None) -> None:
        if POLYGRAPHY_ERROR is not None:
            raise ImportError(POLYGRAPHY_ERROR)
        super().__init__(name=name, prefix="onnx-reference-runner")
        self.model_path = str(model_path)

    def activate_impl(self) -> None:
        import onnx
        from onnx.reference import ReferenceEvaluator

        model = onnx.load(self.model_path)  # loads model.onnx.data beside it too
        initializers = {init.name for init in model.graph.initializer}
        self._inputs = []
        for value in model.graph.input:
            if value.name in initializers:
                continue
            tensor = value.type.tensor_type
            shape = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
            self._inputs.append((value.name, onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type), shape))
        self._evaluator = ReferenceEvaluator(model, new_ops=[_gather_elements_op(), _matmul_op(), _matmul_integer_op()])
        self._outputs = list(self._evaluator.output_names)

    def get_input_metadata_impl(self) -> Any:
        from polygraphy.common import TensorMetadata

        meta = TensorMetadata()
        for name, dtype, shape in self._inputs:
            meta.add(name, dtype=dtype, shape=shape)
        return meta

    def infer_impl(self, feed_dict: Mapping[str, Any]) -> "OrderedDict[str, np.ndarray]":
        feeds = {name: np.asarray(feed_dict[name]) for name, _, _ in self._inputs}
        start = time.perf_counter()
        outputs = self._evaluator.run(None, feeds)
        self.inference_time = time.perf_counter() - start
        return OrderedDict((name, np.asarray(out)) for name, out in zip(self._outputs, outputs))

    def deactivate_impl(self) -> None:
        del self._evaluator, self._inputs, self._outputs


class OpenVINORunner(_BaseRunner):  # type: ignore[misc,valid-type]
    """A polygraphy runner around the runtime's :class:`~kvembed.runtime.openvino.OpenVINOSession`
    (polygraphy has no OpenVINO runner): the very session ``provider="openvino"`` runs."""

    def __init__(self, model_path: str | os.PathLike[str], precision: str, name: str | None = None) -> None:
        if POLYGRAPHY_ERROR is not None:
            raise ImportError(POLYGRAPHY_ERROR)
        super().__init__(name=name, prefix=f"openvino-{precision}-runner")
        self.model_path, self.precision = str(model_path), precision

    def activate_impl(self) -> None:
        from ..runtime.openvino import OpenVINOSession

        self._session = OpenVINOSession(self.model_path, precision=self.precision)
        self._outputs = [port.get_any_name() for port in self._session.compiled.outputs]

    def get_input_metadata_impl(self) -> Any:
        from polygraphy.common import TensorMetadata

        meta = TensorMetadata()
        for port in self._session.compiled.inputs:
            shape = [d.get_length() if d.is_static else None for d in port.get_partial_shape()]
            meta.add(port.get_any_name(), dtype=np.dtype(port.get_element_type().to_dtype()), shape=shape)
        return meta

    def infer_impl(self, feed_dict: Mapping[str, Any]) -> "OrderedDict[str, np.ndarray]":
        start = time.perf_counter()
        outputs = self._session.run(self._outputs, {name: np.asarray(value) for name, value in feed_dict.items()})
        self.inference_time = time.perf_counter() - start
        return OrderedDict(zip(self._outputs, outputs))

    def deactivate_impl(self) -> None:
        del self._session, self._outputs


def make_runner(
    backend: str,
    model_path: str | os.PathLike[str],
    *,
    feeds: Sequence[Mapping[str, np.ndarray]] = (),
    fp16: bool = False,
    name: str | None = None,
) -> Any:
    """A polygraphy runner running ``model_path`` on ``backend`` (not activated: Comparator does that).

    ``feeds`` sizes TensorRT's optimisation profile (min 1 per dimension, opt = max = the largest
    feed); ``fp16`` lets TensorRT pick fp16 kernels (for fp16 artifacts).
    """
    if POLYGRAPHY_ERROR is not None:
        raise ImportError(POLYGRAPHY_ERROR)
    path = str(model_path)
    name = name or backend
    if backend in _ORT_PROVIDERS:
        from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

        providers = _ORT_PROVIDERS[backend]
        loader = SessionFromOnnx(path, providers=providers)

        def session() -> Any:  # onnxruntime falls back to the CPU silently: do not compare CPU with CPU
            sess = loader()
            if sess.get_providers()[0] != providers[0]:
                raise BackendUnavailableError(
                    f"{backend}: onnxruntime could not start {providers[0]} (it fell back to {sess.get_providers()[0]}); "
                    f"check the CUDA/TensorRT libraries ({GPU_HINT})"
                )
            return sess

        return OnnxrtRunner(session, name=name)
    if backend == TENSORRT:
        problem = tensorrt_problem()
        if problem is not None:
            raise BackendUnavailableError(f"backend tensorrt is not available here: {problem}")
        from polygraphy.backend.trt import CreateConfig, EngineFromNetwork, NetworkFromOnnxPath, Profile, TrtRunner

        shapes: dict[str, tuple[int, ...]] = {}
        for feed in feeds:
            for key, value in feed.items():
                old = shapes.get(key, (0,) * np.ndim(value))
                shapes[key] = tuple(max(a, b) for a, b in zip(old, np.shape(value)))
        if not shapes:
            raise ValueError("tensorrt needs the feeds to size its optimisation profile")
        from polygraphy.logger import G_LOGGER

        profile = Profile()
        for key, biggest in shapes.items():
            profile.add(key, min=tuple(1 for _ in biggest), opt=biggest, max=biggest)
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL):  # CreateConfig logs a TF32 note; TF32 stays off (fp32 is fp32)
            config = CreateConfig(fp16=fp16, profiles=[profile])
            engine = EngineFromNetwork(NetworkFromOnnxPath(path), config=config)
        return TrtRunner(engine, name=name)
    if backend in _OPENVINO_PRECISION:
        problem = openvino_problem()
        if problem is not None:
            raise BackendUnavailableError(f"backend {backend} is not available here: {problem}")
        return OpenVINORunner(path, _OPENVINO_PRECISION[backend], name=name)
    if backend == REFERENCE:
        return OnnxReferenceRunner(path, name=name)
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


# -- inputs -------------------------------------------------------------------------------------


def comparison_feeds(
    directory: str | os.PathLike[str],
    manifest: Mapping[str, Any] | None = None,
    texts: Mapping[str, str] | None = None,
) -> list[FeedBatch]:
    """Padded batches of real token ids from the artifact's own text encoder (both padding sides).

    Default: :data:`COMPARE_PLAN` over :data:`~kvembed.export.parity.PARITY_TEXTS` (short, long,
    unicode and empty texts, as documents and queries); with ``texts``, all of them as one batch
    per kind.
    """
    manifest = read_manifest(directory) if manifest is None else manifest
    encoder = encoder_from_manifest(directory, manifest)
    pool = dict(PARITY_TEXTS if texts is None else texts)
    plan = COMPARE_PLAN if texts is None else tuple((kind, tuple(pool)) for kind, _ in COMPARE_PLAN)
    inputs = [item["name"] for item in manifest.get("inputs", [])]
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
        raise ValueError("no comparison batches: no texts")
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
        raise ValueError(f"precision must be one of {', '.join(BACKEND_TOLERANCES)}, got {precision!r}")
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
    manifest = read_manifest(directory)
    model_path = directory / MODEL
    names, skipped = resolve_backends(directory, backends, manifest=manifest, model_path=model_path)
    precision = str(manifest["precision"])
    tol = _tolerance(precision, tolerance)
    batches = comparison_feeds(directory, manifest, texts)
    comparison = BackendComparison(
        precision=precision, backends=names, pairs=[], skipped=skipped, tolerance=asdict(tol),
        batches=len(batches), rows=sum(len(b.names) for b in batches),
    )
    if len(names) < 2:
        return comparison
    feeds = [b.feed for b in batches]
    asked = {n.strip().lower() for n in (backends.split(",") if isinstance(backends, str) else backends)}
    asked |= {member for alias, members in ALIASES.items() if alias in asked for member in members}
    failures: dict[str, BaseException] = {}
    runners, labels = [], []
    for name in names:
        try:
            runners.append(make_runner(name, model_path, feeds=feeds, fp16=precision == "fp16"))
            labels.append(name)
        except Exception as err:
            failures[name] = err
    if labels and labels[0] == names[0]:
        comparison.pairs = compare_runners(runners, batches, tol, labels=labels, failures=failures)
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
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
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
    "BACKENDS",
    "BACKEND_TOLERANCES",
    "COMPARE_PLAN",
    "REFERENCE_AUTO_LIMIT",
    "BackendComparison",
    "BackendTolerance",
    "BackendUnavailableError",
    "FeedBatch",
    "OnnxReferenceRunner",
    "PairComparison",
    "backend_problems",
    "compare_backends",
    "compare_graphs",
    "compare_runners",
    "comparison_feeds",
    "make_runner",
    "resolve_backends",
    "tensorrt_problem",
]
