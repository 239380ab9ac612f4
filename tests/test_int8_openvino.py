"""A dynamic int8 artifact's OpenVINO graph (recipe :data:`DYNAMIC`; the weight-only recipe, auto's
first, runs one graph on both backends: tests/test_int8_weights.py): the same int8 weights
dequantised before float MatMuls, in a second graph file that reads ``model.onnx.data``; an advisory check certifies it on OpenVINO bf16
against PyTorch at int8's bar, and ``provider="auto"`` then runs it there on a CPU with BF16.

This machine has AMX / AVX-512 BF16. A CPU without BF16 is stated with ``KVEMBED_CPU_FEATURES``
(the product's override of its capability probe), never run.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import NO_BF16, TEXTS, UNSEEN, unit

pytest.importorskip("openvino", reason="the int8 OpenVINO graph runs on OpenVINO (pip install 'kvembed[openvino]')")

from kvembed.artifact import check_files, load_manifest  # noqa: E402
from kvembed.runtime import Embedder  # noqa: E402


pytestmark = pytest.mark.usefixtures("bf16_cpu")

#: a recipe with integer arithmetic on onnxruntime, which gets a second graph for OpenVINO
DYNAMIC = "smooth-rows"


@pytest.fixture(scope="module")
def int8(stories_artifact):
    return stories_artifact("kv-embedding", "int8", int8_recipe=DYNAMIC)



def graph_of(path):
    import onnx

    return onnx.load(str(path), load_external_data=False).graph


def external(graph) -> dict[str, dict[str, str]]:
    """initializer name -> {location, offset, length} of the tensors stored outside the graph file"""
    return {t.name: {e.key: e.value for e in t.external_data} for t in graph.initializer if t.external_data}


def test_the_openvino_graph_reads_the_same_int8_weights(int8):
    manifest = load_manifest(int8)
    assert manifest.graphs == {"openvino": "model.openvino.onnx"} and manifest.graph_file("onnxruntime") == "model.onnx"
    assert "model.openvino.onnx" in manifest.files and check_files(int8) == []
    assert not (int8 / "model.openvino.onnx.data").exists()
    ort, ov = graph_of(int8 / "model.onnx"), graph_of(int8 / "model.openvino.onnx")
    ops = Counter(n.op_type for n in ov.node)
    assert not {"MatMulInteger", "DynamicQuantizeLinear", "Round"} & set(ops)
    integer = [n for n in ort.node if n.op_type == "MatMulInteger"]
    assert integer and ops["DequantizeLinear"] == len({n.input[1] for n in integer})
    # every int8 weight the integer MatMuls read is the same bytes of the same file in both graphs,
    # even for this tiny model (whose fp32 artifact keeps its weights inside model.onnx)
    shared = external(ov)
    for node in integer:
        assert shared[node.input[1]] == external(ort)[node.input[1]]
    for name, place in shared.items():
        assert place["location"] == "model.onnx.data", name
    assert all(t.ByteSize() < 2048 for t in ov.initializer if not t.external_data)  # small constants only
    dequantized = {n.output[0] for n in ov.node if n.op_type == "DequantizeLinear"}
    assert sum(1 for n in ov.node if n.op_type == "MatMul" and n.input[1] in dequantized) == len(integer)
    assert (int8 / "model.openvino.onnx").stat().st_size < (int8 / "model.onnx").stat().st_size


def test_the_advisory_check_certifies_openvino_and_auto_takes_it(int8, oracle):
    manifest = load_manifest(int8)
    ov = manifest.certificate("openvino", "bf16", bar="int8")
    assert ov is not None and ov.raw["graph"] == "model.openvino.onnx" and ov.hint == "bf16"
    assert ov.min_cosine == 0.99 and 0.99 <= ov.worst_cosine < 1.0
    assert manifest.certificate("openvino", "bf16") is None  # int8's bar, not bf16's: never taken as a bf16 pass
    advisory = manifest.parity.advisory["openvino-bf16"]
    assert advisory.graph == "model.openvino.onnx" and advisory.report.worst_cosine == ov.worst_cosine
    # the held-out slice ran on what the certificate covers, not only on onnxruntime
    assert advisory.held_out.backend == "openvino-bf16" and advisory.held_out.rows > 0
    assert ov.raw["held_out_worst_cosine"] == advisory.held_out.worst_cosine != manifest.parity.held_out.worst_cosine
    fast = Embedder.load(int8)
    assert fast.target == "openvino-bf16" and "int8 artifact certified on OpenVINO" in fast.choice.reason
    assert fast.session.model_path.name == "model.openvino.onnx"
    stories = oracle("stories260k")
    plain = Embedder.load(int8, provider="cpu")
    for kind in ("document", "query"):
        want = unit(np.stack([stories.embed("kv-embedding", text, kind, layers="1-3") for text in UNSEEN]))
        for embedder in (fast, plain):
            assert float((embedder.encode(UNSEEN, kind=kind, batch_size=8) * want).sum(-1).min()) >= 0.99
    # two computations: OpenVINO's float MatMuls on int8 weights, onnxruntime's integer MatMuls
    assert not np.array_equal(fast.encode(TEXTS), plain.encode(TEXTS))


def test_without_bf16_or_an_openvino_graph_auto_stays_on_onnxruntime(int8, tmp_path, monkeypatch):
    monkeypatch.setenv("KVEMBED_CPU_FEATURES", NO_BF16)
    stated = Embedder.load(int8)
    assert stated.target == "onnxruntime-cpu" and "no BF16" in stated.choice.reason
    np.testing.assert_array_equal(stated.encode(TEXTS), Embedder.load(int8, provider="cpu").encode(TEXTS))
    monkeypatch.delenv("KVEMBED_CPU_FEATURES")
    old = shutil.copytree(int8, tmp_path / "old")  # as exported before int8 had an OpenVINO graph
    data = json.loads((old / "kvembed.json").read_text())
    del data["graphs"], data["certified"], data["files"]["model.openvino.onnx"]
    (old / "model.openvino.onnx").unlink()
    (old / "kvembed.json").write_text(json.dumps(data))
    assert check_files(old) == [] and load_manifest(old).graph_file("openvino") == "model.onnx"
    embedder = Embedder.load(old)
    assert embedder.target == "onnxruntime-cpu" and embedder.choice.reason == "int8 artifact: onnxruntime"


def test_exported_where_bf16_cannot_run_then_recorded_by_verify(traces, tmp_path, monkeypatch):
    """On a CPU stated without BF16 the advisory check is skipped (no certificate, the export still
    passes and says why); ``kvembed verify --record`` on a BF16 CPU then adds the certificate."""
    from typer.testing import CliRunner

    from kvembed.cli.main import app

    exporter = traces.get("stories260k", "kv-embedding")
    monkeypatch.setenv("KVEMBED_CPU_FEATURES", NO_BF16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = exporter.write(tmp_path / "no-bf16", "int8", int8_recipe=DYNAMIC).path
    finally:
        torch.set_num_threads(threads)
    manifest = load_manifest(out)
    assert manifest.passed and [c.target for c in manifest.certified] == ["onnxruntime-cpu"]
    assert "no BF16" in manifest.parity.advisory["openvino-bf16"].skipped
    # OpenVINO f32 is not offered a dynamic recipe: onnxruntime's integer kernels are the faster path
    assert "dynamic int8 recipe" in manifest.parity.advisory["openvino-f32"].skipped
    monkeypatch.delenv("KVEMBED_CPU_FEATURES")
    assert Embedder.load(out).target == "onnxruntime-cpu"

    result = CliRunner().invoke(app, ["verify", str(out), "--record"])
    assert result.exit_code == 0, result.output
    assert "advisory openvino-bf16 on model.openvino.onnx: worst cosine" in result.output
    assert "recorded: openvino-bf16 ran bf16" in result.output
    assert load_manifest(out).certificate("openvino", "bf16", bar="int8").raw["graph"] == "model.openvino.onnx"
    assert check_files(out) == [] and Embedder.load(out).target == "openvino-bf16"


def test_a_graph_kvembed_did_not_quantise_is_refused(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from kvembed.export.graph.openvino_graph import write_openvino_graph

    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 2]), helper.make_tensor_value_info("b", TensorProto.INT8, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 2])])
    source = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    with pytest.raises(ValueError, match="expected one Cast"):
        write_openvino_graph(source, tmp_path / "model.openvino.onnx")
    assert not (tmp_path / "model.openvino.onnx").exists()
