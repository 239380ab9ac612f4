"""int8 recipes: SmoothQuant folded into the weights, massive-activation MatMuls kept fp32, and
the exporter writing the first recipe that passes the parity gate."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from checks import cosines
from conftest import TEXTS
from kvembed.export.gate.parity import gate_batches
from kvembed.export.precision.convert import INT8_RECIPES, to_int8
from kvembed.export.precision.smoothing import activation_ranges, calibration_feeds, massive_input_nodes, smooth, smoothable_groups
from kvembed.methods import demo_model_path
from kvembed.artifact import load_manifest, read_manifest
from kvembed.runtime.artifact import encoder_from_manifest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: a dynamic recipe (auto's second): SmoothQuant folded in, activations with a scale per token
SMOOTHED = "smooth-rows"


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _embed(path: Path, artifact: Path) -> np.ndarray:
    encoder = encoder_from_manifest(artifact, load_manifest(artifact))
    session = _session(path)
    names = {i.name for i in session.get_inputs()}
    batch = encoder.pad(encoder.encode(TEXTS, "document"), "right")
    return session.run(["embedding"], {k: v for k, v in batch.items() if k in names})[0]


@pytest.fixture(scope="module")
def fp32(stories_artifact, tmp_path_factory) -> tuple[Path, Path]:
    """A private copy of the demo model's fp32 kv-embedding artifact, and its graph."""
    copy = tmp_path_factory.mktemp("int8") / "fp32"
    shutil.copytree(stories_artifact("kv-embedding"), copy)
    return copy, copy / "model.onnx"


def test_smoothing_folds_into_every_layer_and_keeps_the_function(fp32, tmp_path):
    artifact, graph = fp32
    layers = json.loads((demo_model_path() / "config.json").read_text())["num_hidden_layers"]
    structure = onnx.load(str(graph), load_external_data=False)
    groups = smoothable_groups(structure)
    # per layer: q/k/v read input_layernorm's output, gate/up post_attention_layernorm's (both fold
    # into the norm weight); down_proj reads silu(gate) * up (folds into up_proj's columns)
    assert [g.fold_kind for g in groups] == ["vector", "vector", "columns"] * layers
    assert [len(g.nodes) for g in groups] == [3, 2, 1] * layers
    encoder = encoder_from_manifest(artifact, load_manifest(artifact))
    ranges = activation_ranges(graph, groups, calibration_feeds(encoder))
    model = onnx.load(str(graph))
    before = {t.name: numpy_helper.to_array(t).copy() for t in model.graph.initializer}
    smooth(model, groups, ranges, 0.65)
    changed = [t.name for t in model.graph.initializer if not np.array_equal(numpy_helper.to_array(t), before[t.name])]
    assert set(changed) == {w for g in groups for w in g.weights} | {g.fold_weight for g in groups}
    onnx.save(model, str(tmp_path / "smoothed.onnx"))
    want, got = _embed(graph, artifact), _embed(tmp_path / "smoothed.onnx", artifact)
    assert np.abs(got - want).max() < 1e-5 and cosines(got, want).min() > 0.999999


def test_a_massive_channel_keeps_its_matmuls_fp32(fp32, tmp_path):
    """One channel of a post-attention RMSNorm weight scaled 500x: its gate/up MatMuls see an
    input channel far above the rest, are found, and stay fp32 in the int8 graph."""
    artifact, graph = fp32
    model = onnx.load(str(graph))
    groups = smoothable_groups(model)
    target = groups[4]  # layer 1's gate/up
    assert target.fold_kind == "vector" and len(target.nodes) == 2
    for tensor in model.graph.initializer:
        if tensor.name == target.fold_weight:
            weight = numpy_helper.to_array(tensor).copy()
            weight[7] *= 500.0
            tensor.CopyFrom(numpy_helper.from_array(weight, tensor.name))
    damaged = tmp_path / "massive.onnx"
    onnx.save(model, str(damaged))
    encoder = encoder_from_manifest(artifact, load_manifest(artifact))
    feeds = calibration_feeds(encoder)
    spread = INT8_RECIPES["smooth"].massive_spread
    assert massive_input_nodes(groups, activation_ranges(graph, groups, feeds), spread) == []
    assert massive_input_nodes(groups, activation_ranges(damaged, groups, feeds), spread) == target.nodes
    facts = to_int8(damaged, tmp_path / "int8.onnx", "smooth", feeds)
    assert facts["fp32_matmuls"] == 2 and facts["recipe"] == "smooth"
    quantized = onnx.load(str(tmp_path / "int8.onnx"))
    kept = {n.input[1] for n in quantized.graph.node if n.op_type == "MatMul"} & {t.name for t in quantized.graph.initializer}
    assert kept == {w for g in groups for w, n in zip(g.weights, g.nodes) if n in target.nodes}
    weights = {t.name for t in model.graph.initializer}
    weight_matmuls = sum(n.op_type == "MatMul" and n.input[1] in weights for n in model.graph.node)
    assert sum(n.op_type == "MatMulInteger" for n in quantized.graph.node) == weight_matmuls - 2


