"""bf16 artifacts and certificates: ``--precision bf16`` writes the fp32 graph, gates it on OpenVINO
under the bf16 hint (and on onnxruntime at fp32) against PyTorch and records both passes in the
manifest; ``provider="auto"`` runs a bf16-certified artifact on OpenVINO bf16 where the CPU has BF16
and everything else exactly as before; ``kvembed verify --record`` adds certificates.

This machine's CPU has AMX / AVX-512 BF16, so bf16 runs natively here. A CPU without BF16 is never
run: it is stated with ``KVEMBED_CPU_FEATURES`` (the product's override of the capability probe),
under which OpenVINO's session runs the bf16 hint as f32, as OpenVINO does on such a CPU.
"""

from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from conftest import NO_BF16, TEXTS, UNSEEN, unit

pytest.importorskip("openvino", reason="bf16 artifacts are gated and run on OpenVINO (pip install 'kvembed[openvino]')")

from kvembed.artifact import check_files, load_manifest  # noqa: E402
from kvembed import OpenVINOOptions  # noqa: E402
from kvembed.runtime import Embedder  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread", "bf16_cpu")


@pytest.fixture(scope="module")
def bf16(stories_artifact):
    return stories_artifact("kv-embedding", "bf16")


@pytest.fixture(scope="module")
def fp32(stories_artifact):
    return stories_artifact("kv-embedding")



def test_bf16_export_keeps_the_fp32_graph_and_certifies_both_gates(bf16, fp32):
    import onnx

    manifest = load_manifest(bf16)
    assert manifest.precision == "bf16" and manifest.graph_precision == "fp32" and manifest.passed
    graph = onnx.load(str(bf16 / "model.onnx"), load_external_data=False)
    floats = {t.data_type for t in graph.graph.initializer if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                                                                              onnx.TensorProto.BFLOAT16)}
    assert floats == {onnx.TensorProto.FLOAT}
    assert manifest.parity.target == "openvino-bf16" and manifest.parity.gate.min_cosine_required == 0.999
    by_target = {c.target: c for c in manifest.certified}
    assert set(by_target) == {"openvino-bf16", "onnxruntime-cpu"}
    ov, ort = by_target["openvino-bf16"], by_target["onnxruntime-cpu"]
    assert (ov.backend, ov.precision, ov.hint, ov.against, ov.emulated) == ("openvino", "bf16", "bf16", "pytorch", False)
    assert 0.999 <= ov.worst_cosine < 1.0  # bf16 really ran: not fp32's 1.0
    assert (ort.precision, ort.against) == ("fp32", "pytorch") and ort.worst_cosine >= 0.99999
    assert ov.cpu["bf16"] and ov.cpu["source"] == "probe" and {"avx512_bf16", "amx_bf16"} & set(ov.cpu["flags"])
    assert load_manifest(fp32).certificate("openvino", "bf16") is None  # the fp32 gate ran onnxruntime only
    assert [c.target for c in load_manifest(fp32).certified] == ["onnxruntime-cpu"]


def test_auto_runs_a_bf16_artifact_on_openvino_bf16_and_fp32_on_onnxruntime(bf16, fp32, oracle, caplog):
    with caplog.at_level(logging.INFO, logger="kvembed.runtime"):
        fast = Embedder.load(bf16)
        plain = Embedder.load(fp32)
    assert fast.target == "openvino-bf16"
    assert fast.choice.certificate is not None and "certified on OpenVINO" in fast.choice.reason
    assert plain.target == "onnxruntime-cpu" and plain.choice.certificate is None
    lines = [r.getMessage() for r in caplog.records if r.name == "kvembed.runtime"]
    assert len(lines) == 2 and "runs on openvino-bf16" in lines[0] and "runs on onnxruntime-cpu" in lines[1]
    # texts outside the gate, against the independent oracle: within bf16's bar
    stories = oracle("stories260k")
    for kind in ("document", "query"):
        want = unit(np.stack([stories.embed("kv-embedding", text, kind, layers="1-3") for text in UNSEEN]))  # the preset
        got = fast.encode(UNSEEN, kind=kind, batch_size=8)
        assert float((got * want).sum(-1).min()) >= 0.999


