"""Artifacts as users meet them: damaged files (same size: only the sha256 can tell), manifests
missing keys or from another schema version, models past the 2 GB external-data threshold, and
the parity gate refusing each kind of wrong graph. Real exports of the demo model, real
onnxruntime sessions; the numbers are METHODS.md's, written out in tests/checks.py."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from checks import MAX_ABS_FP32, MIN_COSINE, assert_same, oracle_rows
from kvembed.export import TOLERANCES
from kvembed.export.core import ParityError
from kvembed.export.gate.certify import gate_session
from kvembed.export.gate.targets import CPU
from kvembed.export.gate.verification import verify
from kvembed.export.gate.parity import run_parity
from kvembed.modeling.reference import TorchEmbedder
from kvembed.runtime import Embedder
from kvembed.artifact import check_files, load_manifest, read_manifest
from kvembed.runtime.artifact import encoder_from_manifest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ["A man is playing a guitar.", "", "Ünïcödé café — 東京 🤖", "What is the capital of France?"]


def copy_of(artifact: Path, tmp_path: Path, name: str = "copy") -> Path:
    target = tmp_path / name
    shutil.copytree(artifact, target)
    return target


def flip_one_byte(path: Path, at: float = 0.5) -> None:
    """Change one byte (at a fraction of the file) to a different value of the same class, keeping
    the size: a letter stays a letter, so tokenizer.json stays valid JSON; in an ONNX graph, a bit
    of a weight, so the graph still parses and only the hash can tell."""
    data = bytearray(path.read_bytes())
    index = int(len(data) * at)
    if path.suffix == ".json":  # the nearest ASCII letter inside the file
        while not chr(data[index]).isalpha():
            index += 1
        data[index] = ord("q") if data[index] != ord("q") else ord("z")
    elif path.suffix == ".onnx":  # inside the largest weight's bytes: the protobuf stays parseable
        import onnx

        raw = max((t.raw_data for t in onnx.load(str(path), load_external_data=False).graph.initializer), key=len)
        data[bytes(data).find(raw) + len(raw) // 2] ^= 0x01
    else:
        data[index] ^= 0x01
    path.write_bytes(bytes(data))


# -- METHODS.md's numbers, literally, once ---------------------------------------------------------


def test_parity_tolerances_are_methods_md_s():
    """Loosening the exporter's limits fails here: these are METHODS.md's numbers."""
    assert TOLERANCES == {
        "fp32": {"min_cosine": 0.99999, "max_abs": 1e-4},
        "fp16": {"min_cosine": 0.999},
        "bf16": {"min_cosine": 0.999},  # "fp16/bf16 graph: cosine >= 0.999" (TensorRT bf16 engines)
        "int8": {"min_cosine": 0.99},
    }
    assert MIN_COSINE == {"fp32": 0.99999, "fp16": 0.999, "int8": 0.99} and MAX_ABS_FP32 == 1e-4


# -- damaged files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["model.onnx", "tokenizer.json"])
def test_same_size_corruption_is_caught_by_the_sha256(stories_artifact, tmp_path, name):
    artifact = copy_of(stories_artifact("mean"), tmp_path)
    size = (artifact / name).stat().st_size
    flip_one_byte(artifact / name)
    assert (artifact / name).stat().st_size == size
    assert check_files(artifact) == [f"{name} does not match its sha256 in the manifest"]
    with pytest.raises(ValueError, match=rf"{re.escape(name)} does not match its sha256 in the manifest; re-export"):
        Embedder.load(artifact)
    assert Embedder.load(artifact, verify=False).dim == 64  # the check, not the file, refused it
    result = verify(artifact)
    assert not result.passed and result.file_problems == [f"{name} does not match its sha256 in the manifest"]


def test_a_size_change_is_reported_as_such(stories_artifact, tmp_path):
    artifact = copy_of(stories_artifact("mean"), tmp_path)
    with open(artifact / "tokenizer.json", "a", encoding="utf-8") as handle:
        handle.write(" ")
    (problem,) = check_files(artifact)
    assert re.fullmatch(r"tokenizer\.json has \d+ bytes, manifest says \d+", problem)


# -- manifests -------------------------------------------------------------------------------------

#: what a loader needs from kvembed.json (schema 1), written out here rather than imported
MANIFEST_KEYS = ("schema_version", "kvembed_version", "source", "method", "dim", "max_length", "opset", "precision",
                 "padding_side", "placeholder_id", "pad_id", "fallback_id", "inputs", "outputs", "graph", "files",
                 "parity")


def _rewrite_manifest(artifact: Path, change) -> None:
    manifest = json.loads((artifact / "kvembed.json").read_text())
    change(manifest)
    (artifact / "kvembed.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("key", MANIFEST_KEYS[1:])
def test_a_manifest_missing_a_key_is_refused_by_name(stories_artifact, tmp_path, key):
    artifact = copy_of(stories_artifact("mean"), tmp_path)
    _rewrite_manifest(artifact, lambda m: m.pop(key))
    with pytest.raises(ValueError, match=rf"kvembed\.json lacks {key}$"):
        Embedder.load(artifact)


@pytest.mark.parametrize("version", [None, 0, "1", 1.0])
def test_a_manifest_without_a_valid_schema_version_is_refused(stories_artifact, tmp_path, version):
    artifact = copy_of(stories_artifact("mean"), tmp_path)
    _rewrite_manifest(artifact, lambda m: m.update(schema_version=version) if version is not None else m.pop("schema_version"))
    with pytest.raises(ValueError, match="has no valid schema_version .* is it a kvembed manifest"):
        Embedder.load(artifact)


def test_older_and_newer_schema_versions_say_what_to_do(stories_artifact, tmp_path, monkeypatch):
    from kvembed.artifact import manifest as artifact_module

    artifact = copy_of(stories_artifact("mean"), tmp_path)
    _rewrite_manifest(artifact, lambda m: m.update(schema_version=2))
    with pytest.raises(ValueError, match="schema_version 2, newer than this kvembed reads .* upgrade kvembed"):
        Embedder.load(artifact)
    # a kvembed reading schema 2 meets this (schema 1) artifact
    _rewrite_manifest(artifact, lambda m: m.update(schema_version=1))
    monkeypatch.setattr(artifact_module, "SCHEMA_VERSION", 2)
    with pytest.raises(ValueError, match="schema_version 1, older than 2: re-export the model"):
        Embedder.load(artifact)


# -- past the external-data threshold ----------------------------------------------------------------


@pytest.fixture(scope="module")
def external_artifacts(tmp_path_factory):
    """kv-embedding of the demo model exported as if it were over 2 GB: the threshold lowered to
    1 KB, so the weights go to model.onnx.data, as for every real 4B-8B model. fp32 and int8
    from one trace."""
    from kvembed.artifact import external_data
    from kvembed.export.core import Exporter, load_embedder

    root = tmp_path_factory.mktemp("external")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(external_data, "EXTERNAL_DATA_THRESHOLD", 1024)
        with Exporter(load_embedder("stories260k", "kv-embedding")) as exporter:
            return {precision: exporter.write(root / precision, precision) for precision in ("fp32", "int8")}


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_external_data_artifact_loads_matches_and_is_hashed(external_artifacts, oracle, tmp_path, precision):
    result = external_artifacts[precision]
    artifact = copy_of(result.path, tmp_path, "moved")  # elsewhere: the data file is found beside the graph
    manifest = read_manifest(artifact)
    # int8 (auto: weight-only) runs one graph on every backend, as fp32 does
    assert sorted(manifest["files"]) == ["model.onnx", "model.onnx.data", "tokenizer.json"]
    data = artifact / "model.onnx.data"
    assert data.stat().st_size > 100_000 > (artifact / "model.onnx").stat().st_size  # the weights live outside
    assert manifest["graph"]["external_data"] is True
    assert manifest["parity"]["passed"] and check_files(artifact) == []
    embedder = Embedder.load(artifact, provider="cpu")
    for kind in ("query", "document"):
        want = oracle_rows(oracle("stories260k"), "kv-embedding", TEXTS, kind, layers="1-3")
        assert_same(embedder.encode(TEXTS, kind), want, precision, f"{precision} {kind}")
    assert verify(artifact).passed
    flip_one_byte(data, at=0.7)
    with pytest.raises(ValueError, match=r"model\.onnx\.data does not match its sha256 in the manifest"):
        Embedder.load(artifact)


# -- the parity gate refuses wrong graphs ---------------------------------------------------------------


def _graph_copy(artifact: Path, out: Path, change) -> Path:
    """``artifact``'s model.onnx with ``change(array)`` applied to its middle weight matrix."""
    model = onnx.load(str(artifact / "model.onnx"))
    matmul_inputs = {name for node in model.graph.node if node.op_type == "MatMul" for name in node.input}
    weights = [t for t in model.graph.initializer if t.name in matmul_inputs and len(t.dims) == 2]
    target = weights[len(weights) // 2]
    target.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(target).copy()), target.name))
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out / "model.onnx"))
    return out / "model.onnx"


