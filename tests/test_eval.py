"""``kvembed eval``: mteb's scores on local tasks equal an independent computation from the
embedders' own vectors; mteb's result files, the JSON/Markdown report and the chart are written;
bad task files and options fail with one line and exit 2 before any model or mteb loads.

The main run evaluates two artifacts of the demo model (kv-embedding and mean, torch-free runtime)
on the bundled STS and retrieval tasks in one command; a second run takes the PyTorch reference
path (``stories260k --config ...``) on a small JSONL STS file and the sample classification task.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr
from typer.testing import CliRunner

from kvembed.cli.main import app
from kvembed.eval.tasks import SAMPLES, load_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")

runner = CliRunner()
REFUSED_HUB = "http://127.0.0.1:9"  # nothing listens on the discard port: connection refused at once


def run(*args: str):
    result = runner.invoke(app, ["eval", *args])
    assert "Traceback" not in result.output, result.output
    return result


def one_line_error(result, *words: str) -> str:
    """The single 'error:' line of a failed run, checked for exit 2 and the expected words."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def sts_spearman(embedder, task) -> float:
    """Spearman of gold scores vs cosines of the embedder's own document vectors (symmetric task).

    The cosine is computed as mteb's STS evaluator defines ``cosine_scores``: ``1 -
    paired_cosine_distances`` on the float32 vectors. The demo model's cosines sit within 1e-4 of
    1, where float32 rounding creates ties, so a float64 cosine ranks some pairs differently
    (Spearman 0.1572 vs 0.1584 for the mean artifact): the formula matters, not just the idea."""
    from sklearn.metrics.pairwise import paired_cosine_distances

    first = embedder.encode(task.data["sentence1"], kind="document", batch_size=32)
    second = embedder.encode(task.data["sentence2"], kind="document", batch_size=32)
    assert first.dtype == np.float32
    return float(spearmanr(task.data["score"], 1 - paired_cosine_distances(first, second)).statistic)


def ndcg_at_10(embedder, task) -> float:
    """Mean nDCG@10 (gain = relevance grade, log2 discount, as trec_eval) with queries embedded
    as queries and passages as documents (title and text joined like mteb's corpus loader)."""
    query_ids = list(task.data["queries"])
    doc_ids = list(task.data["corpus"])
    docs = [(e["title"] + " " + e["text"]).strip() if e["title"] else e["text"] for e in task.data["corpus"].values()]
    q = embedder.encode([task.data["queries"][i] for i in query_ids], kind="query", batch_size=32)
    d = embedder.encode(docs, kind="document", batch_size=32)
    scores = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (d / np.linalg.norm(d, axis=1, keepdims=True)).T
    total = 0.0
    for row, query in enumerate(query_ids):
        relevance = task.data["qrels"].get(query, {})
        # trec_eval's order: score descending, ties by document id descending
        ranking = sorted(range(len(doc_ids)), key=lambda j: (float(scores[row, j]), doc_ids[j]), reverse=True)[:10]
        dcg = sum(relevance.get(doc_ids[j], 0) / math.log2(rank + 2) for rank, j in enumerate(ranking))
        ideal = sorted(relevance.values(), reverse=True)[:10]
        total += dcg / sum(g / math.log2(rank + 2) for rank, g in enumerate(ideal))
    return total / len(query_ids)


# -- the shipped sample tasks ---------------------------------------------------------------------


