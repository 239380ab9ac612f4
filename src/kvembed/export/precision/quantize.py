"""Dynamic int8 MatMuls, written one weight at a time: onnxruntime's ``quantize_dynamic`` graph,
computed without it.

``onnxruntime.quantization.quantize_dynamic`` loads the whole model, keeps the fp32 weights beside
their int8 copies until it saves, and quantises each weight with a Python loop over its output
channels (one numpy call per channel). What it writes for a ``MatMul`` whose second input is a
float initializer (``MatMulConstBOnly``) is simple: a ``DynamicQuantizeLinear`` per activation
(shared by every MatMul reading it), and per MatMul a ``MatMulInteger`` on the int8 weight, a
``Cast`` to float and two ``Mul``s by the activation scale times the weight's per-channel scales.
This module writes that same graph (the same node and tensor names) and quantises each weight
with the same arithmetic, vectorised over the channels, as the weight streams from the source
file to the target's (:func:`~kvembed.artifact.external_data.stream_initializers`): memory is one
weight, and the time is the weights' own read and write. tests/test_int8.py holds it bitwise equal
to ``quantize_dynamic`` on a whole model.

``steps`` lets the caller change a weight on its way through (SmoothQuant's folding,
:mod:`kvembed.export.precision.smoothing`), so smoothing and quantising are one pass over the weights.

Weight-only (``WeightFormat.block``): the same pass writes each chosen weight as symmetric int8
with one float32 scale per block of input rows of each output column, and a blocked
``DequantizeLinear`` (opset 21: ``axis=0``, ``block_size``) feeding the unchanged float
``MatMul``; activations stay float. onnxruntime fuses the pair into ``MatMulNBits`` (8 bits),
whose arithmetic its session config pins (:data:`kvembed.backends.onnxruntime.WEIGHT_ONLY_ACCURACY`);
OpenVINO reads the pair as compressed weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...errors import InvalidInput
from ...artifact.external_data import Transform


@dataclass(frozen=True)
class WeightFormat:
    """How a weight is stored: dynamic (onnxruntime's ``weight_type`` and ``reduce_range``, the
    activations quantised as they run), or weight-only in blocks (``block``: activations float)."""

    signed: bool  # int8 (symmetric, zero point 0) or uint8 (asymmetric)
    reduce_range: bool  # int8 in [-64, 64] / uint8 in [0, 127]
    #: activations quantised with one scale per row (token) instead of one per tensor
    per_row: bool = False
    #: weight-only: int8 in [-127, 127] with a scale per this many input rows of each output column
    #: (None: dynamic); a weight whose input width it does not divide gets a smaller block (:meth:`block_for`)
    block: int | None = None

    @property
    def dtype(self) -> type:
        return np.int8 if self.signed else np.uint8

    def block_for(self, rows: int) -> int:
        """The block for a weight of ``rows`` input rows: the largest power of two from 16 up to
        :attr:`block` that divides ``rows`` (OpenVINO reads no partial last block, and onnxruntime
        fuses power-of-two blocks of 16 or more only), else ``rows`` itself (one block per column)."""
        assert self.block is not None
        size = self.block
        while size >= 16:
            if rows % size == 0 and size & (size - 1) == 0:
                return size
            size //= 2
        return rows

    @property
    def limits(self) -> tuple[int, int]:
        """The range the scale maps onto (onnxruntime's ``get_qmin_qmax_for_qType``)."""
        if self.reduce_range:
            return (-64, 64) if self.signed else (0, 127)
        return (-127, 127) if self.signed else (0, 255)


def quantize_per_channel(weight: np.ndarray, fmt: WeightFormat, scratch: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``weight`` ([in, out] float32) quantised per output channel: (values, scales, zero points),
    with onnxruntime's arithmetic (``compute_scale_zp`` then ``quantize_nparray``) over every
    channel at once: the range always includes 0; int8 is symmetric; the scale is computed in
    float64 and stored in float32; a range below float32's smallest normal gets scale 1.
    ``scratch`` (:class:`~kvembed.artifact.external_data.Scratch`): the weight-sized temporaries
    and the values go into its reused buffers (valid until the next weight)."""
    weight = np.asarray(weight, dtype=np.float32)
    qmin, qmax = fmt.limits
    rmin = np.minimum(weight.min(axis=0), np.float32(0))
    rmax = np.maximum(weight.max(axis=0), np.float32(0))
    if fmt.signed:
        rmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin = -rmax
    scale64 = (rmax.astype(np.float64) - rmin.astype(np.float64)) / (float(qmax) - float(qmin))
    tiny = scale64 < np.finfo(np.float32).tiny
    if fmt.signed:
        zero = np.zeros(scale64.shape, dtype=fmt.dtype)
    else:
        zero = np.round(qmin - rmin.astype(np.float64) / np.where(tiny, 1.0, scale64)).astype(fmt.dtype)
        zero[tiny] = 0
    scale = np.where(tiny, np.float32(1.0), scale64.astype(np.float32)).astype(np.float32)
    info = np.iinfo(fmt.dtype)
    values = np.divide(weight, scale[None, :], out=_buffer(scratch, "quantize", weight.shape, np.float32))
    np.round(values, out=values)
    values += zero.astype(np.float32)[None, :]
    np.clip(values, info.min, info.max, out=values)
    return _cast(values, fmt.dtype, scratch), scale, zero


def _buffer(scratch: Any, key: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.empty(shape, dtype=dtype) if scratch is None else scratch.array(key, shape, dtype)


def _cast(values: np.ndarray, dtype: Any, scratch: Any) -> np.ndarray:
    """``values.astype(dtype)``, into ``scratch``'s buffer when there is one."""
    if scratch is None:
        return values.astype(dtype)
    out = scratch.array("quantized", values.shape, dtype)
    np.copyto(out, values, casting="unsafe")
    return out


def quantize_blocked(weight: np.ndarray, block: int, scratch: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """``weight`` ([in, out] float32, ``in`` a multiple of ``block``) as symmetric int8 in blocks of
    ``block`` input rows: (values [in, out], float32 scales [in / block, out]), ``scale = max|block| / 127``
    (1 for an all-zero block) and ``values = round(weight / scale)`` (half to even). ``scratch``: as
    :func:`quantize_per_channel`'s."""
    weight = np.asarray(weight, dtype=np.float32)
    rows, columns = weight.shape
    blocks = weight.reshape(rows // block, block, columns)
    peak = np.maximum(blocks.max(axis=1), -blocks.min(axis=1))  # max |x| without an |x| temporary
    scale = np.where(peak > 0, peak / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    values = np.divide(blocks, scale[:, None, :], out=_buffer(scratch, "quantize", blocks.shape, np.float32))
    np.rint(values, out=values)
    np.clip(values, -127, 127, out=values)
    return _cast(values, np.int8, scratch).reshape(rows, columns), scale


#: the opset whose DequantizeLinear takes ``block_size``
BLOCKED_OPSET = 21


def quantize_matmuls(
    source: Path,
    target: Path,
    fmt: WeightFormat,
    *,
    exclude: Sequence[str] = (),
    steps: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None,
    advance: Any = None,
    finish: Callable[[Any], Transform | None] | None = None,
) -> dict[str, int]:
    """Write the fp32 graph ``source`` as ``target`` (weights in ``<target>.data``) with every
    ``MatMul`` whose second input is a 2-D float initializer quantised dynamically, or weight-only
    where ``fmt.block`` is set (module docstring), except the nodes named in ``exclude`` and those whose weight another node reads
    too. ``steps[name]`` (optional) changes the float weight ``name`` before anything else is done
    with it. ``finish(model)`` may rewrite the quantised graph further (without its weights) and
    returns a per-tensor transform of its own for the weights on their way to disk (or None), so a
    further change of the weights costs no pass of its own (the int8 embedding tables,
    :mod:`kvembed.export.precision.embedding_table`). ``advance(done, total)`` is told the tensors written.
    Returns counts."""
    import onnx
    from onnx import TensorProto

    from ...artifact.external_data import stream_initializers
    from ..onnx_nodes import node_inputs, toposort

    steps = steps or {}
    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    floats = {t.name: t for t in graph.initializer if t.data_type == TensorProto.FLOAT and len(t.dims) == 2}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node_inputs(node):
            readers.setdefault(name, []).append(node)
    excluded = set(exclude)
    chosen = [n for n in graph.node if n.op_type == "MatMul" and n.name not in excluded and len(n.input) == 2
              and n.input[1] in floats]
    chosen_ids = {id(n) for n in chosen}
    outputs = {o.name for o in graph.output}
    chosen = [n for n in chosen if all(id(r) in chosen_ids for r in readers[n.input[1]]) and n.input[1] not in outputs]
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    needed = BLOCKED_OPSET if fmt.block else 11
    if opset < needed:
        raise InvalidInput(f"{'weight-only int8 (blocked DequantizeLinear)' if fmt.block else 'dynamic int8 (DynamicQuantizeLinear)'} "
                           f"needs ONNX opset {needed} or later, and this graph has opset {opset}: export with --opset {needed} or later")
    blocks = {n.input[1]: fmt.block_for(int(floats[n.input[1]].dims[0])) for n in chosen} if fmt.block else {}
    quantized_weights = {n.input[1] for n in chosen}  # before the rewrite renames weight-only MatMuls' inputs
    quantized_nodes = _rewrite(graph, chosen, fmt, opset, blocks)

    # each weight becomes its int8 tensor (same bytes on disk until it streams), then its scales
    # (and, dynamic, zero points) as placeholders, filled when the weight passes
    pending: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    initializers = []
    for tensor in graph.initializer:  # copies: a weight's bytes are external or small here
        copy = TensorProto()
        copy.CopyFrom(tensor)
        initializers.append(copy)
        if copy.name in quantized_weights:
            original, rows, channels = copy.name, int(copy.dims[0]), int(copy.dims[1])
            copy.name = f"{original}_quantized"
            scale_dims = [rows // blocks[original], channels] if fmt.block else [channels]
            initializers.append(TensorProto(name=f"{original}_scale", data_type=TensorProto.FLOAT, dims=scale_dims))
            if not fmt.block:
                initializers.append(TensorProto(name=f"{original}_zero_point", dims=[channels],
                                                data_type=TensorProto.INT8 if fmt.signed else TensorProto.UINT8))
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    del initializers

    roles = {f"{w}{suffix}": (role, w) for w in quantized_weights
             for suffix, role in (("_quantized", "weight"), ("_scale", "scale"), ("_zero_point", "zero"))}

    def transform(tensor: Any, value: np.ndarray | None, scratch: Any) -> np.ndarray | None:
        role, original = roles.get(tensor.name, ("", tensor.name))
        if role == "weight":
            if original in steps:
                value = steps[original](value)
            if fmt.block:
                values, scale = quantize_blocked(value, blocks[original], scratch)
                zero = None
            else:
                values, scale, zero = quantize_per_channel(value, fmt, scratch)
            pending[original] = (scale, zero)
            return values
        if role == "scale":
            return (pending.pop(original) if fmt.block else pending[original])[0]
        if role == "zero":
            return pending.pop(original)[1]
        return steps[original](value) if original in steps else None

    more = finish(model) if finish is not None else None

    def both(tensor: Any, value: np.ndarray | None, scratch: Any) -> np.ndarray | None:
        changed = transform(tensor, value, scratch)
        if more is None:
            return changed
        again = more(tensor, value if changed is None else changed, scratch)
        return changed if again is None else again

    toposort(graph)
    stream_initializers(model, source.parent, target, both, advance=advance)
    if pending:
        raise RuntimeError(f"scales of {sorted(pending)[:3]} were never written")
    counts = {"quantized_matmuls": quantized_nodes, "quantized_weights": len(quantized_weights)}
    if fmt.block:
        counts["block_sizes"] = {str(size): sum(1 for b in blocks.values() if b == size) for size in sorted(set(blocks.values()))}
    return counts


def _rewrite(graph: Any, matmuls: list[Any], fmt: WeightFormat, opset: int, blocks: Mapping[str, int]) -> int:
    """Replace each of ``matmuls`` in ``graph`` by onnxruntime's dynamic-quantisation nodes (its
    names), one ``DynamicQuantizeLinear`` per activation; weight-only (``fmt.block``), put a
    blocked ``DequantizeLinear`` of its weight (``blocks[weight]`` rows a block) before each."""
    from onnx import TensorProto, helper

    chosen = {id(n) for n in matmuls}
    quantized_inputs: set[str] = set()
    nodes = []
    for index, node in enumerate(graph.node):
        if id(node) not in chosen:
            nodes.append(node)
            continue
        x, w = node.input
        y = node.output[0]
        name = node.name or f"MatMul_{index}"
        if fmt.block:
            if w not in quantized_inputs:  # one DequantizeLinear per weight, however many MatMuls read it
                quantized_inputs.add(w)
                nodes.append(helper.make_node("DequantizeLinear", [f"{w}_quantized", f"{w}_scale"], [f"{w}_dequantized"],
                                              name=f"{w}_DequantizeLinear", axis=0, block_size=blocks[w]))
            node.input[1] = f"{w}_dequantized"
            nodes.append(node)
            continue
        if x not in quantized_inputs:
            quantized_inputs.add(x)
            nodes += _quantize_rows(x, opset) if fmt.per_row else [helper.make_node(
                "DynamicQuantizeLinear", [x], [f"{x}_quantized", f"{x}_scale", f"{x}_zero_point"], name=f"{x}_QuantizeLinear")]
        scales = f"{name}_quant_scales_mul:0"
        nodes += [
            helper.make_node("Mul", [f"{x}_scale", f"{w}_scale"], [scales], name=f"{name}_quant_scales_mul"),
            helper.make_node("MatMulInteger", [f"{x}_quantized", f"{w}_quantized",
                                               _ROW_ZERO_NAME if fmt.per_row else f"{x}_zero_point", f"{w}_zero_point"],
                             [f"{y}_output_quantized"], name=f"{name}_quant"),
            helper.make_node("Cast", [f"{y}_output_quantized"], [f"{y}_output_quantized_cast_output"],
                             name=f"{y}_output_quantized_cast", to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"{y}_output_quantized_cast_output", scales], [y], name=f"{name}_quant_output_scale_mul"),
        ]
    if fmt.per_row and matmuls:
        graph.initializer.extend(_row_constants())
    del graph.node[:]
    graph.node.extend(nodes)
    return len(matmuls)


#: per-row activations: symmetric, 255 levels, stored uint8 around a zero point of 128 (the fast
#: U8S8 kernels take a scalar zero point only)
_ROW_LEVELS, _ROW_ZERO = 127.0, 128
_ROW_ZERO_NAME = "kvembed_row_zero"


def _quantize_rows(x: str, opset: int) -> list[Any]:
    """Nodes quantising activation ``x`` per row (its last axis holds a row's channels), giving
    ``DynamicQuantizeLinear``'s names for the values (``x_quantized``, ``x_scale`` [..., 1]; the
    zero point is the one constant :data:`_ROW_ZERO_NAME`): a massive token no longer sets the scale of every other token."""
    from onnx import TensorProto, helper

    return [
        helper.make_node("Abs", [x], [f"{x}_abs"], name=f"{x}_row_abs"),
        # ReduceMax takes its axes as an input from opset 18 on, as an attribute before
        helper.make_node("ReduceMax", [f"{x}_abs", "kvembed_row_axis"], [f"{x}_row_max"], name=f"{x}_row_max", keepdims=1)
        if opset >= 18 else
        helper.make_node("ReduceMax", [f"{x}_abs"], [f"{x}_row_max"], name=f"{x}_row_max", keepdims=1, axes=[-1]),
        helper.make_node("Max", [f"{x}_row_max", "kvembed_row_floor"], [f"{x}_row_peak"], name=f"{x}_row_peak"),
        helper.make_node("Div", [f"{x}_row_peak", "kvembed_row_levels"], [f"{x}_scale"], name=f"{x}_row_scale"),
        helper.make_node("Div", [x, f"{x}_scale"], [f"{x}_row_scaled"], name=f"{x}_row_divide"),
        helper.make_node("Round", [f"{x}_row_scaled"], [f"{x}_row_rounded"], name=f"{x}_row_round"),
        helper.make_node("Add", [f"{x}_row_rounded", "kvembed_row_zero_float"], [f"{x}_row_shifted"], name=f"{x}_row_shift"),
        helper.make_node("Cast", [f"{x}_row_shifted"], [f"{x}_quantized"], name=f"{x}_row_cast", to=TensorProto.UINT8),
    ]


def _row_constants() -> list[Any]:
    from onnx import numpy_helper

    return [
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "kvembed_row_axis"),
        numpy_helper.from_array(np.array(np.finfo(np.float32).tiny, dtype=np.float32), "kvembed_row_floor"),
        numpy_helper.from_array(np.array(_ROW_LEVELS, dtype=np.float32), "kvembed_row_levels"),
        numpy_helper.from_array(np.array(float(_ROW_ZERO), dtype=np.float32), "kvembed_row_zero_float"),
        numpy_helper.from_array(np.array(_ROW_ZERO, dtype=np.uint8), _ROW_ZERO_NAME),
    ]