def test_the_int8_artifact_records_its_recipe(stories_artifact, fp32):
    manifest = read_manifest(stories_artifact("kv-embedding", "int8", int8_recipe=SMOOTHED))
    conversion = manifest["graph"]["precision_conversion"]
    assert conversion["recipe"] == SMOOTHED and conversion["smoothquant_alpha"] == INT8_RECIPES[SMOOTHED].smooth_alpha
    tried = conversion["recipes_tried"]
    assert tried[-1]["passed"] and tried[-1]["recipe"] == conversion["recipe"]
    assert tried[-1]["worst_cosine"] == manifest["parity"]["worst_cosine"] >= 0.99
    # the smoothed int8 graph and the fp32 graph agree on texts the gate never saw
    artifact, graph = fp32
    int8 = stories_artifact("kv-embedding", "int8", int8_recipe=SMOOTHED)
    assert cosines(_embed(int8 / "model.onnx", int8), _embed(graph, artifact)).min() >= 0.99


@pytest.mark.parametrize("precision,recipe,message", [
    ("int8", "fastest", "int8 recipe must be auto, or one or more (comma-separated, no repeats) of smooth, smooth-keep-wide-down, smooth-keep-down, plain, rows, smooth-rows, smooth-rows-keep-down"),
    ("fp32", "smooth", "--int8-recipe smooth applies to --precision int8 only (got --precision fp32); drop it or export int8"),
])
def test_a_wrong_recipe_is_a_one_line_error(tmp_path, precision, recipe, message):
    result = subprocess.run(
        [sys.executable, "-m", "kvembed.cli.export", "--model", str(demo_model_path()), "--method", "kv-embedding",
         "--precision", precision, "--int8-recipe", recipe, "--out", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "x").exists()


def test_keeping_down_proj_needs_no_calibration(fp32, tmp_path):
    """A recipe that only keeps every SwiGLU down_proj fp32 (no smoothing, no ranges) runs without
    calibration batches and keeps one MatMul per decoder layer."""
    import dataclasses

    layers = json.loads((demo_model_path() / "config.json").read_text())["num_hidden_layers"]
    recipe = dataclasses.replace(INT8_RECIPES["plain"], name="plain-keep-down", keep_down=True)
    facts = to_int8(fp32[1], tmp_path / "int8.onnx", recipe)
    assert facts["fp32_matmuls"] == layers and "smoothquant_alpha" not in facts


def test_the_exporter_falls_back_to_the_next_recipe_that_passes(tmp_path):
    """The demo model with two RMSNorm channels scaled 500x (massive activations, as trained LLMs
    have): plain int8 misses the gate and is refused; asked for "plain,weights", the exporter
    writes the weight-only recipe (float activations), which holds on the gate's and the held-out
    texts. (Smooth, which keeps the MatMuls behind those norms fp32, passes the gate here but not
    every held-out row int8's deciding texts read; test_a_massive_channel_keeps_its_matmuls_fp32
    checks what it keeps.)"""
    from safetensors.numpy import load_file, save_file

    from kvembed.export.core import Exporter, ParityError
    from kvembed.modeling.reference import TorchEmbedder

    folder = tmp_path / "massive"
    shutil.copytree(demo_model_path(), folder)
    weights = load_file(str(folder / "model.safetensors"))
    damage = {"model.layers.1.post_attention_layernorm.weight": (7, 2),  # read by gate and up
              "model.layers.3.input_layernorm.weight": (11, 3)}  # read by q, k and v
    for name, (channel, _) in damage.items():
        weights[name] = weights[name].copy()
        weights[name][channel] *= 500.0
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with Exporter(TorchEmbedder.from_pretrained(folder, "kv-embedding")) as exporter:
        with pytest.raises(ParityError, match=r"parity FAILED \(int8\)") as alone:
            exporter.write(tmp_path / "plain", "int8", int8_recipe="plain")
        assert not (tmp_path / "plain").exists()
        result = exporter.write(tmp_path / "fallback", "int8", int8_recipe="plain,weights")
        planned = len(gate_batches(exporter.gate_texts))
    # plain alone is the last recipe tried: its gate compares every batch
    assert not alone.value.report.stopped_early and alone.value.report.batches == planned
    conversion = result.manifest.raw["graph"]["precision_conversion"]
    tried = conversion["recipes_tried"]
    assert [(t["recipe"], t["passed"]) for t in tried] == [("plain", False), ("weights", True)]
    assert tried[0]["worst_cosine"] < 0.99 <= tried[1]["worst_cosine"] == result.parity.worst_cosine
    # with weights to fall back to, plain's gate stopped at its first miss; weights' ran in full
    assert [t["stopped_early"] for t in tried] == [True, False]
    assert alone.value.report.worst_cosine <= tried[0]["worst_cosine"]
    assert not result.parity.stopped_early and result.parity.batches == planned
    assert conversion["recipe"] == "weights" and result.report.held_out.worst_cosine >= 0.99


def test_int8_weights_are_signed_seven_bit(fp32, tmp_path):
    """The exporter's weights are int8 held to 7 bits: a u8 x s8 pair then sums to at most
    2 x 255 x 64 < 2**15, so onnxruntime's int16 pair sums on CPUs without VNNI never saturate."""
    to_int8(fp32[1], tmp_path / "int8.onnx", "plain")
    model = onnx.load(str(tmp_path / "int8.onnx"))
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = [initializers[n.input[1]] for n in model.graph.node if n.op_type == "MatMulInteger"]
    assert weights and all(w.dtype == np.int8 for w in weights)
    peak = max(int(np.abs(w.astype(np.int32)).max()) for w in weights)
    assert 56 <= peak <= 64  # the 7-bit range is used, and not exceeded


def test_keep_wide_down_keeps_the_down_projs_whose_inputs_spread_widest(fp32, tmp_path):
    """down_spread keeps fp32 exactly the down_projs whose input's top channel exceeds that many
    times its median channel, measured here by running the graph with those inputs as outputs."""
    import dataclasses

    artifact, graph = fp32
    model = onnx.load(str(graph), load_external_data=False)
    down = [g for g in smoothable_groups(model) if g.fold_kind == "columns"]
    for group in down:
        model.graph.output.append(onnx.helper.make_tensor_value_info(group.activation, onnx.TensorProto.FLOAT, None))
    probe = graph.with_name("probe.onnx")
    onnx.save(model, str(probe))
    session = _session(probe)
    names = {i.name for i in session.get_inputs()}
    encoder = encoder_from_manifest(artifact, load_manifest(artifact))
    feeds = calibration_feeds(encoder)
    tops = {g.activation: 0.0 for g in down}
    for batch in feeds:
        real = batch["attention_mask"].astype(bool)
        values = session.run([g.activation for g in down], {k: v for k, v in batch.items() if k in names})
        for group, value in zip(down, values):
            tops[group.activation] = np.maximum(tops[group.activation], np.abs(value[real]).max(axis=0))
    probe.unlink()
    spreads = {g.nodes[0]: float(tops[g.activation].max() / np.median(tops[g.activation])) for g in down}
    threshold = float(np.median(list(spreads.values())))
    wide = {node for node, spread in spreads.items() if spread > threshold}
    assert 0 < len(wide) < len(down)
    recipe = dataclasses.replace(INT8_RECIPES["smooth-keep-wide-down"], name="keep-wide-down-only", smooth_alpha=None,
                                 massive_spread=None, down_spread=threshold)
    facts = to_int8(graph, tmp_path / "int8.onnx", recipe, feeds)
    quantized = onnx.load(str(tmp_path / "int8.onnx"))
    initializers = {t.name for t in quantized.graph.initializer}
    kept = {n.name for n in quantized.graph.node if n.op_type == "MatMul" and n.input[1] in initializers}
    assert kept == wide and facts["fp32_matmuls"] == len(wide)


@pytest.mark.parametrize("weights", ["s7", "s8", "u8"])
def test_quantisation_equals_onnxruntimes_whole_model_run(fp32, tmp_path, weights):
    """quantize_matmuls writes what onnxruntime's quantize_dynamic writes for the whole model (the
    oracle), for each weight format a recipe can ask for: the same nodes, bitwise the same int8
    weights, scales and zero points, the same outputs; MatMuls named in ``exclude`` stay fp32."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from kvembed.export.precision.quantize import WeightFormat, quantize_matmuls

    artifact, graph = fp32
    excluded = [n.name for n in onnx.load(str(graph), load_external_data=False).graph.node
                if n.op_type == "MatMul"][:2]  # some MatMuls stay fp32, as recipes keep them
    whole, ours = tmp_path / "whole.onnx", tmp_path / "ours.onnx"
    quantize_dynamic(str(graph), str(whole), op_types_to_quantize=["MatMul"], nodes_to_exclude=excluded,
                     weight_type=QuantType.QUInt8 if weights == "u8" else QuantType.QInt8,
                     reduce_range=weights == "s7", per_channel=True, extra_options={"MatMulConstBOnly": True})
    steps: list = []
    counts = quantize_matmuls(graph, ours, WeightFormat(signed=weights != "u8", reduce_range=weights == "s7"),
                              exclude=excluded, advance=lambda done, total: steps.append((done, total)))
    want, got = onnx.load(str(whole)), onnx.load(str(ours))
    assert steps and steps[-1][0] == steps[-1][1] == len(got.graph.initializer)  # progress per tensor
    assert counts["quantized_matmuls"] == sum(n.op_type == "MatMulInteger" for n in want.graph.node) > 0
    assert sorted((n.op_type, tuple(n.input), tuple(n.output)) for n in got.graph.node) == \
        sorted((n.op_type, tuple(n.input), tuple(n.output)) for n in want.graph.node)
    want_tensors = {t.name: numpy_helper.to_array(t) for t in want.graph.initializer}
    got_tensors = {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}
    assert got_tensors.keys() == want_tensors.keys()
    for name, value in want_tensors.items():
        assert got_tensors[name].dtype == value.dtype and np.array_equal(got_tensors[name], value), name
    onnx.checker.check_model(str(ours))
    np.testing.assert_array_equal(_embed(ours, artifact), _embed(whole, artifact))


def test_a_weights_edge_cases_quantise_as_onnxruntime_does():
    """All-zero, all-positive, all-negative and sub-normal channels: quantize_per_channel against
    onnxruntime's own per-channel arithmetic (quantize_data, one channel at a time: the oracle)."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import quantize_data

    from kvembed.export.precision.quantize import WeightFormat, quantize_per_channel

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(64, 7)).astype(np.float32)
    weight[:, 1] = 0.0
    weight[:, 2] = np.abs(weight[:, 2]) + 3
    weight[:, 3] = -np.abs(weight[:, 3]) * 1e-3
    weight[:, 4] = 1e-39  # below float32's smallest normal
    weight[5, 5] = 1e4  # one huge value
    for signed, reduce in ((True, True), (True, False), (False, False), (False, True)):
        values, scales, zeros = quantize_per_channel(weight, WeightFormat(signed, reduce))
        for j in range(weight.shape[1]):
            zero, scale, want = quantize_data(weight[:, j], TensorProto.INT8 if signed else TensorProto.UINT8,
                                              symmetric=signed, reduce_range=reduce)
            assert np.array_equal(values[:, j], want) and scales[j] == scale and zeros[j] == zero, (signed, reduce, j)


