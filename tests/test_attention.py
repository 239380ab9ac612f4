"""Fused attention (one standard ``Attention`` op per layer, opset 23) vs the decomposed graph.

The fused graph of stories260k's kv-embedding is the session-shared trace (the export default);
the decomposed one is traced here. kv-embedding is the hardest case for the op: grouped-query
attention (8 query / 4 key-value heads), the re-routed prefix concatenated to K/V (K/V longer
than Q) and the logit bias carried in the additive mask.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from checks import MAX_ABS_FP32, assert_matches_oracle, assert_same, cosines
from kvembed.export.graph.trace import check_attention, default_attention, resolve_attention
from kvembed.export.graph.ops import non_portable_ops, op_types
from kvembed.runtime import Embedder

STORIES = "stories260k"
METHOD = "kv-embedding"
#: the demo model's kv-embedding preset (5 layers: L//3 .. 7L//12 -> 1-3), written out for the oracle
OPTIONS = {"layers": "1-3"}
TEXTS = ["A man is playing a guitar.", "", "Ünïcödé café — 東京 🤖",
         "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill."]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def forms(traces, stories_artifact, stories_decomposed):
    """form -> fp32 artifact of stories260k kv-embedding (each written through the parity gate)."""
    assert traces.get(STORIES, METHOD).attention == "fused"  # the default where onnxruntime runs the op
    return {"fused": stories_artifact(METHOD), "decomposed": stories_decomposed}


def _manifest(path):
    return json.loads((path / "kvembed.json").read_text())


def _expand_fed(model: onnx.ModelProto, name: str, depth: int = 3) -> bool:
    producer = {o: n for n in model.graph.node for o in n.output}.get(name)
    if producer is None or depth == 0:
        return False
    return producer.op_type == "Expand" or (
        producer.op_type in ("Reshape", "Concat", "Unsqueeze") and any(_expand_fed(model, i, depth - 1) for i in producer.input)
    )


def test_fused_graph_has_one_attention_op_per_layer_and_no_gqa_expand(forms):
    model = onnx.load(str(forms["fused"] / "model.onnx"))
    counts = op_types(model)
    layers = _manifest(forms["fused"])["method"]["num_layers"]
    assert counts["Attention"] == layers == 5
    assert "Softmax" not in counts
    # GQA is the op's: K and V enter with the 4 key/value heads, not repeated to 8
    for node in (n for n in model.graph.node if n.op_type == "Attention"):
        assert not _expand_fed(model, node.input[1]) and not _expand_fed(model, node.input[2]), node.name
    # the only op the fused graph adds is Attention (no RMSNormalization / RotaryEmbedding)
    decomposed = op_types(onnx.load(str(forms["decomposed"] / "model.onnx")))
    assert set(counts) - set(decomposed) == {"Attention"}
    assert decomposed["Softmax"] == layers and "Attention" not in decomposed
    assert decomposed["Expand"] > counts["Expand"]  # the GQA repeats are gone
    assert non_portable_ops(model) == []


def test_manifest_records_form_opset_and_minimum_versions(forms):
    fused, decomposed = _manifest(forms["fused"]), _manifest(forms["decomposed"])
    assert fused["opset"] == 23 and decomposed["opset"] == 18
    assert fused["graph"]["attention"] == {
        "form": "fused", "attention_nodes": 5, "min_versions": {"onnxruntime": "1.23.1", "tensorrt": "10.14"}}
    assert decomposed["graph"]["attention"] == {
        "form": "decomposed", "attention_nodes": 0, "min_versions": {"onnxruntime": "1.14", "tensorrt": "8.6"}}
    assert fused["graph"]["tensorrt_ready"] and decomposed["graph"]["tensorrt_ready"]
    for manifest in (fused, decomposed):  # both went through the parity gate
        assert manifest["parity"]["passed"]


def test_fused_and_decomposed_give_the_same_vectors_and_match_the_oracle(forms, oracle):
    vectors = {}
    for form, path in forms.items():
        embedder = Embedder.load(path, provider="cpu", threads=1)
        for kind in ("document", "query"):
            vectors[form, kind] = embedder.encode(TEXTS, kind=kind)
        assert _manifest(path)["method"]["layers"] == [1, 2, 3]
        assert_matches_oracle(embedder.encode, oracle(STORIES), METHOD, TEXTS, what=form, **OPTIONS)
    for kind in ("document", "query"):
        a, b = vectors["fused", kind], vectors["decomposed", kind]
        assert cosines(a, b).min() >= 0.99999
        assert np.abs(a - b).max() <= MAX_ABS_FP32


def test_fused_batches_with_padding_match_one_text_at_a_time(forms):
    """Padded rows (right padding: masked key columns) give the rows' unpadded vectors."""
    embedder = Embedder.load(forms["fused"], provider="cpu", threads=1)
    together = embedder.encode(TEXTS, batch_size=len(TEXTS))
    alone = np.stack([embedder.encode([t], batch_size=1)[0] for t in TEXTS])
    assert_same(together, alone, "fp32", "fused, batched vs alone")


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_fused_reduced_precisions_pass_the_gate(traces, tmp_path, oracle, precision):
    """fp16: the op's own fp16 path (Q/K/V fp16, the mask kept fp32 machinery then cast) passes
    the fp16 gate; int8 quantizes the weight MatMuls and leaves Attention as is."""
    result = traces.get(STORIES, METHOD).write(tmp_path / precision, precision)
    manifest = result.manifest.raw
    assert manifest["parity"]["passed"] and manifest["graph"]["attention"]["form"] == "fused"
    assert manifest["graph"]["op_types"]["Attention"] == 5
    embedder = Embedder.load(result.path, provider="cpu", threads=1)
    assert_matches_oracle(embedder.encode, oracle(STORIES), METHOD, TEXTS, precision=precision,
                          kinds=("document",), what=precision, **OPTIONS)


def test_form_and_opset_rules():
    assert check_attention("fused", None) == 23 and check_attention("decomposed", None) == 18
    assert check_attention("fused", 24) == 24 and check_attention("decomposed", 20) == 20
    with pytest.raises(ValueError, match="needs opset >= 23"):
        check_attention("fused", 18)
    with pytest.raises(ValueError, match="needs opset < 23"):
        check_attention("decomposed", 23)
    with pytest.raises(ValueError, match="fused, decomposed"):
        check_attention("flash", None)
    with pytest.raises(ValueError, match="too old"):
        check_attention("decomposed", 13)
    assert default_attention() == "fused"  # onnxruntime 1.32 here runs the probe
    # an unset form follows an explicit opset (the CLI and the Python API alike)
    assert resolve_attention(None, None) == ("fused", 23) and resolve_attention(None, 24) == ("fused", 24)
    assert resolve_attention(None, 18) == ("decomposed", 18) and resolve_attention("decomposed", None) == ("decomposed", 18)
    with pytest.raises(ValueError, match="too old"):
        resolve_attention(None, 13)


def test_cli_refuses_a_contradictory_form_and_opset_before_loading(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "kvembed.cli.export", "--model", STORIES, "--method", "va",
         "--attention", "fused", "--opset", "18", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "needs opset >= 23" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not out.exists()
