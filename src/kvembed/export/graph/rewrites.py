"""Offline rewrites of a traced graph that keep it portable: onnxruntime's basic optimisation
level, and RMSNorm's ``rsqrt`` spelled so that onnxruntime fuses it at load.

Each returns a record for the manifest's ``optimizations`` list and replaces the graph only when
the rewrite applied.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from ..onnx_nodes import node_edges
from .ops import ALLOWED_OPS, STANDARD_DOMAINS, non_portable_ops


def optimize_with_onnxruntime(path: Path) -> dict[str, Any]:
    """Run onnxruntime's basic (hardware-independent, standard-op) graph optimisations offline.

    Replaces ``path`` only if the result is smaller and still uses standard ops from the allow-list
    only. Extended and layout levels are never used: they fuse into ``com.microsoft`` contrib ops.

    onnxruntime sees the graph with its weights as inputs (:func:`_weights_as_inputs`): it needs
    neither their bytes nor to write them again (its optimized-model writer rewrites every
    initializer, the whole model once more on disk, however few nodes it removes), and folding a
    weight is what the export never wants (the trace keeps weight transposes unfolded). The
    optimised graph gets the same initializers back, so the weights file is not touched.
    """
    import onnx
    import onnxruntime as ort

    record: dict[str, Any] = {"name": "onnxruntime ORT_ENABLE_BASIC (offline)", "applied": False}
    model = onnx.load(str(path), load_external_data=False)
    record["nodes_before"] = len(model.graph.node)
    weights = _weights_as_inputs(model)
    skeleton = path.with_name(path.stem + ".skeleton.onnx")
    target = path.with_name(path.stem + ".ortopt.onnx")
    onnx.save(model, str(skeleton))
    del model
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    try:
        ort.InferenceSession(str(skeleton), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(str(target))
    except Exception as err:  # keep the unoptimised graph
        record["reason"] = f"onnxruntime failed: {type(err).__name__}"
        return record
    finally:
        _remove(skeleton, target)
    _drop_unused_opsets(optimized)
    record["nodes_after"] = len(optimized.graph.node)
    bad = non_portable_ops(optimized, ALLOWED_OPS)
    if bad:
        record["reason"] = f"would introduce non-portable ops: {', '.join(bad)}"
    elif record["nodes_after"] >= record["nodes_before"]:
        record["reason"] = "no node removed"
    else:
        record["applied"] = True
        _inputs_as_weights(optimized, weights)
        onnx.save(optimized, str(path))
    return record


def _weights_as_inputs(model: Any) -> list[Any]:
    """Move ``model``'s weights (external initializers, and inline ones of
    :data:`~kvembed.artifact.external_data.EXTERNAL_MIN_BYTES` or more, which an artifact would keep
    external) to graph inputs of their type and shape (onnxruntime would write an external one back
    inline); returns them (external ones still pointing at their file) for :func:`_inputs_as_weights`."""
    import onnx
    from onnx import helper

    from ...artifact.external_data import EXTERNAL_MIN_BYTES, tensor_bytes

    graph = model.graph
    declared = {i.name for i in graph.input}
    weights, kept = [], []
    for tensor in graph.initializer:
        weight = tensor.data_location == onnx.TensorProto.EXTERNAL or tensor_bytes(tensor) >= EXTERNAL_MIN_BYTES
        (weights if weight and tensor.name not in declared else kept).append(tensor)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in weights)
    return weights


def _inputs_as_weights(model: Any, weights: list[Any]) -> None:
    """Undo :func:`_weights_as_inputs` on the optimised ``model``: the inputs become the same
    initializers again."""
    graph = model.graph
    names = {t.name for t in weights}
    inputs = [i for i in graph.input if i.name not in names]
    del graph.input[:]
    graph.input.extend(inputs)
    graph.initializer.extend(weights)


def rms_norm_as_div(path: Path) -> dict[str, Any]:
    """Rewrite ``x * Reciprocal(Sqrt(v))`` as ``x / Sqrt(v)`` in the graph at ``path``.

    The exporter spells RMSNorm's ``rsqrt`` as Sqrt -> Reciprocal -> Mul; onnxruntime's
    SimplifiedLayerNormFusion only recognises the Sqrt -> Div form, so without this rewrite every
    RMSNorm runs as six element-wise kernels instead of one fused SimplifiedLayerNormalization
    (at session load; the file keeps standard ops). Same math, within one rounding.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    producers, consumers = node_edges(graph)
    graph_outputs = {o.name for o in graph.output}
    dropped: set[int] = set()
    for node in graph.node:
        if node.op_type != "Reciprocal" or node.domain not in ("", "ai.onnx") or node.output[0] in graph_outputs:
            continue
        source, users = producers.get(node.input[0]), consumers.get(node.output[0], [])
        if source is None or source.op_type != "Sqrt" or len(users) != 1 or users[0].op_type != "Mul":
            continue
        mul = users[0]
        other = mul.input[1] if mul.input[0] == node.output[0] else mul.input[0]
        mul.op_type = "Div"
        del mul.input[:]
        mul.input.extend([other, node.input[0]])
        dropped.add(id(node))
    record: dict[str, Any] = {"name": "RMSNorm rsqrt as Div (onnxruntime fuses it at load)", "applied": bool(dropped),
                              "rewritten": len(dropped)}
    if dropped:
        kept = [node for node in graph.node if id(node) not in dropped]
        del graph.node[:]
        graph.node.extend(kept)
        onnx.save(model, str(path))
    return record


def _drop_unused_opsets(model: Any) -> None:
    used = {node.domain for node in model.graph.node}
    keep = [o for o in model.opset_import if o.domain in used or o.domain in STANDARD_DOMAINS]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def _remove(*paths: Path) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
