"""One manifest per load and one integrity check: ``kvembed embed`` reads ``kvembed.json`` once and
hands the typed manifest on; a damaged artifact (a file missing, a hash changed) is refused in the
same words by every loader (the runtime, serve's preflight, Triton's repository writer, the
benchmark); the manifest's JSON form writes back what was read, with what was changed."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvembed.artifact import MANIFEST, MODEL, TOKENIZER, DamagedArtifact, HeldOut, Manifest, check_intact, load_manifest
from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: runs the real console entry point with an audit hook that lists every open of a kvembed.json
COUNT_OPENS = """
import sys
opened = []
sys.addaudithook(lambda event, args: opened.append(args[0]) if event == "open" and str(args[0]).endswith("kvembed.json") else None)
from kvembed.cli.main import main
sys.argv = ["kvembed", *sys.argv[1:]]
try:
    main()
finally:
    print("opened:", len(opened), file=sys.stderr)
"""


def _copy(artifact: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(artifact, tmp_path / "copy"))


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_kvembed_embed_reads_the_manifest_once(stories_artifact):
    artifact = stories_artifact("kv-embedding")
    result = subprocess.run([sys.executable, "-c", COUNT_OPENS, "embed", str(artifact), "a first text", "a second"],
                            capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert f"kv-embedding on {artifact}: 2 x 64" in " ".join(result.stdout.split())  # the table's title, however wrapped
    assert result.stderr.strip().splitlines()[-1] == "opened: 1"


# -- one integrity check, the same words everywhere --------------------------------------------------


def _embedder(artifact: Path, tmp_path: Path) -> None:
    Embedder.load(artifact, provider="cpu")


def _serve(artifact: Path, tmp_path: Path) -> None:
    from kvembed.serve.config import ServeConfig
    from kvembed.serve.preflight import check_artifacts

    check_artifacts(ServeConfig(artifacts=(("m", artifact),)))


def _triton(artifact: Path, tmp_path: Path) -> None:
    from kvembed.triton.repository import write_repository

    write_repository(artifact, tmp_path / "repository")


def _bench(artifact: Path, tmp_path: Path) -> None:
    from kvembed.bench.runner import BenchConfig, run_bench

    run_bench(BenchConfig(out=tmp_path / "bench", artifact=artifact, backends=("runtime",), batch_sizes=(1,), seq_lens=(8,)))


LOADERS = {"runtime": _embedder, "serve": _serve, "triton": _triton, "bench": _bench}


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize(("damage", "problem"), [
    (lambda a: (a / TOKENIZER).unlink(), f"{TOKENIZER} is missing"),
    (lambda a: _flip_one_byte(a / MODEL), f"{MODEL} does not match its sha256 in the manifest"),
])
def test_a_damaged_artifact_is_refused_in_the_same_words_by_every_loader(stories_artifact, tmp_path, loader, damage, problem):
    artifact = _copy(stories_artifact("kv-embedding"), tmp_path)
    damage(artifact)
    expected = f"artifact {str(artifact)!r} is damaged: {problem}; re-export it"
    with pytest.raises(DamagedArtifact) as raised:
        check_intact(artifact)
    assert str(raised.value) == expected
    with pytest.raises(DamagedArtifact) as raised:
        LOADERS[loader](artifact, tmp_path)
    assert str(raised.value).endswith(expected)
    assert not (tmp_path / "repository").exists() and not (tmp_path / "bench").exists()


def test_the_command_line_prints_the_damage_in_one_line(stories_artifact, tmp_path):
    artifact = _copy(stories_artifact("kv-embedding"), tmp_path)
    (artifact / TOKENIZER).unlink()
    result = subprocess.run([sys.executable, "-m", "kvembed.cli", "embed", str(artifact), "text"], capture_output=True,
                            text=True, env={**os.environ, "COLUMNS": "400"})
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: artifact {str(artifact)!r} is damaged: {TOKENIZER} is missing; re-export it"


def test_an_intact_artifact_passes_and_its_manifest_is_handed_back(stories_artifact):
    artifact = stories_artifact("kv-embedding")
    manifest = load_manifest(artifact)
    assert check_intact(manifest) is manifest and check_intact(artifact) == manifest
    assert manifest.directory == artifact and manifest.graph_path("onnxruntime") == artifact / MODEL
    with pytest.raises(ValueError, match="not read from an artifact directory"):
        check_intact(Manifest.from_dict(manifest.raw))


# -- the JSON form ------------------------------------------------------------------------------------


def test_the_json_form_is_what_was_read_with_what_was_changed(stories_artifact, tmp_path):
    artifact = stories_artifact("kv-embedding")
    on_disk = json.loads((artifact / MANIFEST).read_text())
    manifest = load_manifest(artifact)
    assert manifest.to_dict() == on_disk and list(manifest.to_dict()) == list(on_disk)
    changed = dataclasses.replace(manifest, dim=7, parity=dataclasses.replace(manifest.parity, held_out=HeldOut(0.5, 3, 2, False)))
    out = tmp_path / "written"
    out.mkdir()
    changed.write(out)
    written = json.loads((out / MANIFEST).read_text())
    assert written["dim"] == 7 and written["parity"]["held_out"] == {"worst_cosine": 0.5, "rows": 3, "texts": 2, "meets_bar": False, "decides": False}
    unchanged = {key: value for key, value in on_disk.items() if key not in ("dim", "parity")}
    assert {key: value for key, value in written.items() if key not in ("dim", "parity")} == unchanged
    reread = load_manifest(out)
    assert reread.dim == 7 and reread.parity.held_out == changed.parity.held_out and reread.source == manifest.source


def test_a_manifest_built_in_code_writes_every_field(stories_artifact, tmp_path):
    read = load_manifest(stories_artifact("kv-embedding"))
    built = Manifest(**{f.name: getattr(read, f.name) for f in dataclasses.fields(Manifest) if f.name not in ("raw", "directory")})
    with pytest.raises(ValueError, match="name the directory"):
        built.write()
    out = tmp_path / "built"
    out.mkdir()
    built.write(out)
    assert load_manifest(out) == read
