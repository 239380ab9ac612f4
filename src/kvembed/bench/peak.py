"""How close to the machine's limit a cell runs: this CPU's GEMM peak for the arithmetic the cell
ran, and the model's FLOPs.

The peak is *measured*, not looked up: square MatMuls of a few sides with the same thread count the
benchmark uses (the best side, the best of a few runs), in the library and precision the cell ran (:data:`PROBES`:
onnxruntime's fp32 MatMul and its int8 MatMulInteger, OpenVINO's MatMul under the bf16 and f32
hints). Dividing a cell's achieved FLOP/s by it says how much of what those kernels can do on this
machine the embedding graph gets.

FLOPs of one batch (multiply-add = 2 FLOPs), counting only real (non-padding) tokens:

- linear layers: ``2 x P x tokens``, where ``P`` is the number of weights the graph multiplies
  by (2-D initializers feeding MatMul / MatMulInteger / Gemm nodes: every projection of every
  decoder layer the method runs, not the token embedding table, which is a lookup);
- attention: per row of ``L`` tokens and per layer run, ``QK^T`` and ``AV`` are
  ``2 x 2 x heads x head_dim x L^2``. The **full** square is counted, not the causal half: the
  graph computes every score and masks it, it does not skip the upper triangle.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..artifact import MODEL, Manifest
from ..artifact.external_data import read_values
from ..errors import InvalidInput

MATMUL_OPS = ("MatMul", "MatMulInteger", "Gemm")


# -- the machine --------------------------------------------------------------------------------


def matmuls_call(
    weights: Sequence[np.ndarray], rows: int, threads: int, name: str
) -> tuple[Callable[[], Any], float]:
    """One onnxruntime session of independent ``[rows, K] @ W`` MatMuls, one per weight, as a
    no-argument call, and its FLOPs. The weights are initializers, as in a model (onnxruntime
    pre-packs them); the session has the runtime's own options and ``threads`` intra-op threads."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from ..backends.catalogue import BACKENDS

    session_options = BACKENDS["onnxruntime"].load().session_options

    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if not weights:
        raise ValueError("no weights to multiply by")
    widths = sorted({int(w.shape[0]) for w in weights})
    nodes, outputs, initializers = [], [], []
    for i, weight in enumerate(weights):
        initializers.append(numpy_helper.from_array(np.ascontiguousarray(weight, dtype=np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"x{weight.shape[0]}", f"w{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [rows, int(weight.shape[1])]))
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [rows, k]) for k in widths]
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, initializers),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = min(model.ir_version, 9)  # readable by older onnxruntime builds too
    session = ort.InferenceSession(
        model.SerializeToString(), sess_options=session_options(threads), providers=["CPUExecutionProvider"]
    )
    rng = np.random.default_rng(0)
    feed = {f"x{k}": rng.standard_normal((rows, k), dtype=np.float32) for k in widths}
    flops = 2.0 * rows * sum(int(w.shape[0]) * int(w.shape[1]) for w in weights)
    return (lambda: session.run(None, feed)), flops


def gemm_call(threads: int, size: int = 2048) -> tuple[Callable[[], Any], float]:
    """A ``size x size @ size x size`` onnxruntime fp32 MatMul as a no-argument call, and its FLOPs.

    Benchmarks that compare against the peak interleave this call with the model's (the machine
    is noisy).
    """
    if size < 1:
        raise InvalidInput(f"size must be >= 1, got {size}")
    weight = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
    return matmuls_call([weight], size, threads, "gemm_peak")


def weight_gemms_call(
    model_path: str | os.PathLike[str], tokens: int, threads: int
) -> tuple[Callable[[], Any], float]:
    """The graph's fp32 weight MatMuls alone (:func:`fp32_matmul_weights`), each on ``tokens``
    rows, as one onnxruntime call, and its FLOPs.

    What a call of ``tokens`` tokens would cost if everything but its weight GEMMs (attention,
    norms, RoPE, the framework's per-node work) were free, with onnxruntime's own kernels at that
    row count: a tighter floor than the large-GEMM peak, because small-M GEMMs run below it.
    """
    return matmuls_call(fp32_matmul_weights(model_path), tokens, threads, "weight_gemms")