def _gate(graph: Path, artifact: Path, reference: TorchEmbedder, precision: str):
    """The parity gate (kvembed.export.gate.parity.run_parity) on ``graph`` with ``artifact``'s encoder."""
    encoder = encoder_from_manifest(artifact, load_manifest(artifact))
    return run_parity(gate_session(CPU, graph), encoder, reference, precision)


@pytest.fixture(scope="module")
def kv_reference():
    return TorchEmbedder.from_pretrained("stories260k", "kv-embedding")


def test_gate_refuses_different_token_ids(traces, tmp_path):
    """A reference that prompts differently: the gate stops at the ids and writes nothing."""
    exporter = traces.get("stories260k", "kv-embedding")
    out = tmp_path / "ids"
    with pytest.raises(ParityError, match="token ids differ from the reference's") as info:
        exporter.write(out, "fp32", reference_options={"prompt": "Represent: {text}"})
    assert not info.value.report.passed and info.value.report.rows == 0
    assert not out.exists()


def test_gate_refuses_non_finite_outputs(stories_artifact, kv_reference, tmp_path):
    artifact = stories_artifact("kv-embedding")

    def poison(array):
        array[0, 0] = np.nan
        return array

    report = _gate(_graph_copy(artifact, tmp_path / "nan", poison), artifact, kv_reference, "fp32")
    assert not report.passed
    assert any("non-finite values in the graph's output" in p for p in report.problems), report.problems
    assert "FAILED" in report.summary()


