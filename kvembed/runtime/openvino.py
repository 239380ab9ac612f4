"""OpenVINO backend: runs an artifact's ``model.onnx`` with OpenVINO's CPU plugin instead of onnxruntime.

``openvino`` is optional (``pip install 'kvembed[openvino]'``) and imported only when a session is
made, so the runtime imports without it. :class:`OpenVINOSession` offers exactly what
:class:`~kvembed.runtime.embedder.Embedder` uses of an onnxruntime session: ``get_inputs()``,
``get_providers()`` and ``run(output_names, feeds)``. Dynamic batch and sequence dimensions stay
dynamic (the model is compiled as exported, never reshaped).

OpenVINO 2026.4's ONNX frontend reads the opset-23 ``Attention`` op but gives its output the head
count of K/V, so grouped-query graphs (fewer K/V heads than query heads: every modern LLM) fail to
compile. :func:`repeat_kv_heads` mends the model OpenVINO read, before compiling: each attention
node gets K and V with their heads repeated to the query's count, which is what grouped-query
attention means, so the function is unchanged and OpenVINO compiles it. (Rewriting the ONNX graph
instead would not do: OpenVINO refuses external data outside the directory of the graph it reads.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import MissingDependency

OPENVINO = "OpenVINO"
PRECISIONS = ("f32", "bf16")
INSTALL = "pip install 'kvembed[openvino]'"


class _Input(NamedTuple):
    name: str


def import_openvino() -> Any:
    try:
        import openvino
    except ImportError as err:
        raise MissingDependency(f"provider 'openvino' needs the openvino package: {INSTALL} ({err})") from None
    return openvino


def repeat_kv_heads(model: Any) -> int:
    """Give every ``ScaledDotProductAttention`` of ``model`` (an ``openvino.Model`` read from ONNX,
    changed in place) K and V with as many heads as Q; return how many nodes were changed.

    [B, Hkv, S, D] -> Unsqueeze(2) -> Broadcast [B, Hkv, Hq/Hkv, S, D] -> Reshape [B, Hq, S, D]:
    head ``h`` of the result is K/V head ``h // (Hq/Hkv)``, the grouping of grouped-query
    attention. Head counts are read at run time (Q's is dynamic after the ONNX frontend); where
    they are equal the group is 1 and the result is K/V unchanged. Nodes of another rank are left."""
    from openvino import opset13 as ops

    def pick(shape: Any, *dims: int) -> Any:
        return ops.gather(shape, ops.constant(np.array(dims, dtype=np.int64)), ops.constant(np.int64(0)))

    changed = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "ScaledDotProductAttention":
            continue
        ranks = [node.input_value(i).get_partial_shape().rank for i in range(3)]
        if not all(rank.is_static and rank.get_length() == 4 for rank in ranks):
            continue
        q_heads = pick(ops.shape_of(node.input_value(0)), 1)
        for slot in (1, 2):
            source = node.input_value(slot)
            shape = ops.shape_of(source)
            group = ops.divide(q_heads, pick(shape, 1))
            grouped = ops.concat([pick(shape, 0, 1), group, pick(shape, 2, 3)], 0)
            repeated = ops.concat([pick(shape, 0), q_heads, pick(shape, 2, 3)], 0)
            widened = ops.broadcast(ops.unsqueeze(source, ops.constant(np.int64(2))), grouped)
            node.input(slot).replace_source_output(ops.reshape(widened, repeated, special_zero=False).output(0))
        changed += 1
    if changed:
        model.validate_nodes_and_infer_types()
    return changed


def default_precision(core: Any) -> str:
    """``"bf16"`` when the CPU plugin lists BF16 among its optimisation capabilities, else ``"f32"``."""
    try:
        capabilities = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except Exception:  # an old or unusual plugin: the safe choice
        return "f32"
    return "bf16" if "BF16" in [str(c).upper() for c in capabilities] else "f32"


class OpenVINOSession:
    """A model compiled for OpenVINO's CPU device, used like an onnxruntime session.

    ``precision``: ``INFERENCE_PRECISION_HINT`` (``"f32"`` or ``"bf16"``; None = bf16 only where
    the CPU has it). ``threads``: ``INFERENCE_NUM_THREADS`` (None = OpenVINO's choice).
    ``cache_dir``: OpenVINO's ``CACHE_DIR`` for compiled blobs (None = no cache). Each :meth:`run`
    makes its own infer request, so concurrent calls from several threads are safe.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        threads: int | None = None,
        precision: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if precision is not None and precision not in PRECISIONS:
            raise ValueError(f"ov_precision must be one of {', '.join(PRECISIONS)} (or None for automatic), got {precision!r}")
        if threads is not None and int(threads) < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        ov = import_openvino()
        core = ov.Core()
        self.precision = precision or default_precision(core)
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": self.precision}
        if threads is not None:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            config["CACHE_DIR"] = str(cache_dir)
        self.model_path = Path(model_path)
        try:
            model = core.read_model(str(self.model_path))
            repeat_kv_heads(model)
            self.compiled = core.compile_model(model, "CPU", config)
        except RuntimeError as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            detail = (lines[-1] if lines else type(err).__name__)[:300]  # OpenVINO puts the cause last
            raise ValueError(
                f"OpenVINO cannot compile {self.model_path} ({detail}); if the file is damaged re-export it, "
                "else run it with provider='cpu' (onnxruntime)"
            ) from err
        self._inputs = [_Input(port.get_any_name()) for port in self.compiled.inputs]

    def get_inputs(self) -> list[_Input]:
        return list(self._inputs)

    def get_providers(self) -> list[str]:
        return [OPENVINO, self.precision]

    def run(self, output_names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        request = self.compiled.create_infer_request()  # one per call: concurrent runs share nothing
        request.infer({name: np.ascontiguousarray(array) for name, array in feeds.items()})
        return [np.array(request.get_tensor(name).data, copy=True) for name in output_names]


def create_session(
    model_path: str | os.PathLike[str],
    threads: int | None = None,
    precision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> OpenVINOSession:
    return OpenVINOSession(model_path, threads, precision, cache_dir)