def test_without_bf16_auto_loads_what_it_loads_today(bf16, fp32, monkeypatch):
    """On a CPU stated to have no BF16: the bf16 artifact runs its fp32 graph on onnxruntime (the
    reason says why), giving provider='cpu''s vectors exactly; the fp32 artifact is untouched."""
    monkeypatch.setenv("KVEMBED_CPU_FEATURES", NO_BF16)
    fallback = Embedder.load(bf16)
    assert fallback.target == "onnxruntime-cpu" and "no BF16" in fallback.choice.reason and "fp32 graph" in fallback.choice.reason
    np.testing.assert_array_equal(fallback.encode(TEXTS), Embedder.load(bf16, provider="cpu").encode(TEXTS))
    assert Embedder.load(fp32).target == "onnxruntime-cpu"
    # OpenVINO asked for bf16 there runs f32, as on such a CPU, and says so
    assert Embedder.load(bf16, provider="openvino", options=OpenVINOOptions(precision="bf16", cache_dir=False)).target == "openvino-f32"


def test_manifests_without_certificates_load_and_pick_as_before(bf16, fp32, tmp_path):
    for name, source in (("old-fp32", fp32), ("old-bf16", bf16)):
        copy = shutil.copytree(source, tmp_path / name)
        data = json.loads((copy / "kvembed.json").read_text())
        del data["certified"]
        (copy / "kvembed.json").write_text(json.dumps(data))
        assert load_manifest(copy).certified == () and check_files(copy) == []
        embedder = Embedder.load(copy)
        assert embedder.target == "onnxruntime-cpu"
    assert "no certificate of OpenVINO" in embedder.choice.reason  # the bf16 one says why


def test_emulated_certificate_then_verify_record_on_a_bf16_cpu(traces, tmp_path, monkeypatch):
    """Exported where the CPU has no BF16 (--certify-emulated): the certificate says fp32 ran, so auto
    stays on onnxruntime even on a BF16 CPU; ``kvembed verify --backends openvino-bf16 --record`` on
    this one adds real bf16 certificates (the hashes still verify) and auto then takes OpenVINO."""
    from typer.testing import CliRunner

    from kvembed.cli.main import app

    exporter = traces.get("stories260k", "kv-embedding")
    monkeypatch.setenv("KVEMBED_CPU_FEATURES", NO_BF16)
    with pytest.raises(ValueError, match="no BF16"):
        exporter.write(tmp_path / "refused", "bf16")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = exporter.write(tmp_path / "emulated", "bf16", certify_emulated=True).path
    finally:
        torch.set_num_threads(threads)
    ov = load_manifest(out).certified[0]
    assert (ov.target, ov.precision, ov.hint, ov.emulated, ov.cpu["source"]) == (
        "openvino-bf16", "fp32", "bf16", True, "KVEMBED_CPU_FEATURES")
    monkeypatch.delenv("KVEMBED_CPU_FEATURES")
    before = Embedder.load(out)
    assert before.target == "onnxruntime-cpu" and "bf16 did not run" in before.choice.reason

    result = CliRunner().invoke(app, ["verify", str(out), "--backends", "openvino-bf16", "--record"])
    assert result.exit_code == 0, result.output
    assert "recorded: openvino-bf16 ran bf16" in result.output
    manifest = load_manifest(out)
    recorded = [(c.target, c.precision, c.against) for c in manifest.certified]
    assert ("openvino-bf16", "bf16", "pytorch") in recorded and ("openvino-bf16", "bf16", "onnxruntime-cpu") in recorded
    assert ("openvino-bf16", "fp32", "pytorch") in recorded  # the emulated one stays: other CPU flags
    assert check_files(out) == []
    assert Embedder.load(out).target == "openvino-bf16"


def test_v1_models_says_what_each_model_runs_on(bf16, fp32):
    from fastapi.testclient import TestClient

    from kvembed.serve import ServeConfig, create_app

    app = create_app(ServeConfig(artifacts=(("fast", str(bf16)), ("plain", str(fp32)))))
    with TestClient(app) as client:
        for _ in range(600):
            if client.get("/health").status_code == 200:
                break
            import time

            time.sleep(0.1)
        cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    assert cards["fast"]["target"] == "openvino-bf16" and "certified" in cards["fast"]["backend_reason"]
    assert cards["plain"]["target"] == "onnxruntime-cpu"
