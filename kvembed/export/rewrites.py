"""Offline rewrites of a traced graph that keep it portable: onnxruntime's basic optimisation
level, and RMSNorm's ``rsqrt`` spelled so that onnxruntime fuses it at load.

Each returns a record for the manifest's ``optimizations`` list and replaces the graph only when
the rewrite applied.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from .ops import ALLOWED_OPS, STANDARD_DOMAINS, non_portable_ops


def optimize_with_onnxruntime(path: Path) -> dict[str, Any]:
    """Run onnxruntime's basic (hardware-independent, standard-op) graph optimisations offline.

    Replaces ``path`` only if the result is smaller and still uses standard ops from the allow-list
    only. Extended and layout levels are never used: they fuse into ``com.microsoft`` contrib ops.
    """
    import onnx
    import onnxruntime as ort

    record: dict[str, Any] = {"name": "onnxruntime ORT_ENABLE_BASIC (offline)", "applied": False}
    before = onnx.load(str(path), load_external_data=False)
    record["nodes_before"] = len(before.graph.node)
    external = any(_is_external(t) for t in before.graph.initializer)
    target = path.with_name(path.stem + ".ortopt.onnx")
    target_data = target.with_name(target.name + ".data")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(target)
    options.add_session_config_entry("session.disable_prepacking", "1")  # never run: no packed copy of the weights
    if external:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", target_data.name)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(str(target), load_external_data=False)
    except Exception as err:  # keep the unoptimised graph
        record["reason"] = f"onnxruntime failed: {type(err).__name__}"
        _remove(target, target_data)
        return record
    _drop_unused_opsets(optimized)
    record["nodes_after"] = len(optimized.graph.node)
    bad = non_portable_ops(optimized, ALLOWED_OPS)
    if bad:
        record["reason"] = f"would introduce non-portable ops: {', '.join(bad)}"
    elif record["nodes_after"] >= record["nodes_before"]:
        record["reason"] = "no node removed"
    else:
        record["applied"] = True
    if record["applied"]:
        data = path.with_name(path.name + ".data")
        if external:
            for tensor in optimized.graph.initializer:
                for entry in tensor.external_data:
                    if entry.key == "location":
                        entry.value = data.name
            os.replace(target_data, data)
        onnx.save(optimized, str(path))
    _remove(target, target_data)
    return record


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


def node_edges(graph: Any) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(value -> the node producing it, value -> the nodes reading it) of an ``onnx.GraphProto``."""
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return producers, consumers


def _is_external(tensor: Any) -> bool:
    import onnx

    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _drop_unused_opsets(model: Any) -> None:
    used = {node.domain for node in model.graph.node}
    keep = [o for o in model.opset_import if o.domain in used or o.domain in STANDARD_DOMAINS]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def _remove(*paths: Path) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
