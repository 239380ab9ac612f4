"""Which ONNX operators an exported graph may contain, and how to check a graph against them.

The portable ``model.onnx`` must build as a TensorRT engine: only standard-domain (``ai.onnx``)
operators that TensorRT's ONNX parser supports, and none of the control-flow or scatter operators
we ban outright (``If``/``Loop``/``Scan`` make engines data-dependent and slow; ``ScatterND``
has historically been a plugin-backed, slow path). Torch-free.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable

#: Operators TensorRT's ONNX parser supports ("Y" rows of the support matrix in
#: onnx-tensorrt docs/operators.md, TensorRT 8.5 / opset 17 edition; TensorRT 10 supports a
#: superset). Ops the matrix marks "N" (DynamicQuantizeLinear, MatMulInteger, QLinearMatMul,
#: Sequence*, Optional*, ...) are absent on purpose.
TENSORRT_OPS: frozenset[str] = frozenset(
    """
    Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization
    Cast Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum
    DepthToSpace DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten
    Floor Gather GatherElements GatherND Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater
    GreaterOrEqual GridSample GRU HardSigmoid HardSwish Identity If ImageScaler
    InstanceNormalization IsNaN LeakyRelu Less LessOrEqual Log LogSoftmax Loop LRN LSTM
    LpNormalization LpPool MatMul Max MaxPool Mean MeanVarianceNormalization Min Mod Mul Neg
    NonMaxSuppression NonZero Not OneHot Or Pad ParametricSoftplus Pow PRelu QuantizeLinear
    RandomNormal RandomNormalLike RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2
    ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
    ReduceSumSquare Relu Reshape Resize ReverseSequence RNN RoiAlign Round ScaledTanh Scan Scatter
    ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax Softplus
    Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose
    Trilu Unsqueeze Upsample Where Xor
    """.split()
)

#: Standard ops TensorRT's parser takes only from a given version on (release notes of
#: onnx-tensorrt 10.14: "Added support for the Attention operator", mapped to IAttention; the
#: TensorRT guide "Working with Transformers": IRotaryEmbeddingLayer "added in version 10.15.1",
#: for RoPE imported from ONNX). Causal2Vec's BERT encoder brings LayerNormalization (opset 17,
#: parsed since TensorRT 8.6) and Gelu (opset 20; listed "Y" in the 10.15 support matrix, the
#: version given here). Not verified here: no TensorRT on this project's machines.
TENSORRT_OPS_SINCE: dict[str, str] = {
    "Attention": "10.14", "RotaryEmbedding": "10.15.1", "LayerNormalization": "8.6", "Gelu": "10.15"}

#: Supported by TensorRT but not allowed in a kvembed graph (the issue's portability rules).
BANNED_OPS: frozenset[str] = frozenset({"If", "Loop", "Scan", "ScatterND"})

#: The allow-list a portable kvembed graph is checked against.
ALLOWED_OPS: frozenset[str] = (TENSORRT_OPS | frozenset(TENSORRT_OPS_SINCE)) - BANNED_OPS

#: Domains a portable graph may use ("" and "ai.onnx" are the same standard domain).
STANDARD_DOMAINS: frozenset[str] = frozenset({"", "ai.onnx"})


def version_key(text: str) -> tuple[int, ...]:
    """``"10.15.1"`` -> ``(10, 15, 1)``: the first three numbers of a version, for comparisons."""
    return tuple(int(x) for x in re.findall(r"\d+", str(text))[:3])


def op_types(model: Any) -> Counter:
    """Count ``(domain, op_type)``-qualified op types of an ``onnx.ModelProto``, subgraphs included.

    Keys are plain op types for the standard domain and ``"domain::Op"`` otherwise.
    """
    counts: Counter = Counter()
    for node in _walk(model.graph):
        counts[node.op_type if node.domain in STANDARD_DOMAINS else f"{node.domain}::{node.op_type}"] += 1
    for function in getattr(model, "functions", ()):  # local functions count too
        for node in function.node:
            counts[node.op_type if node.domain in STANDARD_DOMAINS else f"{node.domain}::{node.op_type}"] += 1
    return counts


def non_portable_ops(model: Any, allowed: Iterable[str] = ALLOWED_OPS) -> list[str]:
    """Sorted op types of ``model`` that fall outside ``allowed`` (non-standard domains always do)."""
    allowed = frozenset(allowed)
    return sorted(op for op in op_types(model) if op not in allowed)


def _walk(graph: Any) -> Iterable[Any]:
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.g is not None and attribute.g.node:
                yield from _walk(attribute.g)
            for sub in attribute.graphs:
                yield from _walk(sub)
