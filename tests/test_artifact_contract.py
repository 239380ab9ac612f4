"""The artifact contract (kvembed.artifact): the typed manifest of a real export, manifests of
older exporters and of newer ones, clear refusals, one is_artifact, and the staged writer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kvembed.artifact import (
    MANIFEST, MODEL, SCHEMA_VERSION, TOKENIZER, FileRecord, Manifest, OutputExistsError, check_artifact_options,
    check_files, check_output, is_artifact, load_manifest, read_manifest, staged, write_manifest, write_text_atomic,
)
from kvembed.artifact.staging import write_bytes_atomic
from kvembed.runtime import Embedder
from kvembed.runtime.artifact import encoder_from_manifest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ["A man is playing a guitar.", "Why is the sky blue?"]


def _copy(artifact: Path, tmp_path: Path, name: str = "copy") -> Path:
    return Path(shutil.copytree(artifact, tmp_path / name))


def _rewrite(artifact: Path, change) -> dict:
    data = json.loads((artifact / MANIFEST).read_text())
    change(data)
    (artifact / MANIFEST).write_text(json.dumps(data))
    return data


def _first_schema(data: dict) -> None:
    """What the first exporter wrote: none of the fields added since."""
    for key in ("created", "layer_selection", "context_encoder", "also"):
        data.pop(key, None)
    data["method"].pop("contextual", None)
    for output in data["outputs"]:
        output.pop("method", None)
    data["source"] = {key: data["source"][key] for key in
                      ("model", "location", "preset_id", "model_type", "config_sha256", "num_layers", "hidden_size")}
    data["graph"].pop("attention", None)


# -- the typed manifest of a real export ---------------------------------------------------------------


def test_a_real_export_reads_as_a_typed_manifest(stories_artifact):
    artifact = stories_artifact("kv-embedding")
    manifest = load_manifest(artifact)
    on_disk = json.loads((artifact / MANIFEST).read_text())
    assert manifest.schema_version == SCHEMA_VERSION and manifest.kvembed_version == on_disk["kvembed_version"]
    assert manifest.method.name == "kv-embedding" and manifest.method_names == ["kv-embedding"]
    assert manifest.precision == "fp32" and manifest.padding_side in ("left", "right")
    assert manifest.max_length == on_disk["max_length"] and manifest.opset == on_disk["opset"]
    assert manifest.input_names == [item["name"] for item in on_disk["inputs"]] and "input_ids" in manifest.input_names
    main = manifest.output("embedding")
    assert main is not None and main.normalized is True and main.width == manifest.dim
    assert manifest.source.model == "stories260k" and manifest.source.num_layers == on_disk["source"]["num_layers"]
    assert manifest.graph.attention_form in ("fused", "decomposed") and manifest.graph.external_data is False
    assert set(manifest.files) == {MODEL, TOKENIZER}
    for name, record in manifest.files.items():
        assert record == FileRecord(on_disk["files"][name]["sha256"], (artifact / name).stat().st_size)
    assert manifest.passed and manifest.context_encoder is None and manifest.also == {} and manifest.extra == {}
    # the JSON form, as read: what a writer copies and readers not yet on the typed fields use
    assert manifest.raw == on_disk == manifest.to_dict() == read_manifest(artifact)
    assert Manifest.from_dict(on_disk) == manifest
    assert check_files(artifact, manifest) == check_files(artifact) == []
    encoder = encoder_from_manifest(artifact, manifest)
    assert encoder.pad_id == manifest.pad_id and len(encoder.encode_one(TEXTS[0], "query").ids) > 3


def test_a_manifest_of_the_first_schema_loads_with_todays_defaults(stories_artifact, tmp_path):
    artifact = stories_artifact("kv-embedding")
    old = _copy(artifact, tmp_path, "old")
    _rewrite(old, _first_schema)
    manifest = load_manifest(old)
    assert manifest.also == {} and manifest.context_encoder is None and manifest.layer_selection is None
    assert manifest.created is None and manifest.method.contextual is False
    assert all(output.method is None for output in manifest.outputs)
    assert manifest.source.dtype is None and manifest.source.revision is None and manifest.graph.attention_form is None
    assert check_files(old) == []
    got = Embedder.load(old, provider="cpu").encode(TEXTS, "query")
    want = Embedder.load(artifact, provider="cpu").encode(TEXTS, "query")
    np.testing.assert_array_equal(got, want)


def test_fields_a_newer_exporter_adds_are_kept(stories_artifact, tmp_path):
    newer = _copy(stories_artifact("kv-embedding"), tmp_path, "newer")
    _rewrite(newer, lambda m: m.update(future_field={"a": [1, 2]}) or m["source"].update(host="x"))
    manifest = load_manifest(newer)
    assert manifest.extra == {"future_field": {"a": [1, 2]}} and manifest.source.raw["host"] == "x"
    out = tmp_path / "rewritten"
    out.mkdir()
    write_manifest(out, manifest.updated(precision="fp32"))
    assert json.loads((out / MANIFEST).read_text())["future_field"] == {"a": [1, 2]}
    assert [p.name for p in out.iterdir()] == [MANIFEST]  # no partial file left beside it


# -- refusals that name the problem -----------------------------------------------------------------------


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.pop("dim"), r"kvembed\.json lacks dim$"),
    (lambda m: m.pop("files") and m.pop("parity"), r"kvembed\.json lacks files, parity$"),
    (lambda m: m.update(dim="64"), r"kvembed\.json: dim must be int, got '64'"),
    (lambda m: m.update(max_length=True), r"max_length must be int, got True"),
    (lambda m: m.update(padding_side="middle"), r"padding_side must be one of left, right, got 'middle'"),
    (lambda m: m["method"].pop("layers"), r"kvembed\.json: method lacks layers$"),
    (lambda m: m.update(also={"x": {"name": "mean"}}), r"kvembed\.json: also\['x'\] lacks options$"),
    (lambda m: m["files"].update({"model.onnx": {"sha256": "ab"}}), r"files\['model\.onnx'\]: bytes must be int"),
    (lambda m: m.update(outputs=[{"name": "embedding"}]), r"outputs\[0\]: shape must be list"),
    (lambda m: m.update(schema_version=SCHEMA_VERSION + 1), r"newer than this kvembed reads .* upgrade kvembed"),
    # the export's report is read typed too: a hostile one is one line, not a KeyError later
    (lambda m: m.update(parity={}), r"parity is empty: no parity gate ran on this artifact"),
    (lambda m: m.update(parity=[1]), r"kvembed\.json: parity must be an object"),
    (lambda m: m["parity"].pop("worst_cosine"), r"kvembed\.json: parity: worst_cosine must be float or int, got None"),
    (lambda m: m["parity"].update(passed="yes"), r"kvembed\.json: parity: passed must be bool, got 'yes'"),
    (lambda m: m["parity"].update(gates={"x": {"passed": True}}), r"parity: gates\['x'\]: precision must be str"),
    (lambda m: m["parity"].update(advisory={"openvino-bf16": 3}), r"parity: advisory\['openvino-bf16'\] must be an object"),
    (lambda m: m["parity"].update(timings={"trace": "long"}), r"parity: timings\['trace'\] must be a number of seconds"),
    # a crafted megabyte in a field comes back cut, not whole
    (lambda m: m["parity"].update(precision=["x" * 1_000_000]), r"parity: precision must be str, got \['xxx.*\.\.\. \(1000004 characters\)$"),
])
def test_a_missing_or_malformed_field_is_named(stories_artifact, tmp_path, change, message):
    artifact = _copy(stories_artifact("kv-embedding"), tmp_path)
    _rewrite(artifact, change)
    with pytest.raises(ValueError, match=message):
        load_manifest(artifact)
    with pytest.raises(ValueError, match=message):
        read_manifest(artifact)


def test_a_directory_that_is_not_an_artifact_is_refused_clearly(stories_artifact, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not is_artifact(empty) and not is_artifact(None) and not is_artifact(tmp_path / "missing")
    assert is_artifact(stories_artifact("kv-embedding"))
    with pytest.raises(FileNotFoundError, match=r"is not a kvembed artifact: it has no kvembed\.json; an artifact directory holds"):
        load_manifest(empty)
    with pytest.raises(FileNotFoundError, match="no artifact directory at"):
        load_manifest(tmp_path / "missing")
    (empty / MANIFEST).write_text("[1, 2]")
    with pytest.raises(ValueError, match="does not hold a JSON object"):
        load_manifest(empty)
    with pytest.raises(ValueError, match=r"computes kv-embedding \(.*\), not 'mean'; drop --method"):
        check_artifact_options(stories_artifact("kv-embedding"), "mean", {}, None)
    with pytest.raises(ValueError, match="fixes its method options: .* drop --pooling, --max-length"):
        check_artifact_options(stories_artifact("kv-embedding"), None, {"pooling": "last"}, 16)


# -- the staged writer --------------------------------------------------------------------------------------


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


def test_the_staged_writer_refuses_a_non_empty_output_and_a_file(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "kept").write_text("x")
    with pytest.raises(OutputExistsError, match="is not empty; use --force"):
        check_output(full)
    assert check_output(full, force=True) == full
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):  # even with force
        check_output(full / "kept", force=True)
    (tmp_path / "empty").mkdir()
    assert check_output(tmp_path / "empty") == tmp_path / "empty" and check_output(tmp_path / "new") == tmp_path / "new"
    assert (full / "kept").read_text() == "x" and not (tmp_path / "new").exists()


def test_the_staged_writer_leaves_nothing_behind_on_failure(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="boom"):
        with staged(out) as staging:
            (staging / "half").write_text("half a file")
            raise RuntimeError("boom")
    assert not out.exists() and _leftovers(tmp_path) == []
    # a failure while replacing an earlier output keeps the earlier one as it was
    out.mkdir()
    (out / "earlier").write_text("earlier")
    with pytest.raises(KeyboardInterrupt):
        with staged(out) as staging:
            (staging / "new").write_text("new")
            raise KeyboardInterrupt
    assert sorted(p.name for p in out.iterdir()) == ["earlier"] and _leftovers(tmp_path) == []


def test_the_staged_writer_appears_whole_and_replaces_what_was_there(tmp_path):
    out = tmp_path / "deep" / "out"
    with staged(out) as staging:
        (staging / "a").write_text("a")
        assert not out.exists()  # nothing at out until the block ends
    assert [p.name for p in out.iterdir()] == ["a"]
    with staged(out) as staging:
        (staging / "b").write_text("b")
    assert [p.name for p in out.iterdir()] == ["b"] and _leftovers(out.parent) == []
    write_text_atomic(out / "c", "c")
    assert (out / "c").read_text() == "c" and _leftovers(out) == []


def test_an_atomic_file_write_that_fails_leaves_the_earlier_file_and_no_partial(tmp_path, monkeypatch):
    target = tmp_path / "blob"
    write_bytes_atomic(target, memoryview(b"earlier"))  # a buffer, as a compiled model exports
    assert target.read_bytes() == b"earlier"

    def interrupted(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr("kvembed.artifact.staging.os.replace", interrupted)
    with pytest.raises(OSError, match="disk full"):
        write_bytes_atomic(target, b"later")
    assert target.read_bytes() == b"earlier" and _leftovers(tmp_path) == []


def test_the_export_report_is_typed_and_writes_back_as_read(stories_artifact, tmp_path):
    """The manifest's ``parity`` is the export's typed report: the gate's figures, the target it ran
    on, the held-out record and each stage's seconds; written back it is the JSON that was read,
    keys a newer exporter added included, and a changed field is written over the rest."""
    import dataclasses

    artifact = _copy(stories_artifact("kv-embedding"), tmp_path)
    on_disk = _rewrite(artifact, lambda m: m["parity"].update(future_key={"kept": True}))
    report = load_manifest(artifact).parity
    assert report.passed is on_disk["parity"]["passed"] is True
    assert report.gate.worst_cosine == on_disk["parity"]["worst_cosine"] and report.target == on_disk["parity"]["backend"]
    assert report.held_out.worst_cosine == on_disk["parity"]["held_out"]["worst_cosine"]
    assert set(report.timings) >= {"trace", "parity", "write"} and all(s >= 0 for s in report.timings.values())
    assert report.to_dict() == on_disk["parity"]
    failed = dataclasses.replace(report, gate=dataclasses.replace(report.gate, passed=False))
    written = failed.to_dict()
    assert written["passed"] is False and written["future_key"] == {"kept": True}
    assert written["held_out"] == on_disk["parity"]["held_out"]  # the record's own figures, not only the typed ones
