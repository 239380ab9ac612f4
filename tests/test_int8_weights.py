"""Weight-only int8 (``--int8-recipe weights``): int8 weights in blocks along the input dimension,
dequantised by a blocked DequantizeLinear (opset 21) before each float MatMul. Checked against a
numpy blocked quantisation written here, the independent oracle, and the session the gate runs
against the one the runtime opens (the accuracy level onnxruntime computes at is pinned)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from checks import assert_matches_oracle
from conftest import TEXTS
from kvembed.artifact import load_manifest, read_manifest
from kvembed.errors import InvalidInput
from kvembed.export.gate.certify import gate_session
from kvembed.export.gate.targets import CPU
from kvembed.export.precision.convert import INT8_AUTO, int8_plan, int8_recipe_help, to_int8
from kvembed.methods import demo_model_path
from kvembed import OnnxRuntimeOptions
from kvembed.runtime import Embedder
from kvembed.runtime.artifact import encoder_from_manifest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: the demo model's default kv-embedding layers
STORIES_LAYERS = "1-3"
#: onnxruntime's session config key for the arithmetic of a fused blocked-DequantizeLinear MatMul
LEVEL_KEY = "session.qdq_matmulnbits_accuracy_level"


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``kvembed-export`` as a user's shell runs it."""
    return subprocess.run([sys.executable, "-m", "kvembed.cli.export", "--model", str(demo_model_path()),
                           "--method", "kv-embedding", "--precision", "int8", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    """The demo model's kv-embedding exported by the CLI (in this process) at int8 with no recipe
    named: ``auto``, whose first recipe is weight-only."""
    from typer.testing import CliRunner

    from kvembed.cli.main import app

    out = tmp_path_factory.mktemp("weights") / "int8"
    result = CliRunner().invoke(app, ["export", "--model", str(demo_model_path()), "--method", "kv-embedding",
                                      "--precision", "int8", "--out", str(out)])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    return out


def _blocked(weight: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The oracle: symmetric int8, one scale (max |w| / 127) per ``block`` input rows of each column."""
    rows, columns = weight.shape
    values = np.zeros((rows, columns), dtype=np.int8)
    scales = np.zeros((rows // block, columns), dtype=np.float32)
    for b in range(rows // block):
        for c in range(columns):
            part = weight[b * block:(b + 1) * block, c]
            peak = np.float32(np.abs(part).max())
            scale = peak / np.float32(127) if peak > 0 else np.float32(1)
            scales[b, c] = scale
            values[b * block:(b + 1) * block, c] = np.clip(np.rint(part / scale), -127, 127)
    return values, scales


def _graph(path: Path, opset: int, shapes: dict[str, tuple[int, int]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A graph of chained MatMuls, one per weight of ``shapes`` (input rows, columns) plus a second
    reader of the first weight, saved as ``path``; the weights."""
    weights = {name: (rng.standard_normal(shape) * 0.05).astype(np.float32) for name, shape in shapes.items()}
    weights["w640"][:, 3] = 0.0  # an all-zero column: its blocks get scale 1
    nodes, x = [], "x"
    for index, (name, (rows, _)) in enumerate(shapes.items()):
        nodes.append(helper.make_node("MatMul", [x, name], [f"y{index}"], name=f"mm{index}"))
        x = f"y{index}"
    nodes.append(helper.make_node("MatMul", ["x", "w640"], ["again"], name="again"))
    first = next(iter(shapes.values()))[0]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", first])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("again", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, n) for n, w in weights.items()])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return weights


def test_the_written_weights_are_a_blocked_int8_quantisation(tmp_path):
    """Block 64 where it divides the input width (640), a smaller power of two where not (96:
    32), one block per column where none of 16 or more does (200); a weight two MatMuls read is
    dequantised once. The written int8 values and scales equal the oracle's, and onnxruntime
    computes the float product of the input with the dequantised weights."""
    shapes = {"w640": (640, 96), "w96": (96, 200), "w200": (200, 48)}
    weights = _graph(tmp_path / "fp32.onnx", 23, shapes, np.random.default_rng(0))
    facts = to_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", "weights")
    assert facts["block_size"] == 64 and facts["block_sizes"] == {"32": 1, "64": 1, "200": 1}
    assert facts["accuracy_level"] == 1 and facts["session_config"] == {LEVEL_KEY: "1"}
    model = onnx.load(str(tmp_path / "int8.onnx"))
    tensors = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    dequantize = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    assert len(dequantize) == 3 and not {"MatMulInteger", "DynamicQuantizeLinear"} & {n.op_type for n in model.graph.node}
    want_blocks = {"w640": 64, "w96": 32, "w200": 200}
    dequantised = {}
    for name, weight in weights.items():
        (node,) = [n for n in dequantize.values() if n.input[0] == f"{name}_quantized"]
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attributes == {"axis": 0, "block_size": want_blocks[name]}
        values, scales = _blocked(weight, want_blocks[name])
        np.testing.assert_array_equal(tensors[node.input[0]], values)
        np.testing.assert_array_equal(tensors[node.input[1]], scales)
        assert tensors[node.input[1]].dtype == np.float32 and name not in tensors
        dequantised[name] = values.astype(np.float64) * np.repeat(scales, want_blocks[name], axis=0)
    readers = [n for n in model.graph.node if n.op_type == "MatMul"]
    assert len(readers) == 4 and all(n.input[1] in dequantize for n in readers)
    x = np.random.default_rng(1).standard_normal((5, 640)).astype(np.float32)
    session = gate_session(CPU, tmp_path / "int8.onnx")
    got, again = session.run({"x": x}, [o.name for o in session.get_outputs()])
    want = x.astype(np.float64) @ dequantised["w640"] @ dequantised["w96"] @ dequantised["w200"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(again - x.astype(np.float64) @ dequantised["w640"]).max() <= 1e-5


def test_an_opset_below_21_is_refused_in_one_line(tmp_path):
    _graph(tmp_path / "fp32.onnx", 18, {"w640": (640, 64)}, np.random.default_rng(0))
    with pytest.raises(InvalidInput) as error:
        to_int8(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", "weights")
    assert "\n" not in str(error.value) and "opset 21" in str(error.value) and "opset 18" in str(error.value)
    # before any work: a named recipe is refused, auto leaves it out
    with pytest.raises(InvalidInput, match="int8 recipe weights needs ONNX opset 21 or later"):
        int8_plan("weights", 18)
    assert int8_plan("auto", 18) == INT8_AUTO[1:] and int8_plan("auto", 23) == INT8_AUTO
    result = _cli("--int8-recipe", "weights", "--opset", "18", "--out", str(tmp_path / "x"))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "needs ONNX opset 21 or later" in lines[0], result.stderr
    assert not (tmp_path / "x").exists()


def test_weights_is_auto_s_first_recipe_and_in_the_help():
    assert INT8_AUTO[0] == "weights"
    assert "weights (weight-only" in int8_recipe_help()
    assert "auto = weights,smooth-rows,smooth-rows-keep-down,smooth-keep-down" in int8_recipe_help()


def test_the_cli_artifact_records_the_recipe_and_matches_the_oracle(artifact, oracle):
    manifest = read_manifest(artifact)
    conversion = manifest["graph"]["precision_conversion"]
    assert conversion["recipe"] == "weights" and conversion["accuracy_level"] == 1
    assert conversion["block_size"] == 64 and conversion["session_config"] == {LEVEL_KEY: "1"}
    assert conversion["recipes_tried"] == [{"recipe": "weights", "worst_cosine": manifest["parity"]["worst_cosine"], "passed": True,
                                         "stopped_early": False,
                                         "held_out_worst_cosine": manifest["parity"]["held_out"]["worst_cosine"]}]
    assert len(conversion["embedding_tables"]) == 1  # the token table int8 as well
    ops = {n.op_type for n in onnx.load(str(artifact / "model.onnx"), load_external_data=False).graph.node}
    assert "DequantizeLinear" in ops and not {"MatMulInteger", "DynamicQuantizeLinear"} & ops
    embedder = Embedder.load(artifact, provider="cpu", threads=1)
    assert_matches_oracle(embedder.encode, oracle("stories260k"), "kv-embedding", TEXTS, precision="int8",
                          layers=STORIES_LAYERS)


def test_the_gate_certifies_what_the_runtime_runs(artifact):
    """The gate's session (no pre-packing, no arena) and the runtime's (pre-packed weights, with or
    without threads) give bitwise the same vectors: both pin the accuracy level the manifest
    records. onnxruntime's default level on pre-packed weights computes something else."""
    manifest = load_manifest(artifact)
    encoder = encoder_from_manifest(artifact, manifest)
    batch = encoder.pad(encoder.encode(TEXTS, "document"), "right")
    gate = gate_session(CPU, artifact / "model.onnx")
    feeds = {name: batch[name] for name in gate.input_names}
    want = gate.run(feeds, ["embedding"])[0]
    level = str(manifest.graph.conversion["accuracy_level"])
    assert gate.get_session_options().get_session_config_entry(LEVEL_KEY) == level
    for options in (OnnxRuntimeOptions(threads=1), OnnxRuntimeOptions(threads=2, prepacking=False), None):
        runtime = Embedder.load(artifact, provider="cpu", options=options).session
        assert runtime.ort.get_session_options().get_session_config_entry(LEVEL_KEY) == level
        assert np.array_equal(runtime.run(feeds, ["embedding"])[0], want), options
    plain = ort.SessionOptions()  # onnxruntime's defaults: level 4, weights pre-packed
    default = ort.InferenceSession(str(artifact / "model.onnx"), plain, providers=["CPUExecutionProvider"])
    assert not np.array_equal(default.run(["embedding"], feeds)[0], want)


def test_on_a_cpu_without_bf16_openvino_f32_is_certified_and_auto_takes_it(traces, tmp_path, monkeypatch, oracle):
    """A weight-only graph exported where the CPU has no BF16 (stated): the bf16 check cannot run
    there, the f32 one certifies OpenVINO at int8's bar, and ``auto`` runs the artifact there
    (onnxruntime's CPU provider runs weight-only int8 in float, slower than fp32 on short inputs)."""
    pytest.importorskip("openvino", reason="the f32 path runs on OpenVINO (pip install 'kvembed[openvino]')")
    from conftest import NO_BF16

    from kvembed.artifact import load_manifest

    monkeypatch.setenv("KVEMBED_CPU_FEATURES", NO_BF16)
    out = traces.get("stories260k", "kv-embedding").write(tmp_path / "w8", "int8", int8_recipe="weights").path
    manifest = load_manifest(out)
    assert "no BF16" in manifest.parity.advisory["openvino-bf16"].skipped
    assert [c.target for c in manifest.certified] == ["onnxruntime-cpu", "openvino-f32"]
    certificate = manifest.certificate("openvino", "fp32", bar="int8")
    assert certificate is not None and certificate.raw["graph"] == "model.onnx" and certificate.min_cosine == 0.99
    embedder = Embedder.load(out)
    assert embedder.target == "openvino-f32" and "int8 artifact certified on OpenVINO" in embedder.choice.reason
    assert_matches_oracle(embedder.encode, oracle("stories260k"), "kv-embedding", TEXTS, precision="int8",
                          layers=STORIES_LAYERS)


def test_exported_where_bf16_runs_it_is_ready_for_a_cpu_without(artifact, monkeypatch, bf16_cpu):
    """Exported on a CPU with BF16, the weight-only artifact carries both OpenVINO certificates:
    ``auto`` runs bf16 here and f32 on a CPU stated without BF16, never onnxruntime's slower path."""
    pytest.importorskip("openvino", reason="the OpenVINO paths need the openvino package (pip install 'kvembed[openvino]')")
    from conftest import NO_BF16

    from kvembed.artifact import load_manifest

    manifest = load_manifest(artifact)
    assert [c.target for c in manifest.certified] == ["onnxruntime-cpu", "openvino-bf16", "openvino-f32"]
    assert Embedder.load(artifact).target == "openvino-bf16"
    monkeypatch.setenv("KVEMBED_CPU_FEATURES", NO_BF16)
    assert Embedder.load(artifact).target == "openvino-f32"