def test_sample_tasks_are_the_promised_size_and_regenerate_byte_for_byte(tmp_path):
    sts = load_task(SAMPLES["sample-sts"])
    assert len(sts.data["score"]) >= 100
    scores = np.array(sts.data["score"])
    assert scores.min() == 0.0 and scores.max() == 5.0 and len(set(scores.tolist())) >= 10  # graded, paraphrase to unrelated
    retrieval = load_task(SAMPLES["sample-retrieval"])
    assert len(retrieval.data["queries"]) >= 50 and len(retrieval.data["corpus"]) >= 200
    assert len({e["text"] for e in retrieval.data["corpus"].values()}) == len(retrieval.data["corpus"])
    classification = load_task(SAMPLES["sample-classification"])
    assert classification.kind == "classification" and len(set(classification.data["label"])) == 4

    sys.path.insert(0, str(SAMPLES["sample-sts"].parent))
    try:
        import build_samples
    finally:
        sys.path.pop(0)
    corpus, queries, qrels = build_samples.retrieval()
    folder = SAMPLES["sample-retrieval"]
    assert (folder / "corpus.jsonl").read_text(encoding="utf-8") == "".join(json.dumps(r) + "\n" for r in corpus)
    assert (folder / "queries.jsonl").read_text(encoding="utf-8") == "".join(json.dumps(r) + "\n" for r in queries)
    assert (folder / "qrels.tsv").read_text(encoding="utf-8").splitlines()[1:] == [f"{a}\t{b}\t{c}" for a, b, c in qrels]
    rows = build_samples.classification()
    assert SAMPLES["sample-classification"].read_text(encoding="utf-8") == "".join(json.dumps(r) + "\n" for r in rows)


# -- two artifacts on STS + retrieval in one command -----------------------------------------------


@pytest.fixture(scope="module")
def artifact_run(stories_artifact, tmp_path_factory):
    kv, mean, kv_int8 = stories_artifact("kv-embedding"), stories_artifact("mean"), stories_artifact("kv-embedding", "int8")
    out = tmp_path_factory.mktemp("eval") / "out"
    result = run(f"kv={kv}", f"mean={mean}", f"kv-int8={kv_int8}", "--task", "sample-sts", "--task", "sample-retrieval",
                 "--out", str(out))
    assert result.exit_code == 0, result.output
    return ({"kv": kv, "mean": mean, "kv-int8": kv_int8}, out, json.loads((out / "results.json").read_text(encoding="utf-8")),
            result.output)


def test_sts_scores_equal_spearman_of_the_runtime_cosines(artifact_run):
    from kvembed.runtime import Embedder

    artifacts, _, report, _ = artifact_run
    task = load_task(SAMPLES["sample-sts"])
    for label, directory in artifacts.items():
        scores = report["scores"][label]["sample-sts"]
        assert scores["metrics"]["cosine_spearman"] == scores["main_score"]
        assert scores["main_score"] == pytest.approx(sts_spearman(Embedder.load(directory), task), abs=1e-9)


def test_retrieval_ndcg_equals_an_independent_ndcg_with_query_and_document_prompts(artifact_run):
    from kvembed.runtime import Embedder

    artifacts, _, report, _ = artifact_run
    task = load_task(SAMPLES["sample-retrieval"])
    kv = Embedder.load(artifacts["kv"])
    assert kv.method.templates["query"] != kv.method.templates["document"]  # the kinds differ for kv-embedding
    for label, directory in artifacts.items():
        expected = ndcg_at_10(Embedder.load(directory), task)
        assert report["scores"][label]["sample-retrieval"]["main_score"] == pytest.approx(expected, abs=2e-5)  # mteb rounds to 5 places


