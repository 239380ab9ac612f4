"""onnxruntime's dynamic int8 quantisation, a slice of the graph at a time.

``onnxruntime.quantization.quantize_dynamic`` loads the whole model, weights included, and keeps
the fp32 weights beside their int8 copies until it saves: for a multi-GB model that is more than
the weights twice over. Dynamic quantisation of a ``MatMul`` depends only on its own weight and
the options, so the same result comes from quantising slices: the MatMuls that read one
activation (so its single ``DynamicQuantizeLinear`` stays shared, as in a whole-model run) are
cut out with their weights into a small model, quantised by ``quantize_dynamic`` itself, and
spliced back; the int8 weights go to disk as each slice is done, and the final graph is written
one tensor at a time (:func:`~kvembed.export.external_data.stream_initializers`). Memory: one slice.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .external_data import EXTERNAL_MIN_BYTES

#: fp32 weight bytes per slice: big enough that a slice is a layer or so, small beside the model
SLICE_BYTES = 256 * 1024**2


@dataclass
class _Slice:
    nodes: list[Any] = field(default_factory=list)
    weights: list[str] = field(default_factory=list)
    activations: list[str] = field(default_factory=list)
    nbytes: int = 0


def quantize_dynamic_streamed(
    source: Path,
    target: Path,
    *,
    nodes_to_exclude: Sequence[str] = (),
    slice_bytes: int = SLICE_BYTES,
    advance: Any = None,
    finish: Callable[[Any], Any] | None = None,
    **options: Any,
) -> dict[str, int]:
    """``quantize_dynamic(source, target, op_types_to_quantize=["MatMul"], nodes_to_exclude=...,
    **options)`` for MatMuls whose second input is a float initializer (``MatMulConstBOnly``),
    holding one slice of the weights at a time. ``target`` gets its weights in ``<target>.data``;
    ``advance(done, total)`` is told the slices done. ``finish(model)`` may rewrite the quantised
    graph (without its weights) before it is written, and returns the per-tensor ``transform`` the
    weights pass through on their way to disk (or None), so a further change of the weights costs
    no pass of its own. Returns counts (slices, quantised MatMuls)."""
    import onnx
    from onnx.external_data_helper import set_external_data

    from .external_data import stream_initializers
    from .precision import toposort

    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    slices = _slices(graph, set(nodes_to_exclude), slice_bytes)
    with tempfile.TemporaryDirectory(prefix=".kvembed-quant-", dir=target.parent) as work:
        work_dir = Path(work)
        data_name = "quantized.data"
        (work_dir / data_name).write_bytes(b"")
        homes: dict[str, Path] = {}  # new initializer -> the directory its external data is relative to
        replaced: dict[int, list[Any]] = {}  # id of a MatMul node -> the nodes that replace it (first of a slice)
        removed: set[int] = set()
        opsets: dict[str, int] = {}
        for number, piece in enumerate(slices):
            quantized = _quantize_slice(model, source.parent, piece, work_dir / f"slice{number}.onnx", options)
            for opset in quantized.opset_import:
                opsets[opset.domain] = max(opsets.get(opset.domain, 0), opset.version)
            for tensor in quantized.graph.initializer:
                if tensor.HasField("raw_data") and len(tensor.raw_data) >= EXTERNAL_MIN_BYTES:
                    set_external_data(tensor, data_name, offset=_append(tensor.raw_data, work_dir / data_name),
                                      length=len(tensor.raw_data))
                    tensor.ClearField("raw_data")
                    tensor.data_location = onnx.TensorProto.EXTERNAL
                homes[tensor.name] = work_dir
                graph.initializer.append(tensor)
            # copies: a message kept from the slice's model would keep that model's whole arena
            # (the int8 weights' bytes included) alive until the end
            replaced[id(piece.nodes[0])] = [_copy(node) for node in quantized.graph.node]
            removed.update(id(node) for node in piece.nodes[1:])
            del quantized
            if advance is not None:
                advance(number + 1, len(slices))
        nodes = []
        for node in graph.node:
            if id(node) in replaced:
                nodes.extend(replaced[id(node)])
            elif id(node) not in removed:
                nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
        _drop_unread_initializers(graph)
        for opset in model.opset_import:
            opsets[opset.domain] = max(opsets.get(opset.domain, 0), opset.version)
        del model.opset_import[:]
        model.opset_import.extend(onnx.helper.make_opsetid(domain, version) for domain, version in sorted(opsets.items()))
        transform = None if finish is None else finish(model)
        toposort(graph)
        stream_initializers(model, source.parent, target, transform, sources=homes)
    return {"slices": len(slices), "quantized_matmuls": sum(len(s.nodes) for s in slices)}


def _slices(graph: Any, exclude: set[str], slice_bytes: int) -> list[_Slice]:
    """The quantisable MatMuls, grouped so that MatMuls sharing an activation or a weight share a
    slice (each quantised tensor is made once, as in a whole-model run), and packed in graph order
    into slices of about ``slice_bytes`` of fp32 weights."""
    import onnx

    weights = {t.name: t for t in graph.initializer
               if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2}
    matmuls = [node for node in graph.node
               if node.op_type == "MatMul" and node.name not in exclude and len(node.input) == 2
               and node.input[1] in weights]
    parent = list(range(len(matmuls)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    first: dict[str, int] = {}  # a tensor name -> the first MatMul that reads it
    for index, node in enumerate(matmuls):
        for name in node.input:
            if name in first:
                parent[root(index)] = root(first[name])
            else:
                first[name] = index
    groups: dict[int, _Slice] = {}
    for index, node in enumerate(matmuls):
        group = groups.setdefault(root(index), _Slice())
        group.nodes.append(node)
        if node.input[0] not in group.activations:
            group.activations.append(node.input[0])
        if node.input[1] not in group.weights:
            group.weights.append(node.input[1])
            group.nbytes += 4 * _numel(weights[node.input[1]])
    slices: list[_Slice] = []
    for group in groups.values():
        if not slices or slices[-1].nbytes + group.nbytes > slice_bytes:
            slices.append(_Slice())
        current = slices[-1]
        current.nodes += group.nodes
        current.weights += group.weights
        current.activations += group.activations
        current.nbytes += group.nbytes
    return slices


def _quantize_slice(model: Any, weights_dir: Path, piece: _Slice, path: Path, options: Mapping[str, Any]) -> Any:
    """One slice as a model of its own (its activations as inputs, its MatMul outputs as
    outputs, its weights loaded), quantised by ``quantize_dynamic``; the quantised model."""
    import onnx
    from onnx import helper
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data
    from onnxruntime.quantization import quantize_dynamic

    tensors = {t.name: t for t in model.graph.initializer}
    initializers = []
    for name in piece.weights:
        tensor = onnx.TensorProto()
        tensor.CopyFrom(tensors[name])
        if uses_external_data(tensor):
            load_external_data_for_tensor(tensor, str(weights_dir))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
        initializers.append(tensor)
    nodes = []
    for node in piece.nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        nodes.append(copy)
    produced = {o for node in piece.nodes for o in node.output}  # a MatMul may read another's output
    sub = helper.make_graph(
        nodes, f"slice-{path.stem}",
        [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
         for name in piece.activations if name not in produced],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for node in piece.nodes for o in node.output],
        initializers,
    )
    piece_model = helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    del initializers, sub
    quantize_dynamic(piece_model, str(path), op_types_to_quantize=["MatMul"], **options)
    del piece_model
    quantized = onnx.load(str(path))
    path.unlink()
    outputs = {o for node in quantized.graph.node for o in node.output}
    missing = [o for node in piece.nodes for o in node.output if o not in outputs]
    if missing:
        raise RuntimeError(f"quantize_dynamic renamed the outputs {missing[:3]} of a slice; cannot splice it back")
    return quantized


def _copy(message: Any) -> Any:
    """A copy of a protobuf message in an arena of its own."""
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def _append(raw: bytes, data: Path) -> int:
    """Append ``raw`` to the file ``data``; the offset it starts at."""
    with data.open("ab") as handle:
        offset = handle.tell()
        handle.write(raw)
    return offset


def _drop_unread_initializers(graph: Any) -> None:
    """Remove initializers no node reads any more (the fp32 weights that were quantised)."""
    from .precision import node_inputs

    read = {name for node in graph.node for name in node_inputs(node)}
    read |= {o.name for o in graph.output}
    keep = [t for t in graph.initializer if t.name in read]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


def _numel(tensor: Any) -> int:
    count = 1
    for dim in tensor.dims:
        count *= int(dim)
    return count