def test_calibration_ranges_are_the_maxima_over_real_tokens(fp32):
    """activation_ranges reduces in the graph; the oracle: the activations themselves, read out
    of the fp32 graph, reduced in numpy over the tokens the attention mask marks real."""
    artifact, graph = fp32
    model = onnx.load(str(graph), load_external_data=False)
    groups = smoothable_groups(model)
    feeds = calibration_feeds(encoder_from_manifest(artifact, load_manifest(artifact)), TEXTS, batch=3)
    got = activation_ranges(graph, groups, feeds)
    for group in groups:
        model.graph.output.append(onnx.helper.make_tensor_value_info(group.activation, onnx.TensorProto.FLOAT, None))
    probe = graph.with_name("probe.onnx")
    onnx.save(model, str(probe))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(probe), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    want: dict = {}
    for batch in feeds:
        real = batch["attention_mask"].astype(bool)
        values = session.run([g.activation for g in groups], {k: v for k, v in batch.items() if k in names})
        for group, value in zip(groups, values):
            top = np.abs(value.reshape(real.shape + (-1,))[real]).max(axis=0)
            want[group.activation] = np.maximum(want[group.activation], top) if group.activation in want else top
    probe.unlink()
    assert got.keys() == want.keys() and len(want) == len(groups) > 0
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_recipes_tried_in_turn_calibrate_once(fp32, tmp_path, monkeypatch):
    """A fallback recipe reuses the ranges the first one measured (the fp32 graph runs once) and
    writes the same graph as when it calibrates on its own."""
    from kvembed.export.precision import smoothing

    artifact, graph = fp32
    feeds = calibration_feeds(encoder_from_manifest(artifact, load_manifest(artifact)), TEXTS, batch=3)
    alone = tmp_path / "alone.onnx"
    to_int8(graph, alone, "smooth-keep-down", feeds)
    calls = []
    real = smoothing.activation_ranges
    monkeypatch.setattr(smoothing, "activation_ranges", lambda *a, **k: calls.append(1) or real(*a, **k))
    ranges: dict = {}
    to_int8(graph, tmp_path / "first.onnx", "smooth", feeds, ranges)
    second = tmp_path / "second.onnx"
    to_int8(graph, second, "smooth-keep-down", feeds, ranges)
    assert len(calls) == 1
    want = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(alone)).graph.initializer}
    got = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(second)).graph.initializer}
    assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