def int8_gemm_call(threads: int, size: int = 2048) -> tuple[Callable[[], Any], float]:
    """A ``size x size`` uint8 ``@`` int8 onnxruntime MatMulInteger (int32 sums: the integer kernel
    the dynamic int8 recipes' graphs run) as a no-argument call, and its multiply-add FLOPs."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from ..backends.catalogue import BACKENDS

    if size < 1:
        raise InvalidInput(f"size must be >= 1, got {size}")
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array(rng.integers(-127, 128, (size, size), dtype=np.int8), "w")
    node = helper.make_node("MatMulInteger", ["x", "w"], ["y"])
    graph = helper.make_graph([node], "int8_gemm_peak", [helper.make_tensor_value_info("x", TensorProto.UINT8, [size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [size, size])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = min(model.ir_version, 9)
    options = BACKENDS["onnxruntime"].load().session_options(threads)
    session = ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])
    feed = {"x": rng.integers(0, 256, (size, size), dtype=np.uint8)}
    return (lambda: session.run(None, feed)), 2.0 * size ** 3


def openvino_gemm_call(threads: int, size: int = 2048, hint: str = "bf16") -> tuple[Callable[[], Any], float]:
    """A ``size x size`` fp32 MatMul compiled by OpenVINO's CPU plugin under precision hint ``hint``
    (``bf16``: AMX tiles or AVX-512 BF16 where the CPU has them; ``f32``) with ``threads``
    inference threads, as a no-argument call, and its FLOPs."""
    import openvino as ov
    from openvino import opset13 as ops

    if size < 1:
        raise InvalidInput(f"size must be >= 1, got {size}")
    rng = np.random.default_rng(1)
    x = ops.parameter([size, size], np.float32, name="x")
    product = ops.matmul(x, ops.constant(rng.standard_normal((size, size), dtype=np.float32)), False, False)
    model = ov.Model([product], [x], "openvino_gemm_peak")
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": int(threads)})
    request = compiled.create_infer_request()
    feed = {0: rng.standard_normal((size, size), dtype=np.float32)}
    return (lambda: request.infer(feed)), 2.0 * size ** 3


#: the GEMM probes, by what a cell ran: (library, arithmetic) -> (its call, what it is in words)
PROBES: dict[str, tuple[Callable[..., tuple[Callable[[], Any], float]], str]] = {
    "onnxruntime fp32": (gemm_call, "onnxruntime fp32 MatMul"),
    "onnxruntime int8": (int8_gemm_call, "onnxruntime uint8 x int8 MatMulInteger"),
    "openvino bf16": (lambda threads, size: openvino_gemm_call(threads, size, "bf16"), "OpenVINO MatMul under the bf16 hint"),
    "openvino f32": (lambda threads, size: openvino_gemm_call(threads, size, "f32"), "OpenVINO MatMul under the f32 hint"),
}


def probe_for(backend: str, precision: str, weight_only: bool = False) -> str:
    """The probe (:data:`PROBES`) of the arithmetic a bench cell ran: its backend (``runtime``,
    ``torch``, ``openvino``, ``auto``) and precision label (``int8``; ``fp32/bf16`` for the
    OpenVINO backend: the artifact's precision and the hint that ran; ``fp32/openvino-bf16`` for
    auto: the target that ran). PyTorch's fp32 reference is held against onnxruntime's fp32 probe;
    OpenVINO's f16 hint, which no probe measures, against its f32 one; a weight-only int8 graph
    (``weight_only``), which onnxruntime runs in float32 on the dequantised weights, against the fp32 one."""
    artifact, _, ran = precision.partition("/")
    if backend == "openvino" or ran.startswith("openvino-"):
        return "openvino bf16" if ran.lower().endswith("bf16") else "openvino f32"
    return "onnxruntime int8" if artifact == "int8" and backend != "torch" and not weight_only else "onnxruntime fp32"


#: the smaller squares the peak also tries below ``size``: a large square's operands can outgrow the
#: caches (its rate is then the memory's), where a model's own GEMMs, narrower, stay in them
SMALLER_SIDES = (512, 1024)


def gemm_peak(threads: int, size: int = 2048, repeats: int = 5, warmup: int = 2, probe: str = "onnxruntime fp32") -> dict[str, Any]:
    """GFLOP/s of one of :data:`PROBES` (default: :func:`gemm_call`, onnxruntime's fp32 MatMul):
    the best of ``repeats`` calls at the best side of ``size`` and the :data:`SMALLER_SIDES` below it
    (``size`` is the largest side tried; ``tried`` has each side's rate)."""
    if repeats < 1:
        raise InvalidInput(f"repeats must be >= 1, got {repeats}")
    if probe not in PROBES:
        raise InvalidInput(f"unknown GEMM probe {probe!r}; one of {', '.join(PROBES)}")
    make, described = PROBES[probe]
    tried: dict[int, float] = {}
    best_ms: dict[int, float] = {}
    for side in [s for s in SMALLER_SIDES if s < size] + [size]:
        call, flops = make(threads, side)
        for _ in range(warmup):
            call()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        tried[side], best_ms[side] = flops / min(times) / 1e9, min(times) * 1e3
        del call
    side = max(tried, key=tried.__getitem__)
    return {
        "gflops": tried[side],
        "size": side,
        "tried": {str(k): v for k, v in tried.items()},
        "threads": int(threads),
        "repeats": repeats,
        "best_ms": best_ms[side],
        "probe": probe,
        "how": f"{described} {side}x{side} @ {side}x{side}, best of {repeats}"
               + (f" (the best of sides {', '.join(map(str, tried))})" if len(tried) > 1 else ""),
    }


# -- the model ----------------------------------------------------------------------------------


def _weight_uses(model: Any) -> list[tuple[Any, int, Any]]:
    """``(node, operand position, initializer)`` for every 2-D initializer that is one of the two
    operands of a MatMul-like node, directly or through a DequantizeLinear (weight-only int8),
    once per use."""
    initializers = {t.name: t for t in model.graph.initializer if len(t.dims) == 2}
    weights = dict(initializers)
    weights.update({node.output[0]: initializers[node.input[0]] for node in model.graph.node
                    if node.op_type == "DequantizeLinear" and node.input[0] in initializers})
    return [
        (node, position, weights[name])
        for node in model.graph.node if node.op_type in MATMUL_OPS
        for position, name in enumerate(list(node.input)[:2]) if name in weights
    ]


def matmul_params(model_path: str | os.PathLike[str]) -> int:
    """Weights the graph multiplies by: elements of 2-D initializers feeding a MatMul-like node
    (once per use). Reads only the graph structure (external weight data is not loaded)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return sum(int(np.prod(tensor.dims)) for _, _, tensor in _weight_uses(model))


def fp32_matmul_weights(model_path: str | os.PathLike[str]) -> list[np.ndarray]:
    """The ``[K, N]`` fp32 weights the graph's MatMul nodes multiply by on the right, once per use."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    weights = [
        read_values(tensor, Path(model_path).parent) for node, position, tensor in _weight_uses(model)
        if node.op_type == "MatMul" and position == 1 and tensor.data_type == onnx.TensorProto.FLOAT
    ]
    if not weights:
        raise InvalidInput(f"{model_path} has no fp32 MatMul weights (an int8 or fp16 graph?): use an fp32 artifact")
    return weights


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs, and where each number came from."""

    matmul_params: int
    layers_run: int
    attention_width: int
    """``num_heads x head_dim``: the width of queries and keys per token."""
    hidden_size: int
    sources: dict[str, str] = field(default_factory=dict)

    def flops(self, lengths: Sequence[int]) -> float:
        """FLOPs of one batch whose rows have ``lengths`` real tokens (see the module docstring)."""
        tokens = int(sum(lengths))
        linear = 2 * self.matmul_params * tokens
        attention = sum(4 * self.attention_width * int(n) * int(n) for n in lengths) * self.layers_run
        return float(linear + attention)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_shape(
    manifest: Manifest, artifact: str | os.PathLike[str], config: Mapping[str, Any] | None = None
) -> ModelShape:
    """The shape of the model an artifact runs.

    Weights come from the artifact's graph (exactly what runs, e.g. with early exit or a readout
    that drops the last layer's unused projections); layers from the manifest; heads and head_dim
    from ``config`` (the torch model's, when the benchmark just exported it), else the source
    model's ``config.json``, else estimated as ``hidden_size`` (said so in ``sources``).
    """
    source = manifest.source
    sources: dict[str, str] = {"matmul_params": "onnx initializers"}
    params = matmul_params(Path(artifact) / MODEL)
    layers = manifest.graph.decoder_layers
    sources["layers_run"] = "manifest graph.decoder_layers"
    if layers is None:
        layers = manifest.method.layers_needed
        sources["layers_run"] = "manifest method.layers_needed"
    if config is None:
        location = source.location
        path = Path(location) / "config.json" if location else None
        if path is not None and path.is_file():
            config = json.loads(path.read_text(encoding="utf-8"))
            sources["attention_width"] = f"{path}"
    elif config is not None:
        sources["attention_width"] = "torch model config"
    hidden = int(source.hidden_size or (config or {}).get("hidden_size") or 0)
    if config and config.get("num_attention_heads"):
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config.get("hidden_size", hidden)) // heads)
        width = heads * head_dim
    else:
        width = hidden
        sources["attention_width"] = "estimated as hidden_size (no model config found)"
    return ModelShape(params, int(layers), int(width), hidden, sources)
