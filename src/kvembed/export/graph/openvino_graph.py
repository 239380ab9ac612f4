"""An int8 artifact's graph for OpenVINO: the same int8 weights, dequantised before float MatMuls.

onnxruntime runs int8 fastest as integer MatMuls on activations quantised at run time
(:mod:`.quantize`). OpenVINO reads that graph as written and runs it slower than the fp32 one; what
its CPU plugin runs fast is a float MatMul whose weight is an int8 constant times per-channel scales
(compressed weights, decompressed inside the kernel into bf16 or f32 tiles). So an int8 artifact
carries a second graph file, :data:`~kvembed.artifact.OPENVINO_MODEL`, that reads the very same
``model.onnx.data``: no weight byte is added. Each ``MatMulInteger -> Cast -> Mul`` becomes
``DequantizeLinear(weight, scale, zero point, axis=1) -> MatMul`` on the float activation, and the
activation-quantising nodes nobody reads any more are dropped. Everything else (the int8 embedding
tables, SmoothQuant's folded factors, MatMuls a recipe kept fp32) is shared as it is.

Only the names :mod:`.quantize` writes are relied on (``<x>_quantized``, ``<w>_quantized``,
``<w>_scale``): a graph written another way is refused, not guessed at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

QUANTIZED = "_quantized"


def write_openvino_graph(source: Path, target: Path) -> int:
    """Write ``target`` (a graph-only ONNX file beside ``source``, reading ``source``'s external
    data) with every integer MatMul of ``source`` as a float MatMul on its dequantised int8 weight.
    Returns how many MatMuls were rewritten; with none, nothing is written."""
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    produced = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    scales = {t.name for t in graph.initializer}
    replacement: dict[int, list[Any]] = {}
    dropped: set[int] = set()
    dequantized: set[str] = set()
    for node in graph.node:
        if node.op_type != "MatMulInteger":
            continue
        nodes, chain = _float_matmul(node, readers, produced, scales, dequantized)
        replacement[id(node)] = nodes
        dropped.update(id(n) for n in chain)
    if not replacement:
        return 0
    rewritten = []
    for node in graph.node:
        if id(node) in replacement:
            rewritten += replacement[id(node)]
        elif id(node) not in dropped:
            rewritten.append(node)
    del graph.node[:]
    graph.node.extend(_live(rewritten, {o.name for o in graph.output}))
    read = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(o.domain in ("", "ai.onnx") and o.version >= 13 for o in model.opset_import):
        raise ValueError(f"{source.name}: per-axis DequantizeLinear needs ONNX opset 13 or later")
    onnx.save_model(model, str(target))  # external tensors keep their location: the shared data file
    return len(replacement)


def _float_matmul(node: Any, readers: dict[str, list[Any]], produced: set[str], scales: set[str],
                  dequantized: set[str]) -> tuple[list[Any], list[Any]]:
    """The nodes replacing the integer MatMul ``node`` (a DequantizeLinear per weight, once, then
    the float MatMul) and the ``Cast -> Mul`` chain after it that they replace."""
    from onnx import helper

    activation, weight = node.input[0], node.input[1]
    x, w = activation[: -len(QUANTIZED)], weight[: -len(QUANTIZED)]
    cast = _only_reader(node.output[0], readers, "Cast")
    scale_mul = _only_reader(cast.output[0], readers, "Mul")
    if not (activation.endswith(QUANTIZED) and weight.endswith(QUANTIZED) and x in produced and f"{w}_scale" in scales):
        raise ValueError(f"{node.name}: not an integer MatMul kvembed's quantiser wrote; cannot derive the OpenVINO graph")
    nodes = []
    if w not in dequantized:
        dequantized.add(w)
        inputs = [weight, f"{w}_scale"] + ([node.input[3]] if len(node.input) > 3 and node.input[3] else [])
        nodes.append(helper.make_node("DequantizeLinear", inputs, [f"{w}_dequantized"], name=f"{w}_dequantize", axis=1))
    name = node.name[: -len("_quant")] if node.name.endswith("_quant") else f"{node.name}_float"
    nodes.append(helper.make_node("MatMul", [x, f"{w}_dequantized"], list(scale_mul.output), name=name))
    return nodes, [cast, scale_mul]


def _only_reader(tensor: str, readers: dict[str, list[Any]], op_type: str) -> Any:
    found = readers.get(tensor, [])
    if len(found) != 1 or found[0].op_type != op_type:
        raise ValueError(f"{tensor}: expected one {op_type} reading it, found {[n.op_type for n in found]}")
    return found[0]


def _live(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """``nodes`` without those whose outputs nothing reads (the activation quantisation left
    behind), repeated until none is left; order kept."""
    while True:
        read = {name for node in nodes for name in node.input} | outputs
        live = [node for node in nodes if any(o in read for o in node.output if o)]
        if len(live) == len(nodes):
            return live
        nodes = live