def test_a_recipe_that_repeats_a_tried_graph_is_skipped(fp32, tmp_path):
    """A recipe keeping no more MatMuls fp32 than one already tried (here: keep the down_projs
    whose input spreads over 1e9 x its median: none) would write the same graph: to_int8 says so
    instead of converting again, and the exporter moves on to the next recipe."""
    from kvembed.export.precision.convert import Int8Recipe, SameGraphError
    from kvembed.export.precision.smoothing import DEFAULT_ALPHA

    artifact, graph = fp32
    feeds = calibration_feeds(encoder_from_manifest(artifact, load_manifest(artifact)), TEXTS, batch=3)
    ranges: dict = {}
    to_int8(graph, tmp_path / "smooth.onnx", "smooth", feeds, ranges)
    none_wide = Int8Recipe("keep-none-wide", DEFAULT_ALPHA, INT8_RECIPES["smooth"].massive_spread, True, "test",
                           down_spread=1e9)
    with pytest.raises(SameGraphError) as same:
        to_int8(graph, tmp_path / "same.onnx", none_wide, feeds, ranges)
    assert same.value.same_as == "smooth" and not (tmp_path / "same.onnx").exists()
    to_int8(graph, tmp_path / "down.onnx", "smooth-keep-down", feeds, ranges)  # keeps more: converted
    assert (tmp_path / "down.onnx").exists()


