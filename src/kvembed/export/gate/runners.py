"""polygraphy runners for ``kvembed verify --backends``: the graph on each verify target of
:mod:`kvembed.export.gate.targets` (onnxruntime's providers, TensorRT, OpenVINO, ONNX's reference).

polygraphy has runners for onnxruntime and TensorRT; OpenVINO and ``onnx.reference`` get theirs
here. The reference evaluator is the independent one (it shares no kernel with onnxruntime), and
three of its ops are replaced: ``GatherElements`` (onnx's uses ``np.choose``, limited to 64
choices, so it fails past 64 tokens), and fp16 ``MatMul`` / ``MatMulInteger`` routed through BLAS
with identical results, only faster. Everything GPU and TensorRT is imported lazily and guarded:
this module imports (and the CPU targets run) without CUDA, onnxruntime-gpu or TensorRT.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np

from ...artifact import Manifest
from .targets import (
    CPU, CUDA, ORT_TENSORRT, REFERENCE, TENSORRT, TARGET_NAMES, TARGETS, resolve_targets, target_problems,
)
from ...artifact.external_data import load_with_weights
from ...backends.catalogue import BACKENDS, open_target, target_problem
from ...backends.targets import openvino_target
from ...backends.protocol import BackendUnavailableError
from ...errors import InvalidInput, shown, with_hint
from ...extras import install_hint

try:  # the export extra brings polygraphy; the module still imports without it
    from polygraphy.backend.base import BaseRunner as _BaseRunner

    POLYGRAPHY_ERROR: str | None = None
except ImportError as _err:  # pragma: no cover - only without the export extra
    _BaseRunner = object  # type: ignore[assignment,misc]
    POLYGRAPHY_ERROR = f"polygraphy is not installed ({install_hint('export')}): {_err}"

#: the onnxruntime targets polygraphy's own onnxruntime runner runs (the backend's provider chains)
_ORT_TARGETS = (CPU, CUDA, ORT_TENSORRT)
GPU_HINT = install_hint("gpu")


def backend_problems(manifest: Manifest | None = None) -> dict[str, str]:
    """``name -> why it cannot run here``: the catalogue's absent targets, and every target when
    polygraphy (which runs them all) is missing."""
    problems = target_problems(manifest)
    if POLYGRAPHY_ERROR is not None:
        for name in TARGET_NAMES:
            problems.setdefault(name, POLYGRAPHY_ERROR)
    return problems


def resolve_backends(
    directory: str | os.PathLike[str] | None = None,
    backends: str | Sequence[str] = "auto",
    *,
    manifest: Manifest | None = None,
    model_path: str | os.PathLike[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The targets to compare and ``{skipped target: reason}``
    (:func:`~kvembed.export.gate.targets.resolve_targets`, with :func:`backend_problems`)."""
    if directory is not None and manifest is None:
        from ...artifact import load_manifest

        manifest = load_manifest(directory)
    return resolve_targets(directory, backends, manifest=manifest, model_path=model_path,
                                   problems=backend_problems(manifest))


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
    BLAS, far slower; this gives the same values at fp32 speed. Other dtypes are unchanged.
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

        model = load_with_weights(self.model_path)  # model.onnx.data beside it too
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
    """A polygraphy runner around the runtime's :class:`~kvembed.backends.openvino.OpenVINOSession`
    (polygraphy has no OpenVINO runner): the very session ``provider="openvino"`` runs."""

    def __init__(self, model_path: str | os.PathLike[str], precision: str, name: str | None = None) -> None:
        if POLYGRAPHY_ERROR is not None:
            raise ImportError(POLYGRAPHY_ERROR)
        super().__init__(name=name, prefix=f"openvino-{precision}-runner")
        self.model_path, self.precision = str(model_path), precision

    def activate_impl(self) -> None:
        self._session = open_target(openvino_target(self.precision), self.model_path)
        self.ran = self._session.precision  # what OpenVINO runs (bf16 on a CPU without BF16 runs f32)
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
        outputs = self._session.run({name: np.asarray(value) for name, value in feed_dict.items()}, self._outputs)
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
    if backend in _ORT_TARGETS:
        from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

        providers = BACKENDS["onnxruntime"].load().provider_chain(TARGETS[backend].setting)
        first = providers[0] if isinstance(providers[0], str) else providers[0][0]
        loader = SessionFromOnnx(path, providers=providers)

        def session() -> Any:  # onnxruntime falls back to the CPU silently: do not compare CPU with CPU
            sess = loader()
            if sess.get_providers()[0] != first:
                raise BackendUnavailableError(
                    f"{backend}: onnxruntime could not start {first} (it fell back to {sess.get_providers()[0]}); "
                    f"check the CUDA/TensorRT libraries ({GPU_HINT})"
                )
            return sess

        return OnnxrtRunner(session, name=name)
    if backend == TENSORRT:
        problem = target_problem(TENSORRT)
        if problem is not None:
            raise BackendUnavailableError(f"backend tensorrt is not available here: {problem}")
        from polygraphy.backend.trt import CreateConfig, EngineFromNetwork, NetworkFromOnnxPath, Profile, TrtRunner

        shapes: dict[str, tuple[int, ...]] = {}
        for feed in feeds:
            for key, value in feed.items():
                old = shapes.get(key, (0,) * np.ndim(value))
                shapes[key] = tuple(max(a, b) for a, b in zip(old, np.shape(value)))
        if not shapes:
            raise InvalidInput("tensorrt needs the feeds to size its optimisation profile")
        from polygraphy.logger import G_LOGGER

        profile = Profile()
        for key, biggest in shapes.items():
            profile.add(key, min=tuple(1 for _ in biggest), opt=biggest, max=biggest)
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL):  # CreateConfig logs a TF32 note; TF32 stays off (fp32 is fp32)
            config = CreateConfig(fp16=fp16, profiles=[profile])
            engine = EngineFromNetwork(NetworkFromOnnxPath(path), config=config)
        return TrtRunner(engine, name=name)
    target = TARGETS.get(backend)
    if target is not None and target.backend == "openvino":
        problem = target_problem(backend)
        if problem is not None:
            raise BackendUnavailableError(f"backend {backend} is not available here: {problem}")
        return OpenVINORunner(path, target.setting, name=name)
    if backend == REFERENCE:
        return OnnxReferenceRunner(path, name=name)
    raise InvalidInput(with_hint(f"unknown backend {shown(backend)}; valid: {', '.join(TARGET_NAMES)}", backend, TARGET_NAMES))
