"""SmoothQuant folded into an fp32 graph, so that dynamic int8 survives trained weights.

Trained LLMs put large activations in a few fixed channels (RMSNorm outputs, ``down_proj``'s
input). Dynamic int8 quantises each activation tensor with one scale, so those channels squeeze
every other channel into a handful of levels. SmoothQuant (Xiao et al., 2023) moves that range
into the weights: for a MatMul ``X @ W`` and per-channel factors ``s``, ``(X / s) @ (s[:, None] * W)``
is the same product, and with ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` both factors
quantise well.

The division by ``s`` is folded into whatever makes ``X``, so the graph gains no node:

- ``X = x * w`` with a constant vector ``w`` (RMSNorm's weight, feeding q/k/v or gate/up):
  ``w / s``;
- ``X = a * (h @ U)`` (SwiGLU: ``silu(gate) * up`` feeding ``down_proj``): ``U``'s columns / ``s``.

A MatMul input made any other way (``o_proj``'s, after the attention) is left as it is; so is one
that anything besides constant-weight MatMuls reads, because then ``X`` itself must not change (a
method pooling it). ``max|X_j|`` comes from running the fp32 graph on calibration texts.

Measured on SmolLM2-135M (``benchmarks/experiments/int8_options.py``): one alpha for all groups did better
end to end than a per-group alpha chosen by the int8 error it leaves on calibration rows, and
smoothing ``o_proj``'s input through an inserted Mul gained nothing, so neither is here.
onnxruntime's own SmoothQuant (``quantize_static(extra_options={"SmoothQuant": True})``) needs
Intel Neural Compressor and applies only to static quantisation, hence this pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Tuple

import numpy as np

from ...errors import InvalidInput

#: SmoothQuant's migration strength: of those measured on a trained model, the one the gate liked
#: best (benchmarks/log/int8.md, int8 options)
DEFAULT_ALPHA = 0.65
#: calibration texts: the first of the built-in calibration set, as queries and as documents
CALIBRATION_TEXTS = 64
#: texts per calibration batch: each batch streams every weight once (the calibration session
#: packs no weights), so fewer, larger batches of like length are faster; the ranges are maxima
#: over real tokens and do not depend on it
CALIBRATION_BATCH = 16


@dataclass
class SmoothGroup:
    """The weight MatMuls that read one activation, and where its scale is folded."""

    activation: str
    weights: list[str]  # initializer names of the MatMuls' B ([in, out])
    nodes: list[str]  # the MatMuls' names
    fold_kind: str  # "vector": a constant vector Mul makes X; "columns": X = a * (h @ U), U's columns
    fold_weight: str  # the initializer the 1/s goes into


def smoothable_groups(model: Any) -> list[SmoothGroup]:
    """The groups of an fp32 ``onnx.ModelProto`` whose activation scale can be folded (module docstring)."""
    from ..onnx_nodes import node_edges

    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    producer, consumers = node_edges(graph)
    outputs = {o.name for o in graph.output}

    def weight_matmul(node: Any, activation: str) -> bool:
        return (node.op_type == "MatMul" and node.input[0] == activation and node.input[1] in initializers
                and len(initializers[node.input[1]].dims) == 2)

    def read_once(name: str, reader: Any | None = None) -> bool:
        users = consumers.get(name, [])
        return name not in outputs and len(users) == 1 and (reader is None or users[0] is reader)

    groups = []
    seen: set[str] = set()
    for node in graph.node:
        activation = node.input[0] if node.op_type == "MatMul" else ""
        if not activation or activation in seen:
            continue
        seen.add(activation)
        readers = consumers.get(activation, [])
        made_by = producer.get(activation)
        if activation in outputs or not all(weight_matmul(r, activation) for r in readers):
            continue
        if made_by is None or made_by.op_type != "Mul":
            continue
        width = initializers[node.input[1]].dims[0]
        fold = None
        for name in made_by.input:
            tensor = initializers.get(name)
            if tensor is not None and list(tensor.dims) == [width] and read_once(name):
                fold = ("vector", name)
        for name in made_by.input:
            up = producer.get(name)
            if (fold is None and up is not None and up.op_type == "MatMul" and up.input[1] in initializers
                    and list(initializers[up.input[1]].dims)[-1:] == [width] and read_once(name, made_by)
                    and read_once(up.input[1])):
                fold = ("columns", up.input[1])
        if fold is not None:
            groups.append(SmoothGroup(activation, [r.input[1] for r in readers], [r.name for r in readers], *fold))
    return groups


def calibration_feeds(encoder: Any, texts: list[str] | None = None, batch: int = CALIBRATION_BATCH) -> list[dict[str, np.ndarray]]:
    """Padded batches of ``texts`` (default: the built-in calibration set's first
    :data:`CALIBRATION_TEXTS`, which the parity gate does not use) as queries and as documents,
    encoded by ``encoder`` (a TextEncoder). Texts of like length share a batch: the ranges are
    maxima over real tokens, so the batching does not change them, only the padding run and the
    activations held at once."""
    if texts is None:
        from ...modeling.layers.calibration import load_calibration

        texts = load_calibration(None, CALIBRATION_TEXTS)
    feeds = []
    for kind in encoder.method.templates:
        encoded = sorted(encoder.encode(texts, kind), key=lambda e: len(e.ids))
        feeds += [encoder.pad(encoded[start:start + batch], "right") for start in range(0, len(encoded), batch)]
    return feeds


def activation_ranges(source: Path, groups: list[SmoothGroup], feeds: Iterable[Mapping[str, np.ndarray]],
                      advance: Callable[[int, int], None] | None = None) -> dict[str, np.ndarray]:
    """Per-channel ``max |X_j|`` of each group's activation over the real tokens of ``feeds``.

    The fp32 graph runs with each activation's per-channel maximum over the real tokens added as
    an output (``ReduceMax(|X| * mask)``: padding contributes zeros, and ``|X| >= 0``), computed in
    the graph so that a batch returns a vector per activation, not every activation of every
    layer. The copy is written beside ``source`` so external weight files resolve, and removed
    afterwards."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(source), load_external_data=False)
    wanted = _add_channel_maxima(model, [g.activation for g in groups])
    probe = source.with_name(f".calibrate-{source.name}")
    onnx.save(model, str(probe))
    del model
    ranges: dict[str, np.ndarray] = {}
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the activations as traced
        options.add_session_config_entry("session.disable_prepacking", "1")  # no packed copy of the weights
        options.enable_cpu_mem_arena = False  # batches of many shapes: give activations back after each
        session = ort.InferenceSession(str(probe), options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        feeds = list(feeds)
        for done, batch in enumerate(feeds, 1):
            if np.asarray(batch["attention_mask"], dtype=bool).any():
                values = session.run(list(wanted.values()), {k: v for k, v in batch.items() if k in names})
                for name, top in zip(wanted, values):
                    ranges[name] = np.maximum(ranges[name], top) if name in ranges else top
            if advance is not None:
                advance(done, len(feeds))
    finally:
        probe.unlink(missing_ok=True)
    if groups and not ranges:
        raise InvalidInput("no calibration tokens: SmoothQuant needs at least one non-empty text")
    return ranges


def _add_channel_maxima(model: Any, activations: list[str]) -> dict[str, str]:
    """Add to ``model`` an output per activation: its per-channel max of ``|X|`` over the real
    tokens (``X`` seen as ``[batch, sequence, channels]``, the attention mask's shape first);
    activation -> output name."""
    from onnx import TensorProto, helper

    graph = model.graph
    prefix = "kvembed_calibration"
    nodes = [
        helper.make_node("Cast", ["attention_mask"], [f"{prefix}_mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", [f"{prefix}_mask", f"{prefix}_last"], [f"{prefix}_mask3"]),
        helper.make_node("Shape", ["attention_mask"], [f"{prefix}_rows"]),
        helper.make_node("Concat", [f"{prefix}_rows", f"{prefix}_last"], [f"{prefix}_shape"], axis=0),
    ]
    graph.initializer.extend([
        helper.make_tensor(f"{prefix}_last", TensorProto.INT64, [1], [-1]),
        helper.make_tensor(f"{prefix}_tokens", TensorProto.INT64, [2], [0, 1]),
    ])
    outputs = {}
    for index, name in enumerate(activations):
        tag = f"{prefix}_{index}"
        nodes += [
            helper.make_node("Reshape", [name, f"{prefix}_shape"], [f"{tag}_x"]),
            helper.make_node("Abs", [f"{tag}_x"], [f"{tag}_abs"]),
            helper.make_node("Mul", [f"{tag}_abs", f"{prefix}_mask3"], [f"{tag}_real"]),
            helper.make_node("ReduceMax", [f"{tag}_real", f"{prefix}_tokens"], [f"{tag}_top"], keepdims=0),
        ]
        graph.output.append(helper.make_tensor_value_info(f"{tag}_top", TensorProto.FLOAT, None))
        outputs[name] = f"{tag}_top"
    graph.node.extend(nodes)
    return outputs


#: one step of a weight's smoothing: ("rows", s) multiplies row i by s[i]; ("divide", s) divides a
#: vector by s, ("columns", s) divides column j by s[j]
Step = Tuple[str, np.ndarray]


def smoothing_plan(read: Callable[[str], np.ndarray], groups: list[SmoothGroup], ranges: Mapping[str, np.ndarray],
                   alpha: float = DEFAULT_ALPHA) -> dict[str, list[Step]]:
    """The SmoothQuant steps for each weight (by name), in order; ``read(name)`` gives a weight as
    stored, in an array the plan may overwrite (a copy, or a buffer reused per read). Group by
    group as in the graph: a group's weights are seen with the steps of the groups before it
    applied (``up_proj`` is both gate/up's weight and down_proj's fold)."""
    if not 0.0 < alpha < 1.0:
        raise InvalidInput(f"SmoothQuant alpha must be in (0, 1), got {alpha!r}")
    plan: dict[str, list[Step]] = {}

    def row_peaks(name: str) -> np.ndarray:  # max |w| per row after the earlier groups' steps
        value = apply_steps(np.array(read(name), dtype=np.float32, copy=None), plan.get(name, []), in_place=True)
        return np.maximum(value.max(axis=1), -value.min(axis=1))

    for group in groups:
        x_max = np.maximum(ranges[group.activation].astype(np.float64), 1e-5)
        w_max = np.max([row_peaks(name) for name in group.weights], axis=0)
        w_max = np.maximum(w_max.astype(np.float64), 1e-5)
        s = np.clip(x_max**alpha / w_max ** (1.0 - alpha), 1e-5, 1e5).astype(np.float32)
        for name in group.weights:
            plan.setdefault(name, []).append(("rows", s))
        plan.setdefault(group.fold_weight, []).append(("divide" if group.fold_kind == "vector" else "columns", s))
    return plan


def apply_steps(value: np.ndarray, steps: list[Step], in_place: bool = False) -> np.ndarray:
    """``value`` (float32) after ``steps`` (:func:`smoothing_plan`); ``in_place``: in ``value``
    itself (a float32 array the caller owns), with no temporary of its size."""
    for kind, s in steps:
        factor = s[:, None] if kind == "rows" else s if kind == "divide" else s[None, :]
        if in_place:
            np.multiply(value, factor, out=value) if kind == "rows" else np.divide(value, factor, out=value)
        else:
            value = value * factor if kind == "rows" else value / factor
    return value


def smooth(model: Any, groups: list[SmoothGroup], ranges: Mapping[str, np.ndarray], alpha: float = DEFAULT_ALPHA) -> None:
    """Fold SmoothQuant factors into the weights of ``model`` (loaded with its weights), in place."""
    from onnx import numpy_helper

    tensors = {t.name: t for t in model.graph.initializer}
    plan = smoothing_plan(lambda name: numpy_helper.to_array(tensors[name]).astype(np.float32), groups, ranges, alpha)
    for name, steps in plan.items():
        value = apply_steps(numpy_helper.to_array(tensors[name]).astype(np.float32), steps)
        tensors[name].CopyFrom(numpy_helper.from_array(value, name))


def smoothing_plan_from_file(source: Path, groups: list[SmoothGroup], ranges: Mapping[str, np.ndarray],
                             alpha: float = DEFAULT_ALPHA) -> dict[str, list[Step]]:
    """:func:`smoothing_plan` of the graph at ``source``, reading one weight at a time instead of
    loading the model; the quantiser folds the steps in as the weights stream through
    (:func:`kvembed.export.precision.quantize.quantize_matmuls`)."""
    import onnx

    from ...artifact.external_data import Scratch, read_values

    model = onnx.load(str(source), load_external_data=False)
    tensors = {t.name: t for t in model.graph.initializer}
    scratch = Scratch()  # one weight at a time, read into one reused buffer

    def read(name: str) -> np.ndarray:
        return read_values(tensors[name], source.parent, scratch)

    return smoothing_plan(read, groups, ranges, alpha)


def massive_input_nodes(groups: list[SmoothGroup], ranges: Mapping[str, np.ndarray], spread: float) -> list[str]:
    """MatMuls whose input's largest channel exceeds ``spread`` x its median channel: the
    massive activations that no per-tensor int8 scale holds, even smoothed."""
    return [node for group in groups
            if ranges[group.activation].max() > spread * max(float(np.median(ranges[group.activation])), 1e-12)
            for node in group.nodes]


__all__ = ["DEFAULT_ALPHA", "SmoothGroup", "activation_ranges", "apply_steps", "calibration_feeds",
           "massive_input_nodes", "smooth", "smoothable_groups", "smoothing_plan", "smoothing_plan_from_file"]