def test_reports_and_mteb_result_files_are_written(artifact_run):
    _, out, report, _ = artifact_run
    for label in ("kv", "mean"):
        for task in ("sample-sts", "sample-retrieval"):
            path = out / "mteb" / "results" / f"kvembed__{label}" / "local" / f"{task}.json"
            saved = json.loads(path.read_text(encoding="utf-8"))  # mteb's own TaskResult file
            assert saved["task_name"] == task
            assert saved["scores"]["test"][0]["main_score"] == pytest.approx(report["scores"][label][task]["main_score"], abs=1e-6)
            assert str(path.relative_to(out)) in report["mteb_result_files"]
    assert [c["label"] for c in report["configurations"]] == ["kv", "mean", "kv-int8"]
    assert report["configurations"][0]["resolved"]["name"] == "kv-embedding" and report["configurations"][0]["artifact"]
    table = (out / "results.md").read_text(encoding="utf-8")
    kv_sts = report["scores"]["kv"]["sample-sts"]["main_score"]
    assert "| kv | kv-embedding" in table and f"{kv_sts:.4f}" in table
    png = (out / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    import matplotlib.image

    assert matplotlib.image.imread(out / "results.png").shape[0] > 200


def test_the_demo_model_is_said_to_score_near_zero(artifact_run):
    """Issue 29: the demo model's near-zero retrieval scores come with a word that they are expected."""
    *_, output = artifact_run
    note = " ".join(output.split()).split("note: ", 1)[1]
    assert note.startswith("kv, mean, kv-int8 ran on stories260k") and "scores near zero are expected" in note


def test_each_precision_is_shown_beside_its_scores(artifact_run):
    """Artifacts of several precisions side by side: the precision and the backend that ran it, the
    gate's worst cosine and the held-out one, as the manifests record them (JSON, Markdown, console)."""
    from kvembed.artifact import load_manifest
    from kvembed.backends.cpu import cpu_features

    artifacts, out, report, output = artifact_run
    configurations = {c["label"]: c for c in report["configurations"]}
    table = (out / "results.md").read_text(encoding="utf-8")
    # an int8 artifact runs its OpenVINO graph where its advisory check certified one (under the
    # bf16 hint on a CPU with BF16, at f32 on one without), with figures of its own; elsewhere
    # onnxruntime and the export's gate
    hint = "bf16" if cpu_features().bf16 else "f32"
    for label, precision in (("kv", "fp32"), ("kv-int8", "int8")):
        manifest, config = load_manifest(artifacts[label]), configurations[label]
        certificate = manifest.certificate("openvino", {"bf16": "bf16", "f32": "fp32"}[hint], bar="int8")
        ran = f"openvino-{hint}" if precision == "int8" and certificate is not None else "onnxruntime-cpu"
        assert (config["precision"], config["backend"]) == (precision, ran)
        if ran != "onnxruntime-cpu":
            assert config["gate_worst_cosine"] == certificate.worst_cosine != manifest.parity.gate.worst_cosine
            assert config["held_out_worst_cosine"] == certificate.raw["held_out_worst_cosine"]
        else:
            assert config["gate_worst_cosine"] == manifest.parity.gate.worst_cosine
            assert config["held_out_worst_cosine"] == manifest.parity.held_out.worst_cosine
        sts = report["scores"][label]["sample-sts"]["main_score"]
        row = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
        assert f"| {precision} ({ran}) | {config['gate_worst_cosine']:.5f} | {config['held_out_worst_cosine']:.5f} | {sts:.4f}" in row
    assert configurations["kv-int8"]["gate_worst_cosine"] < 0.9999 < configurations["kv"]["gate_worst_cosine"]
    assert "precision (backend) | gate worst cos | held-out worst cos" in table
    int8 = configurations["kv-int8"]
    assert (f"kv-int8 [int8 ({configurations['kv-int8']['backend']}); gate worst cos {int8['gate_worst_cosine']:.5f}, held-out "
            f"{int8['held_out_worst_cosine']:.5f}]: sample-sts") in " ".join(output.split())


# -- the PyTorch reference path: --config, JSONL STS, classification --------------------------------


def test_model_configs_on_jsonl_sts_and_classification(tmp_path):
    from sklearn.linear_model import LogisticRegression

    from kvembed.modeling.reference import TorchEmbedder

    sts = tmp_path / "mini-sts.jsonl"
    pairs = [("A cat sat on the mat.", "A cat is sitting on a mat.", 4.8), ("The sun is hot.", "Ice is cold.", 0.5),
             ("He plays the piano.", "He is playing piano music.", 4.2), ("Birds fly south.", "Taxes rose again.", 0.0),
             ("The soup is warm.", "The stew is hot.", 3.1), ("She reads a book.", "A woman is reading.", 3.9)]
    sts.write_text("".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for a, b, s in pairs), encoding="utf-8")
    out = tmp_path / "out"
    result = run("stories260k", "--config", "last-token", "--config", "tp=token-prepending:tp_stop=3",
                 "--task", str(sts), "--task", "sample-classification", "--out", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert [c["label"] for c in report["configurations"]] == ["last-token", "tp"]
    assert report["configurations"][1]["resolved"]["options"]["tp_stop"] == 3
    task = load_task(sts)
    classification = load_task(SAMPLES["sample-classification"])
    for label, method, options in (("last-token", "last-token", {}), ("tp", "token-prepending", {"tp_stop": 3})):
        embedder = TorchEmbedder.from_pretrained("stories260k", method, **options)
        assert report["scores"][label]["mini-sts"]["main_score"] == pytest.approx(sts_spearman(embedder, task), abs=1e-9)
        # mteb's classification: logistic regression (max_iter 100, seed 42) on every training row
        data = classification.data
        names = sorted(set(data["label"]))
        train = [i for i, s in enumerate(data["split"]) if s == "train"]
        test = [i for i, s in enumerate(data["split"]) if s == "test"]
        order = list(range(len(train)))
        np.random.RandomState(42).shuffle(order)
        train = [train[i] for i in order]
        vectors = embedder.encode(data["text"], kind="document")
        labels = np.array([names.index(label) for label in data["label"]])
        model = LogisticRegression(max_iter=100, random_state=42).fit(vectors[train], labels[train])
        accuracy = float((model.predict(vectors[test]) == labels[test]).mean())
        assert report["scores"][label]["sample-classification"]["main_score"] == pytest.approx(accuracy, abs=1e-9)


def test_two_models_are_set_side_by_side_per_configuration(tmp_path):
    """Two model sources with the same --config list: the JSON says which model and configuration
    each result is, results.md gains a configuration x model table, the chart one bar per model."""
    out = tmp_path / "out"
    result = run("a=stories260k", "b=stories260k", "--config", "last-token", "--config", "kv=kv-embedding:layers=1-2",
                 "--task", "sample-sts", "--out", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "results.json").read_text(encoding="utf-8"))
    described = [(c["label"], c["model"], c["name"]) for c in report["configurations"]]
    assert described == [("a/last-token", "a", "last-token"), ("a/kv", "a", "kv"), ("b/last-token", "b", "last-token"),
                         ("b/kv", "b", "kv")]
    score = {label: report["scores"][label]["sample-sts"]["main_score"] for label, *_ in described}
    assert score["a/kv"] == score["b/kv"] and score["a/last-token"] == score["b/last-token"]  # one model, deterministic
    table = (out / "results.md").read_text(encoding="utf-8").split("## Models side by side", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert rows[0] == "| sample-sts (cosine_spearman) | a | b |"
    for row, name in zip(rows[2:], ("last-token", "kv")):
        cells = [cell.strip().strip("*") for cell in row.strip("|").split("|")]
        assert cells == [name, f"{score['a/' + name]:.4f}", f"{score['b/' + name]:.4f}"]
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(out / "results.png").shape
    assert height > 200 and width > height


# -- bad input: one line, exit 2, before mteb or a model loads --------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        ("no-score.tsv", "sentence1\tsentence2\na\tb\n", ("missing column 'score'", "sentence1, sentence2, score")),
        ("pairs.csv", "sentence1,sentence2,score\na,b,1\n", ("unknown format '.csv'", ".tsv or .jsonl")),
        ("empty.tsv", "", ("is empty",)),
        ("blank.jsonl", "\n\n", ("is empty",)),
        ("bad.jsonl", '{"sentence1": "a", "sentence2": "b", "score": 1}\n{"sentence1": \n', ("bad.jsonl:2", "invalid JSON")),
        ("words.tsv", "sentence1\tsentence2\tscore\na\tb\t1\nc\td\thigh\n", ("words.tsv:3", "'score' must be a number")),
        ("ragged.tsv", "sentence1\tsentence2\tscore\na\tb\n", ("ragged.tsv:2", "2 tab-separated fields")),
        ("other.tsv", "question\tanswer\na\tb\n", ("neither STS", "classification")),
        ("one-label.jsonl", '{"text": "a", "label": "x", "split": "train"}\n{"text": "b", "label": "x", "split": "test"}\n',
         ("at least 2 labels",)),
    ],
)
def test_bad_task_files_fail_in_one_line(tmp_path, name, content, words):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    one_line_error(run("stories260k", "--task", str(path), "--out", str(tmp_path / "out")), *words)
    assert not (tmp_path / "out").exists()


