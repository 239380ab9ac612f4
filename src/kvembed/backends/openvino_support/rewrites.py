"""The graph rewrites the OpenVINO session makes before compiling: K/V heads repeated in the model
OpenVINO read (:func:`repeat_kv_heads`), and an fp16 ONNX graph retyped to bf16 (:func:`fp16_graph`,
:func:`write_bf16_graph`). Kept apart from the session (:mod:`kvembed.backends.openvino`), which
decides when each runs, because they change what is compiled, never how it is run or kept.

OpenVINO 2026.4's ONNX frontend reads the opset-23 ``Attention`` op but gives its output the head
count of K/V, so grouped-query graphs (fewer K/V heads than query heads: every modern LLM) fail to
compile. :func:`repeat_kv_heads` mends the model OpenVINO read, before compiling: each attention
node gets K and V with their heads repeated to the query's count, which is what grouped-query
attention means, so the function is unchanged and OpenVINO compiles it. (Rewriting the ONNX graph
instead would not do: OpenVINO refuses external data outside the directory of the graph it reads.)

An fp16 graph under the bf16 hint (a CPU with BF16 but no FP16: Zen 4 and 5, Cooper Lake) is compiled
from a copy whose GEMM weights are bf16 (:func:`write_bf16_graph`). The plugin cannot keep fp16 GEMM
weights as they are there: it converts an fp16 graph's constants through f32 while compiling (twice
the weights, then its bf16 copy), and its GEMM decompression kernels take integer weights only; a
GEMM whose weights are bf16 already compiles with them as they are (benchmarks/log/fp16-on-cpu.md).
Its embedding lookup does read fp16 weights as they are, so the table stays fp16. The activations
are f32, as in an fp32 graph, so the plugin keeps the residual stream and the norms' sums in f32
under the bf16 hint. fp16 to bf16 keeps the range and loses mantissa bits (10 to 7): weights that
came from a bf16 checkpoint, as 4B-8B models ship, come back exactly; how close the outputs come is
what the export's advisory check on ``openvino-bf16`` measures.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ...artifact.external_data import Scratch, stream_initializers, tensor_bytes
from ...artifact.layout import MODEL


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


#: free disk the bf16 graph's data file may not leave less than, beyond its own bytes
DISK_MARGIN = 256 * 1024**2


def fp16_graph(source: Path) -> Any:
    """The graph at ``source`` (an ``onnx.ModelProto`` without its external data) when it has fp16
    weights, else None."""
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    return model if any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer) else None


#: where a weight is read as bf16: (op type, input slot) of the weight GEMMs, which then run in bf16
#: between two Casts; every other fp16 weight (the embedding table, norm scales, biases) stays fp16
#: and is read through a Cast to f32
BF16_WEIGHT_SLOTS = frozenset({("MatMul", 1), ("Gemm", 1)})


def write_bf16_graph(model: Any, source: Path, folder: Path, margin: int | None = None) -> Path:
    """Write ``model`` (:func:`fp16_graph` of ``source``) with its GEMM weights bf16 and its fp16
    activations f32 as ``folder``/model.onnx, its weights in ``model.onnx.data`` there, and return
    that path. The weight GEMMs (:data:`BF16_WEIGHT_SLOTS`) read their weights as bf16, between a
    Cast of their activation to bf16 and one of their result back to f32; every other fp16 weight
    stays fp16 and is read through a Cast to f32, and every fp16 ``Cast`` target, node-attribute
    constant and value type becomes f32. So the plugin packs the weights at two bytes as they are
    (the embedding table's lookup reads fp16), and under the bf16 hint it chooses which of the rest
    run in bf16 as it does for an fp32 graph. An embedding table or an activation stream rounded to
    bf16 costs a client text's cosine up to 2e-3 (benchmarks/log/fp16-on-cpu.md). The initializers
    are converted one tensor at a time on their way to the data file (as the exporter streams
    them). An OSError when ``folder``'s disk lacks the room (the weights' bytes plus ``margin``,
    None: :data:`DISK_MARGIN`) or the write fails; a ValueError for a graph with subgraphs
    (kvembed's exporter writes none)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        raise ValueError(f"{source.name} has subgraphs, which the bf16 retyping does not cover")
    needed = sum(tensor_bytes(t) for t in graph.initializer) + (DISK_MARGIN if margin is None else margin)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(errno.ENOSPC, f"a bf16 copy of {source.name}'s weights needs {needed / 1e9:.1f} GB free in {folder}, "
                                    f"there are {free / 1e9:.1f} GB")
    halves = {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT16}
    gemm_weights = {name for n in graph.node for i, name in enumerate(n.input)
                    if name in halves and (n.op_type, i) in BF16_WEIGHT_SLOTS}
    taken = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    widened: dict[str, str] = {}  # an fp16 weight -> its f32 copy's value
    head, nodes = [], []
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.INT and attribute.name in ("to", "dtype") and attribute.i == TensorProto.FLOAT16:
                attribute.i = TensorProto.FLOAT
            elif attribute.type == onnx.AttributeProto.TENSOR and attribute.t.data_type == TensorProto.FLOAT16:
                attribute.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attribute.t).astype(np.float32), attribute.t.name))
        kept = [i for i, name in enumerate(node.input) if name in halves and (node.op_type, i) in BF16_WEIGHT_SLOTS]
        for i, name in enumerate(node.input):
            if name in halves and i not in kept:
                if name not in widened:
                    widened[name] = fresh(f"{name}_f32")
                    head.append(helper.make_node("Cast", [name], [widened[name]], to=TensorProto.FLOAT))
                node.input[i] = widened[name]
        if kept:  # the op runs in bf16: its float activations cast in, its result cast back out
            for i, name in enumerate(node.input):
                if i not in kept and name:
                    narrowed = fresh(f"{name}_bf16")
                    nodes.append(helper.make_node("Cast", [name], [narrowed], to=TensorProto.BFLOAT16))
                    node.input[i] = narrowed
            nodes.append(node)
            for i, name in enumerate(node.output):
                inner = fresh(f"{name}_bf16")
                node.output[i] = inner
                nodes.append(helper.make_node("Cast", [inner], [name], to=TensorProto.FLOAT))
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(head + nodes)
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    bf16 = helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16)

    def to_bf16(tensor: Any, values: np.ndarray | None, scratch: Scratch) -> np.ndarray | None:
        if values is None or tensor.name not in gemm_weights:
            return None
        out = scratch.array("bf16", values.shape, bf16)
        out[...] = values  # fp16 -> bf16, rounded to nearest even
        return out

    target = folder / MODEL
    stream_initializers(model, source.parent, target, to_bf16)
    return target
