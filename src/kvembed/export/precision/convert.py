"""fp16 and int8 variants of a traced fp32 graph (a bf16 artifact keeps the fp32 graph: see
:mod:`kvembed.export.gate.certify`).

fp16: weights and activations in fp16, inputs int64 and outputs float32 as in fp32, and fp32
islands for what must stay fp32 (Casts only where the two meet):

- the position / mask machinery (RoPE angles, the additive attention mask, pooling weights):
  every float node that does not depend on a model weight. RoPE angles of late positions lose
  whole radians in fp16, and the mask's large negative constants overflow;
- the attention logits' mask ``Add`` and the ``Softmax`` after it;
- RMSNorm statistics (``Pow -> ReduceMean -> Add(eps) -> Sqrt``, divided into ``x`` by a ``Div``): the square of a
  massive activation overflows fp16;
- sums over the sequence (``ReduceSum``) and the final L2 norm (``ReduceL2``).

onnxruntime's float16 converter (the onnxconverter-common algorithm) is not used: it makes every
blocked node an island, casting each output back to fp16 even when only fp32 nodes read it, so
the mask's float32-min constant becomes -inf on the way and fully padded rows turn into NaN; it
also emits duplicate Cast outputs and unsorted nodes when a node block list is given.

int8: a recipe of :data:`INT8_RECIPES`; the token-embedding tables, int8 with a scale per row
(:mod:`kvembed.export.precision.embedding_table`), in every recipe. ``--int8-recipe auto`` tries
:data:`INT8_AUTO` in turn and writes the first that passes the parity gate and the held-out texts.
First "weights": weight-only int8, every weight MatMul's weight int8 with a scale per block of input
rows, dequantised before a float MatMul (:mod:`kvembed.export.precision.quantize`; opset 21),
activations never quantised, so no outlier token can spoil its neighbours; onnxruntime runs it at
the accuracy level kvembed pins in every session it opens, the gate's included
(:data:`kvembed.backends.onnxruntime.WEIGHT_ONLY_ACCURACY`).

Then the dynamic recipes: the MatMul weights quantised as onnxruntime's ``quantize_dynamic`` writes
them (int8 per output channel, in a 7-bit range; activations uint8, quantised at run time), computed
one weight at a time by :mod:`kvembed.export.precision.quantize`. Random weights quantise well as
they are; trained LLMs do not (with every MatMul quantised they miss the gate), because a few
channels, and a few tokens, carry activations tens to thousands of times the median. A per-tensor
activation scale then follows the one massive token and leaves the others a handful of levels, so
these recipes give each token its own scale (``per_row``: the activation is quantised symmetric
around a zero point of 128, one scale per row, which the fast U8S8 kernels still run), calibrate on
the built-in calibration texts and fold SmoothQuant into the weights
(:mod:`kvembed.export.precision.smoothing`) for the outlier channels ("smooth-rows"), then also keep
every SwiGLU ``down_proj`` fp32 ("smooth-rows-keep-down"), then fall back to per-tensor scales with
every ``down_proj`` fp32 ("smooth-keep-down"). Their error differs from token to token, which is why
they come after "weights". The other per-tensor recipes ("smooth", which keeps fp32 the MatMuls
whose inputs hold massive activations, "smooth-keep-wide-down", "plain") stay
available by name. ``benchmarks/experiments/int8_options.py`` measures the alternatives (benchmarks/log/int8.md).

Weights are int8 (U8S8, onnxruntime's fast kernel) quantised to 7 bits (``reduce_range``): on
x86 CPUs without VNNI (AVX2 / AVX-512F only) onnxruntime's U8S8 kernel adds pairs of u8 x s8
products in saturating int16 (``vpmaddubsw``), and full-range int8 weights overflow it (the
gate's cosine collapses there); with 7-bit weights a pair stays within 2 x 255 x 64 = 32,640,
below int16's limit, the remedy onnxruntime's quantization guide names. uint8 weights (U8U8) avoid
saturation too but run a slower kernel, and are less accurate with VNNI (benchmarks/log/int8.md). The file must hold on every CPU it is copied to, so the export does not pick by the
exporting machine. It yields ``DynamicQuantizeLinear``/``MatMulInteger``: standard ONNX ops
that onnxruntime runs fast on CPU, but TensorRT does not support (build TensorRT engines from the
fp32 or fp16 artifact and let TensorRT pick precisions).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ...artifact.external_data import settle_layout, stream_initializers
from ..onnx_nodes import node_edges, node_inputs, toposort
from .smoothing import DEFAULT_ALPHA
from ...errors import InvalidInput, shown, with_hint

#: int8 keeps fp32 the MatMuls whose input's top channel exceeds this many times its median channel
MASSIVE_SPREAD = 50.0
#: "smooth-keep-wide-down" also keeps fp32 the down_projs whose input spreads over this
WIDE_DOWN_SPREAD = 10.0
#: "weights": input rows per int8 weight scale (benchmarks/log/int8.md, "Weight-only int8")
WEIGHT_BLOCK = 64

#: what ``--precision`` takes (bf16: the fp32 graph, certified on OpenVINO's bf16 hint)
PRECISIONS = ("fp32", "fp16", "bf16", "int8")

#: op types kept in fp32 wherever they occur
FP32_OPS = (
    "Softmax",
    "ReduceL2",
    "ReduceSum",
    "ReduceMean",
    "Pow",
    "Sqrt",
    "Reciprocal",
    "Cos",
    "Sin",
    "CumSum",
    "ArgMax",
    "Range",
)
#: element-wise ops that stay fp32 when all their float inputs are fp32 already (eps adds, ...)
_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Neg", "Clip", "Max", "Min", "Where", "Expand", "Reshape",
                "Unsqueeze", "Squeeze", "Concat", "Slice", "Transpose", "Cast", "Identity", "Sqrt",
                "Reciprocal", "Gather", "GatherElements"}


def check_precision(precision: str) -> str:
    """``precision`` normalised, or a one-line error naming the choices. bf16 is not a conversion:
    the artifact holds the fp32 graph, gated and run at bf16 by OpenVINO (:mod:`kvembed.export.gate.certify`;
    onnxruntime's CPU provider has no bf16 kernels)."""
    value = str(precision).strip().lower()
    if value not in PRECISIONS:
        raise InvalidInput(with_hint(f"precision must be one of {', '.join(PRECISIONS)}, got {shown(precision)}", value, PRECISIONS))
    return value


def convert(source: Path, target: Path, precision: str, *, int8_recipe: str = "plain",
            calibration: Sequence[Mapping[str, Any]] | None = None,
            ranges: dict[str, Any] | None = None, step: Callable[[str], None] | None = None,
            advance: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Write ``source`` (fp32) converted to ``precision`` as ``target``; return what was done.
    ``ranges`` and ``step``: see :func:`to_int8`; ``advance(done, total)``: each part's share done.
    ``precision`` was checked where the export entered (:class:`~kvembed.export.request.ExportRequest`)."""
    if precision == "fp16":
        return to_fp16(source, target, advance)
    if precision == "int8":
        return to_int8(source, target, int8_recipe, calibration, ranges, step, advance)
    raise ValueError(f"no conversion to {precision!r}: fp16 and int8 are converted, fp32 and bf16 keep the fp32 graph")


def fp32_nodes(model: Any, float_values: set[str] | None = None) -> list[str]:
    """Names of the nodes of an fp32 ``onnx.ModelProto`` that must stay fp32 in the fp16 graph."""
    import onnx

    graph = model.graph
    # matrices (token embeddings, projections): every activation descends from one of them;
    # vectors (norm weights, RoPE inverse frequencies) do not start an activation path
    weights = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) >= 2}
    float_values = _float_values(model) if float_values is None else float_values
    # values that carry the model's activations: downstream of any float weight
    active: set[str] = set()
    for node in graph.node:  # graph.node is topologically sorted
        if any(i in weights or i in active for i in node.input):
            active.update(node.output)
    keep: set[str] = set()
    producer, consumers = node_edges(graph)
    for node in graph.node:
        produces_float = any(o in float_values for o in node.output)
        if node.op_type in FP32_OPS:
            keep.add(node.name)
        elif produces_float and not any(o in active for o in node.output):
            keep.add(node.name)  # mask / position machinery
        elif node.op_type == "Add" and any(c.op_type == "Softmax" for o in node.output for c in consumers.get(o, ())):
            keep.add(node.name)  # logits + mask
    # forward closure: cheap element-wise nodes fed only by fp32 nodes stay fp32
    changed = True
    while changed:
        changed = False
        for node in graph.node:
            if node.name in keep or node.op_type not in _ELEMENTWISE:
                continue
            fed = [producer[i] for i in node.input if i in producer and i in float_values]
            from_weights = [i for i in node.input if i in weights]
            if fed and not from_weights and all(p.name in keep for p in fed):
                keep.add(node.name)
                changed = True
    return sorted(keep)


def to_fp16(source: Path, target: Path, advance: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Convert the fp32 graph at ``source`` to fp16 at ``target`` (see the module docstring).

    The graph is rewritten without its weights; they are then converted one tensor at a time on
    their way to the target's data file (:func:`~kvembed.artifact.external_data.stream_initializers`), so
    the conversion holds one weight at a time, not the model.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(source), load_external_data=False)
    _name_nodes(model)
    graph = model.graph
    floats = _float_values(model)
    keep = set(fp32_nodes(model, floats))
    _, consumers = node_edges(graph)
    graph_outputs = {o.name for o in graph.output}
    # Cast(to=FLOAT) is fp32 when everything it feeds is (e.g. RMSNorm's upcast), else fp16
    for node in graph.node:
        if node.op_type == "Cast" and _attr(node, "to") == TensorProto.FLOAT and node.name not in keep:
            users = [u for o in node.output for u in consumers.get(o, ())]
            if users and all(u.name in keep for u in users) and not any(o in graph_outputs for o in node.output):
                keep.add(node.name)

    def is_fp32(node: Any) -> bool:
        return node.name in keep

    # dtype each float value is produced in
    home: dict[str, int] = {}
    for value in graph.input:
        home[value.name] = value.type.tensor_type.elem_type
    initializers = {t.name: t for t in graph.initializer}
    for name, tensor in initializers.items():
        if tensor.data_type != TensorProto.FLOAT:
            continue
        users = consumers.get(name, [])
        if users and not any(is_fp32(u) for u in users):
            home[name] = TensorProto.FLOAT16  # converted below
        else:
            home[name] = TensorProto.FLOAT
    for node in graph.node:
        dtype = TensorProto.FLOAT if is_fp32(node) else TensorProto.FLOAT16
        for out in node.output:
            if out in floats:
                home[out] = dtype
        if dtype == TensorProto.FLOAT16:
            _retype_node(node)

    # insert casts on every edge whose dtypes disagree
    cast_of: dict[tuple[str, int], str] = {}
    new_nodes: list[Any] = []

    def cast(name: str, to: int) -> str:
        key = (name, to)
        if key not in cast_of:
            suffix = "fp16" if to == TensorProto.FLOAT16 else "fp32"
            out = f"{name}__{suffix}"
            new_nodes.append(helper.make_node("Cast", [name], [out], name=f"{out}__cast", to=to))
            cast_of[key] = out
        return cast_of[key]

    for node in list(graph.node):
        want = TensorProto.FLOAT if is_fp32(node) else TensorProto.FLOAT16
        for index, name in enumerate(node.input):
            if name in floats and name in home and home[name] != want:
                node.input[index] = cast(name, want)
    # outputs stay float32
    for value in graph.output:
        if home.get(value.name) == TensorProto.FLOAT16:
            inner = f"{value.name}__fp16"
            for node in graph.node:
                for index, out in enumerate(node.output):
                    if out == value.name:
                        node.output[index] = inner
                for index, name in enumerate(node.input):
                    if name == value.name:
                        node.input[index] = inner
            new_nodes.append(helper.make_node("Cast", [inner], [value.name], name=f"{value.name}__cast", to=TensorProto.FLOAT))
    graph.node.extend(new_nodes)

    # weights: converted one tensor at a time, on their way to the target's data file
    converted = []

    def to_half(tensor: Any, values: Any, scratch: Any) -> Any:
        """Clamped to fp16's range and rounded to fp16 by torch, in place and into a reused buffer
        (numpy's float-to-half cast is several times slower; the bits are the same)."""
        if values is None or tensor.data_type != TensorProto.FLOAT or home.get(tensor.name) != TensorProto.FLOAT16:
            return None
        import torch

        source = torch.from_numpy(values).clamp_(-_FP16_MAX, _FP16_MAX)
        half = scratch.array("half", values.shape, np.float16)
        torch.from_numpy(half).copy_(source)
        converted.append(tensor.name)
        return half

    del graph.value_info[:]
    toposort(graph)
    _check_io_types(model)
    stream_initializers(model, source.parent, target, to_half, advance=advance)
    external = settle_layout(target)
    counts = Counter(n.op_type for n in graph.node if n.name in keep)
    return {
        "method": "kvembed fp16 conversion: fp16 weights and activations, fp32 islands, float32 outputs",
        "fp32_nodes": len(keep),
        "fp32_op_types": dict(sorted(counts.items())),
        "fp16_weights": len(converted),
        "casts_inserted": len(new_nodes),
        "external_data": external,
    }


_FP16_MAX = 65504.0


def _attr(node: Any, name: str) -> Any:
    from onnx import helper

    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return None


def _retype_node(node: Any) -> None:
    """Make an fp16-region node produce fp16 where an attribute fixes a float32 output type."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    for attribute in node.attribute:
        if node.op_type == "Cast" and attribute.name == "to" and attribute.i == TensorProto.FLOAT:
            attribute.i = TensorProto.FLOAT16
        elif node.op_type in ("Constant", "ConstantOfShape") and attribute.name == "value" and attribute.t.data_type == TensorProto.FLOAT:
            array = numpy_helper.to_array(attribute.t)
            attribute.t.CopyFrom(numpy_helper.from_array(np.clip(array, -_FP16_MAX, _FP16_MAX).astype(np.float16), attribute.t.name))
        elif node.op_type == "Constant" and attribute.name in ("value_float", "value_floats"):
            raise NotImplementedError("Constant value_float(s) in the fp16 region")
        elif attribute.name == "dtype" and attribute.i == TensorProto.FLOAT:
            attribute.i = TensorProto.FLOAT16


class SameGraphError(Exception):
    """An int8 recipe would write exactly the graph an earlier recipe wrote (the same smoothing,
    the same MatMuls kept fp32): the exporter skips it instead of converting and gating again."""

    def __init__(self, recipe: str, same_as: str) -> None:
        super().__init__(f"int8 recipe {recipe} makes the same graph as {same_as}")
        self.recipe, self.same_as = recipe, same_as


@dataclass(frozen=True)
class Int8Recipe:
    """One way to make the int8 graph; :data:`INT8_RECIPES` lists them, fastest first."""

    name: str
    smooth_alpha: float | None  # SmoothQuant strength folded in before quantising (None: no smoothing)
    massive_spread: float | None  # keep fp32 the MatMuls whose input's top channel > spread x median
    keep_down: bool  # keep fp32 every SwiGLU down_proj (its input carries the widest activations)
    summary: str
    weights: str = "s7"  # s7 (U8S8 in a 7-bit range: never saturates), s8 (U8S8: saturates without VNNI) or u8 (U8U8)
    down_spread: float = 0.0  # with keep_down: only the down_projs whose input's top channel > this x median
    int8_tables: bool = True  # token-embedding tables int8 with per-row scales (False: kept fp32)
    per_row: bool = False  # activations quantised with a scale per token (True) or per tensor
    block: int | None = None  # weight-only: int8 weights with a scale per this many input rows, activations float

    @property
    def calibrated(self) -> bool:
        return self.smooth_alpha is not None or self.massive_spread is not None


INT8_RECIPES: dict[str, Int8Recipe] = {r.name: r for r in (
    Int8Recipe("smooth", DEFAULT_ALPHA, MASSIVE_SPREAD, False,
               f"SmoothQuant (alpha {DEFAULT_ALPHA}) folded in; MatMuls with massive inputs (top channel > "
               f"{MASSIVE_SPREAD:g} x median) kept fp32"),
    Int8Recipe("smooth-keep-wide-down", DEFAULT_ALPHA, MASSIVE_SPREAD, True,
               f"as smooth, and the SwiGLU down_projs whose input's top channel > {WIDE_DOWN_SPREAD:g} x median kept fp32",
               down_spread=WIDE_DOWN_SPREAD),
    Int8Recipe("smooth-keep-down", DEFAULT_ALPHA, MASSIVE_SPREAD, True,
               "as smooth, and every SwiGLU down_proj kept fp32"),
    Int8Recipe("plain", None, None, False, "every weight MatMul quantised, no calibration"),
    Int8Recipe("rows", None, None, False, "every weight MatMul quantised, activations with a scale per token",
               per_row=True),
    Int8Recipe("smooth-rows", DEFAULT_ALPHA, None, False,
               f"SmoothQuant (alpha {DEFAULT_ALPHA}) folded in, activations with a scale per token", per_row=True),
    Int8Recipe("smooth-rows-keep-down", DEFAULT_ALPHA, None, True,
               "as smooth-rows, and every SwiGLU down_proj kept fp32", per_row=True),
    Int8Recipe("weights", None, None, False,
               f"weight-only: every weight MatMul's weight int8 with a scale per {WEIGHT_BLOCK} input rows, activations "
               "float; no calibration", block=WEIGHT_BLOCK),
)}
#: ``--int8-recipe auto``: tried in this order, the first that passes the parity gate is written.
#: Weight-only first: its error does not depend on the token (activations stay float), so what the
#: gate and held-out texts see holds on text they never saw; the dynamic recipes (int8 arithmetic)
#: follow, for graphs below its opset, and are there by name for onnxruntime's integer kernels.
INT8_AUTO = ("weights", "smooth-rows", "smooth-rows-keep-down", "smooth-keep-down")


def int8_recipe_help() -> str:
    """``--int8-recipe``'s help, from :data:`INT8_RECIPES` and :data:`INT8_AUTO`."""
    listed = "; ".join(f"{r.name} ({r.summary})" for r in INT8_RECIPES.values())
    return (f"int8 only: one of {listed}; several comma-separated (the first that passes the parity gate "
            f"is written); or auto = {','.join(INT8_AUTO)}. Weight-only recipes need --opset 21 or later (auto "
            "leaves them out below).")


def check_int8_recipe(recipe: str, precision: str, opset: int | None = None) -> tuple[str, ...]:
    """:func:`int8_plan` of ``recipe`` (for a graph of ``opset``); a recipe other than ``auto`` with
    another precision is an error (it would be silently ignored)."""
    plan = int8_plan(recipe, opset if precision == "int8" else None)
    if recipe != "auto" and precision != "int8":
        raise InvalidInput(f"--int8-recipe {recipe} applies to --precision int8 only (got --precision {precision}); "
                         "drop it or export int8")
    return plan


def int8_plan(recipe: str, opset: int | None = None) -> tuple[str, ...]:
    """The recipes to try, in order, for ``--int8-recipe``: ``auto``, one name, or several
    separated by commas (tried in that order); ValueError naming the choices. With the graph's
    ``opset``, a weight-only recipe needs :data:`~kvembed.export.precision.quantize.BLOCKED_OPSET`: ``auto``
    leaves it out below that, a recipe named is refused."""
    if recipe == "auto":
        return tuple(name for name in INT8_AUTO if opset is None or opset >= _needed_opset(name))
    names = tuple(name.strip() for name in str(recipe).split(","))
    unknown = [name for name in names if name not in INT8_RECIPES]
    if unknown or len(set(names)) != len(names):
        raise InvalidInput(f"int8 recipe must be auto, or one or more (comma-separated, no repeats) of "
                         f"{', '.join(INT8_RECIPES)}, got {recipe!r}")
    for name in names:
        if opset is not None and opset < _needed_opset(name):
            raise InvalidInput(f"int8 recipe {name} needs ONNX opset {_needed_opset(name)} or later (blocked "
                               f"DequantizeLinear), and this export uses opset {opset}: add --opset {_needed_opset(name)}")
    return names


def _needed_opset(recipe: str) -> int:
    from .quantize import BLOCKED_OPSET

    return BLOCKED_OPSET if INT8_RECIPES[recipe].block else 11


def to_int8(source: Path, target: Path, recipe: str | Int8Recipe = "plain",
            calibration: Sequence[Mapping[str, Any]] | None = None,
            ranges: dict[str, Any] | None = None, step: Callable[[str], None] | None = None,
            advance: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Quantise the fp32 graph ``source`` by ``recipe`` (one of :data:`INT8_RECIPES` or its name) to ``target``.

    ``calibration`` (padded batches of graph inputs, see :func:`kvembed.export.precision.smoothing.calibration_feeds`)
    is needed by the recipes that smooth or keep MatMuls fp32. ``ranges`` (a dict the caller
    keeps across recipes tried on the same ``source`` and ``calibration``) holds the calibration's
    activation ranges once measured, so a fallback recipe does not run the fp32 graph again.
    ``step(detail)`` is told as each part (calibrating, smoothing, quantising) begins, and
    ``advance(done, total)`` each part's share done."""
    import numpy as np
    import onnx

    from .embedding_table import EmbeddingTables
    from .quantize import WeightFormat, quantize_matmuls
    from .smoothing import activation_ranges, apply_steps, massive_input_nodes, smoothable_groups, smoothing_plan_from_file

    plan = recipe if isinstance(recipe, Int8Recipe) else INT8_RECIPES[recipe]
    facts: dict[str, Any] = {"recipe": plan.name, "recipe_summary": plan.summary}
    keep: list[str] = []
    if plan.calibrated or plan.keep_down:
        groups = smoothable_groups(onnx.load(str(source), load_external_data=False))
    if plan.calibrated or (plan.keep_down and plan.down_spread):
        if calibration is None:
            raise ValueError(f"int8 recipe {plan.name} needs calibration batches")
        if ranges is None or "activations" not in ranges:
            if step is not None:
                step(f"calibrating: the fp32 graph on {len(calibration)} batches")
            measured = activation_ranges(source, groups, calibration, advance)
            if ranges is not None:
                ranges["activations"] = measured
        else:
            measured = ranges["activations"]
    if plan.keep_down:
        keep += massive_input_nodes([g for g in groups if g.fold_kind == "columns"], measured, plan.down_spread) \
            if plan.down_spread else [n for g in groups if g.fold_kind == "columns" for n in g.nodes]
    if plan.calibrated and plan.massive_spread is not None:
        keep += massive_input_nodes(groups, measured, plan.massive_spread)
    if ranges is not None:  # a recipe that would write a graph already tried gives the same gate result
        made = ranges.setdefault("graphs", {})
        signature = (plan.smooth_alpha, plan.weights, plan.int8_tables, plan.per_row, plan.block, tuple(sorted(set(keep))))
        if signature in made:
            raise SameGraphError(plan.name, made[signature])
        made[signature] = plan.name
    folds: dict[str, Callable[[Any], Any]] = {}
    if plan.calibrated:
        if plan.smooth_alpha is not None:
            if step is not None:
                step(f"smoothing: SmoothQuant's factors from the weights (recipe {plan.name})")
            smoothing = smoothing_plan_from_file(source, groups, measured, plan.smooth_alpha)
            # the streamed weight is float32 in a buffer of the stream's: smoothed in place
            folds = {name: (lambda value, steps=steps: apply_steps(np.asarray(value, dtype=np.float32), steps, in_place=True))
                     for name, steps in smoothing.items()}
        facts.update({"smoothquant_alpha": plan.smooth_alpha, "smoothed_activations": len(groups) if plan.smooth_alpha else 0,
                      "calibration_batches": len(calibration)})
    if step is not None:
        step(f"quantising: {'weight-only int8 in blocks' if plan.block else 'dynamic int8 per channel'}, one weight at a "
             f"time{' with smoothing folded in' if folds else ''} (recipe {plan.name})")
    # int8 weights in 7 bits by default: no int16 saturation on CPUs without VNNI (module docstring)
    fmt = WeightFormat(signed=plan.weights != "u8", reduce_range=plan.weights == "s7", per_row=plan.per_row, block=plan.block)
    tables = EmbeddingTables()
    counts = quantize_matmuls(source, target, fmt, exclude=sorted(set(keep)), steps=folds, advance=advance,
                              finish=tables.rewrite if plan.int8_tables else None)
    if plan.block:
        facts.update(weight_only_facts(plan.block, counts, len(set(keep)), tables.facts))
        facts["external_data"] = settle_layout(target)
        return facts
    facts.update({
        "method": "dynamic int8 MatMuls as onnxruntime.quantization.quantize_dynamic(MatMul, per_channel=True, "
                  f"{'QUInt8' if plan.weights == 'u8' else 'QInt8'} weights{', reduce_range=True' if plan.weights == 's7' else ''}) "
                  "writes them (kvembed.export.precision.quantize, bitwise equal)",
        "weight_type": {"u8": "uint8", "s8": "int8", "s7": "int8 (7-bit range)"}[plan.weights],
        "per_channel": True,
        "activations": "uint8, dynamic, a symmetric scale per token (zero point 128)" if plan.per_row
                       else "uint8, dynamic per-tensor (DynamicQuantizeLinear)",
        "fp32_matmuls": len(set(keep)),
        "quantized_matmuls": counts["quantized_matmuls"],
        "embedding_tables": tables.facts,  # [] when none, or the recipe keeps them fp32
    })
    facts["external_data"] = settle_layout(target)
    return facts


def weight_only_facts(block: int, counts: Mapping[str, Any], fp32_matmuls: int, tables: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's ``precision_conversion`` of a weight-only graph: the storage, and the
    arithmetic onnxruntime is pinned to when it runs it (the gate's session and the runtime's alike)."""
    from ...backends.catalogue import BACKENDS

    onnxruntime = BACKENDS["onnxruntime"].load()
    ACCURACY_LEVEL_KEY, WEIGHT_ONLY_ACCURACY = onnxruntime.ACCURACY_LEVEL_KEY, onnxruntime.WEIGHT_ONLY_ACCURACY

    return {
        "method": "weight-only int8: blocked DequantizeLinear (opset 21, axis 0) feeding each float MatMul "
                  "(kvembed.export.precision.quantize); onnxruntime fuses the pair into com.microsoft MatMulNBits (8 bits)",
        "weight_type": "int8 (symmetric, [-127, 127])",
        "block_size": block,
        "block_sizes": dict(counts["block_sizes"]),  # block -> weights: a smaller one where it does not divide the width
        "scale_type": "float32, one per block of input rows per output column",
        "activations": "float32 (not quantised)",
        "accuracy_level": WEIGHT_ONLY_ACCURACY,
        "session_config": {ACCURACY_LEVEL_KEY: str(WEIGHT_ONLY_ACCURACY)},
        "fp32_matmuls": fp32_matmuls,
        "quantized_matmuls": counts["quantized_matmuls"],
        "embedding_tables": tables,
    }


# -- helpers -----------------------------------------------------------------------------------


def _name_nodes(model: Any) -> None:
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)


def _float_values(model: Any) -> set[str]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)  # weights may be external: only types matter
    floats = set()
    for info in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input):
        if info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            floats.add(info.name)
    for tensor in inferred.graph.initializer:
        if tensor.data_type == onnx.TensorProto.FLOAT:
            floats.add(tensor.name)
    for node in inferred.graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.t.data_type == onnx.TensorProto.FLOAT:
                    floats.update(node.output)
    return floats


def _check_io_types(model: Any) -> None:
    import onnx

    for value in model.graph.output:
        if value.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            raise RuntimeError(f"fp16 conversion changed output {value.name} away from float32")