def test_bad_retrieval_folders_and_missing_tasks_fail_in_one_line(tmp_path):
    folder = tmp_path / "retr"
    folder.mkdir()
    (folder / "queries.tsv").write_text("id\ttext\nq1\twhere is it?\n", encoding="utf-8")
    (folder / "corpus.jsonl").write_text('{"id": "d1", "text": "here"}\n', encoding="utf-8")
    one_line_error(run("stories260k", "--task", str(folder), "--out", str(tmp_path / "o")), "no qrels.tsv/qrels.jsonl")
    (folder / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td9\t1\n", encoding="utf-8")
    one_line_error(run("stories260k", "--task", str(folder), "--out", str(tmp_path / "o")), "qrels.tsv:2", "'d9' is not in the corpus")
    one_line_error(run("stories260k", "--task", str(tmp_path / "nope.tsv"), "--out", str(tmp_path / "o")), "does not exist")
    one_line_error(run("stories260k", "--out", str(tmp_path / "o")), "--task")


def test_bad_configurations_fail_before_loading(tmp_path, stories_artifact):
    out = str(tmp_path / "o")
    one_line_error(run("stories260k", "--task", "sample-sts", "--config", "kv-embedding:layers=40-45", "--out", out),
                   "configuration 'kv-embedding:layers=40-45'")
    one_line_error(run("stories260k", "--task", "sample-sts", "--config", "no-such-method", "--out", out), "no-such-method")
    one_line_error(run("stories260k", "--task", "sample-sts", "--config", "va", "--method", "mean", "--out", out), "not both")
    one_line_error(run("stories260k", "--task", "sample-sts", "--config", "a=mean", "--config", "a=va", "--out", out), "'a'")
    one_line_error(run("stories260k", "--task", "sample-sts", "--provider", "gpu", "--out", out), "--provider", "cpu")
    one_line_error(run("stories260k", "--task", "sample-sts", "--threads", "0", "--out", out), "--threads must be >= 1")
    artifact = stories_artifact("mean")
    one_line_error(run(str(artifact), "--task", "sample-sts", "--method", "va", "--out", out), "computes mean")
    one_line_error(run(str(artifact), "--task", "sample-sts", "--config", "va", "--out", out), "--config applies to models only")


def test_official_mteb_task_without_the_hub_fails_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", REFUSED_HUB)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    line = one_line_error(run("stories260k", "--mteb-task", "STS12", "--out", str(tmp_path / "o")),
                          "MTEB task STS12", "mteb/sts12-sts", "HF_HUB_OFFLINE=1")
    assert "cannot be reached" in line
    one_line_error(run("stories260k", "--mteb-task", "NoSuchTask", "--out", str(tmp_path / "o")), "NoSuchTask")


def test_console_entry_point_prints_one_line_and_exits_2(tmp_path):
    (tmp_path / "x.tsv").write_text("sentence1\tscore\na\t1\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "kvembed.cli", "eval", "stories260k", "--task", str(tmp_path / "x.tsv"),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "missing column 'sentence2'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