def test_gate_refuses_a_different_output_shape(stories_artifact):
    """A last-token graph (64 wide) checked against a va reference (32 wide): same raw-text ids,
    different shapes -- refused, not broadcast."""
    artifact = stories_artifact("last-token")
    report = _gate(artifact / "model.onnx", artifact, TorchEmbedder.from_pretrained("stories260k", "va"), "fp32")
    assert not report.passed and report.rows == 0
    assert any(re.match(r"output shape \(\d+, 64\) != reference \(\d+, 32\)", p) for p in report.problems)


@pytest.mark.parametrize("precision,scale", [("fp16", 1.08), ("int8", 1.4)])  # worst cosine 0.998, 0.964
def test_gate_refuses_reduced_precision_below_its_tolerance(stories_artifact, kv_reference, tmp_path, precision, scale):
    """A graph off by a little more than the precision allows (one weight matrix scaled) fails the
    gate for that precision; the same graph passes the looser one where its cosine allows."""
    artifact = stories_artifact("kv-embedding")
    graph = _graph_copy(artifact, tmp_path / precision, lambda a: a * np.float32(scale))
    report = _gate(graph, artifact, kv_reference, precision)
    assert not report.passed and report.worst_cosine < MIN_COSINE[precision], report.summary()
    assert report.min_cosine_required == MIN_COSINE[precision] and not report.problems
    looser = {"fp16": "int8"}.get(precision)
    if looser:
        assert _gate(graph, artifact, kv_reference, looser).passed == (report.worst_cosine >= MIN_COSINE[looser])