def _one_matmul(path: Path, weight: np.ndarray) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", "tokens", weight.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_per_row_activations_quantise_each_token_on_its_own_scale(tmp_path):
    """The per-row recipes' MatMul against numpy arithmetic written here (the oracle): each token
    row x gets s = max|x| / 127, q = round(x / s) in [-127, 127], and y = (q @ W_int) * s * w_scale
    with the weights' per-channel 7-bit scales; a token 1000x larger than the rest (a massive
    activation) then leaves the others as accurate as without it, which per-tensor scales do not."""
    from kvembed.export.precision.quantize import WeightFormat, quantize_matmuls

    rng = np.random.default_rng(3)
    weight = rng.normal(size=(48, 20)).astype(np.float32)
    x = rng.normal(size=(2, 5, 48)).astype(np.float32)
    x[0, 0] *= 1000.0  # the massive token
    source = tmp_path / "fp32.onnx"
    _one_matmul(source, weight)
    outputs = {}
    for per_row in (True, False):
        target = tmp_path / f"int8-{per_row}.onnx"
        quantize_matmuls(source, target, WeightFormat(signed=True, reduce_range=True, per_row=per_row))
        outputs[per_row] = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    w_scale = np.abs(weight).max(axis=0) / 64.0
    w_int = np.clip(np.round(weight / w_scale), -64, 64)
    s = np.abs(x).max(axis=-1, keepdims=True) / 127.0
    q = np.round(x / s)
    want = (q @ w_int) * s * w_scale
    np.testing.assert_allclose(outputs[True], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    exact = x @ weight
    flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
    row_cos, tensor_cos = cosines(flat(outputs[True]), flat(exact)), cosines(flat(outputs[False]), flat(exact))
    tensor_cos = np.nan_to_num(tensor_cos, nan=0.0)  # a row quantised to all zeros has no direction
    assert row_cos.min() > 0.999 and tensor_cos[1:].max() < 0.99  # per tensor, the massive token ruins the rest


def test_per_row_recipes_record_their_activations(fp32, tmp_path):
    artifact, graph = fp32
    feeds = calibration_feeds(encoder_from_manifest(artifact, load_manifest(artifact)), TEXTS, batch=3)
    facts = to_int8(graph, tmp_path / "int8.onnx", "smooth-rows", feeds)
    assert facts["activations"].startswith("uint8, dynamic, a symmetric scale per token")
    ops = {n.op_type for n in onnx.load(str(tmp_path / "int8.onnx"), load_external_data=False).graph.node}
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" not in ops
    assert cosines(_embed(tmp_path / "int8.onnx", artifact), _embed(graph, artifact)).min() > 0.99
