"""``kvembed embed-corpus``: Parquet/JSONL/TXT in, Parquet shards out, on a local Ray and in-process.

Every vector is checked against ``Embedder.encode`` of the same text (the independent in-process
oracle); resume is tested by killing real runs; bad input by real broken files.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from checks import cosines, run_python
from conftest import HANG_GUARD_S

from kvembed.corpus import CorpusError, CorpusOptions, embed_corpus
from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
FILES, ROWS_PER_FILE, SHARD_ROWS = 5, 4000, 1000  # 20,000 texts, 20 shards
WORDS = "the a cat dog sat ran on in park mat blue sky why is was happy über 東京 🎉 , . ?".split()


def corpus_texts(count: int, seed: int) -> list[str]:
    """Mixed lengths: mostly 1-16 words (~35 tokens), 1% empty, 0.2% long enough to be truncated."""
    rng = random.Random(seed)
    texts = []
    for i in range(count):
        roll = rng.random()
        words = 0 if roll < 0.01 else rng.randint(300, 700) if roll < 0.012 else rng.randint(1, 16)
        texts.append(" ".join(rng.choice(WORDS) for _ in range(words)))
    return texts


def encode(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """The oracle: ``Embedder.encode`` (its truncation warning is expected for long texts)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return embedder.encode(texts, batch_size=256, max_batch_tokens=16384)


def read_output(directory: Path) -> dict:
    """id -> float32 vector over every shard; fails on a duplicate id."""
    vectors: dict = {}
    for path in sorted(directory.glob("part-*.parquet")):
        table = pq.read_table(path)
        ids = table.column("id").to_pylist()
        flat = table.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        matrix = flat.reshape(len(ids), -1).astype(np.float32)
        for ident, vector in zip(ids, matrix):
            assert ident not in vectors, f"duplicate id {ident!r} in {path.name}"
            vectors[ident] = vector
    return vectors


def assert_matches(vectors: dict, expected: dict, min_cosine: float = 0.99999) -> None:
    assert vectors.keys() == expected.keys()
    ids = list(expected)
    a = np.stack([vectors[i] for i in ids])
    b = np.stack([expected[i] for i in ids])
    cosine = cosines(a, b)
    assert cosine.min() >= min_cosine, f"worst cosine {cosine.min()} for id {ids[int(cosine.argmin())]!r}"


def run_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvembed.cli", "embed-corpus", *args], capture_output=True, text=True, cwd=ROOT, **kwargs)


def interrupted_run(args: list[str], out: Path, shards_before_stop: int, sig: signal.Signals) -> subprocess.Popen:
    """``kvembed embed-corpus *args`` sent ``sig`` once ``out`` holds ``shards_before_stop`` shards
    (0: once the run has started, its ``_run.json`` written)."""
    # SIGINT at its default in the child: a shell starts background jobs (a CI script run with
    # `&`) with SIGINT ignored, Python then keeps ignoring it, and Ctrl-C would not be tested
    process = subprocess.Popen([sys.executable, "-m", "kvembed.cli", "embed-corpus", *args],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + HANG_GUARD_S
    def started() -> bool:
        return len(list(out.glob("part-*.parquet"))) >= shards_before_stop and (out / "_run.json").is_file()

    while not started():
        assert process.poll() is None, f"the run ended before it could be interrupted: {process.communicate()}"
        assert time.monotonic() < deadline, f"the run did not get that far in {HANG_GUARD_S} s: hung"
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before the interruption"
    process.send_signal(sig)
    process.wait(60)
    return process


# -- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifact(stories_artifact) -> Path:
    """The demo model with Value Aggregation over layers 1-2 (early exit: a cheap, real artifact)."""
    return stories_artifact("va", layers="1-2")


@pytest.fixture(scope="module")
def embedder(artifact) -> Embedder:
    return Embedder.load(artifact, provider="cpu", threads=2)


@pytest.fixture(scope="module")
def ray_session():
    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, embedder) -> tuple[Path, dict]:
    """5 Parquet files x 4,000 texts (with an extra column that must not be read) and the oracle:
    id -> ``Embedder.encode`` of that text."""
    folder = tmp_path_factory.mktemp("corpus")
    expected: dict = {}
    for f in range(FILES):
        texts = corpus_texts(ROWS_PER_FILE, seed=f)
        ids = [f"doc-{f}-{i}" for i in range(len(texts))]
        table = pa.table({"id": ids, "body": texts, "unused": [b"x" * 10] * len(texts)})
        pq.write_table(table, folder / f"part-{f}.parquet", row_group_size=700)
        expected.update(zip(ids, encode(embedder, texts)))
    return folder, expected


@pytest.fixture(scope="module")
def ray_output(tmp_path_factory, corpus, artifact, ray_session) -> tuple[Path, dict]:
    folder, _ = corpus
    out = tmp_path_factory.mktemp("ray") / "vectors"
    options = CorpusOptions(
        artifact, [str(folder / "*.parquet")], out, text_column="body", runner="ray", workers=2, threads=1,
        rows_per_file=SHARD_ROWS,
    )
    return out, embed_corpus(options)


# -- the 20,000-text corpus ------------------------------------------------------------------------------


def test_ray_runner_embeds_20000_parquet_texts_like_encode(corpus, ray_output):
    _, expected = corpus
    out, manifest = ray_output
    assert_matches(read_output(out), expected)
    assert (out / "_SUCCESS").is_file()
    assert json.loads((out / "_manifest.json").read_text()) == manifest
    assert manifest["rows"] == FILES * ROWS_PER_FILE and manifest["skipped"]["count"] == 0
    assert len(manifest["shards"]) == FILES * ROWS_PER_FILE // SHARD_ROWS
    assert [i["rows"] for i in manifest["inputs"]] == [ROWS_PER_FILE] * FILES
    assert manifest["truncated"] > 0 and manifest["tokens"] > manifest["rows"]
    assert manifest["artifact"]["method"]["name"] == "va" and manifest["embedding"]["dim"] == 32
    schema = pq.read_schema(out / manifest["shards"][0]["shard"])
    assert schema.names == ["id", "embedding"] and schema.field("embedding").type == pa.list_(pa.float32(), 32)


def test_local_runner_interrupted_twice_then_resumed_equals_the_ray_run(tmp_path, corpus, ray_output, artifact):
    folder, expected = corpus
    out = tmp_path / "vectors"
    args = [str(artifact), "-i", str(folder / "*.parquet"), "-o", str(out), "--text-column", "body",
            "--rows-per-file", str(SHARD_ROWS), "--threads-per-worker", "2", "--no-progress"]

    # Ctrl-C: the run stops cleanly, keeps finished shards and says how to resume
    first = interrupted_run(args, out, 2, signal.SIGINT)
    assert first.returncode == 130 and "--resume" in first.stderr.read()
    assert not list(out.glob("*.partial-*")) and not (out / "_SUCCESS").exists()
    # a crash (SIGKILL) while resuming: no cleanup at all
    second = interrupted_run([*args, "--resume"], out, 6, signal.SIGKILL)
    assert second.returncode == -signal.SIGKILL and not (out / "_SUCCESS").exists()
    kept = {p.name for p in out.glob("part-*.parquet")}
    assert 6 <= len(kept) < FILES * ROWS_PER_FILE // SHARD_ROWS

    manifest = embed_corpus(CorpusOptions(artifact, [str(folder / "*.parquet")], out, text_column="body",
                                          rows_per_file=SHARD_ROWS, threads=2, resume=True))
    assert manifest["shards_resumed"] == len(kept) and (out / "_SUCCESS").is_file()
    assert not list(out.glob("*.partial-*"))
    local = read_output(out)
    assert_matches(local, expected)
    assert_matches(local, read_output(ray_output[0]))
    assert {p.name for p in out.glob("part-*.parquet")} == {s["shard"] for s in ray_output[1]["shards"]}
    for key in ("rows", "tokens", "truncated"):
        assert manifest[key] == ray_output[1][key]


@pytest.mark.parametrize("runner", ["local", "ray"])
def test_cli_sigterm_stops_like_ctrl_c_and_dies_by_sigterm(tmp_path, artifact, runner):
    """Schedulers (Slurm, Kubernetes, systemd) stop jobs with SIGTERM: the same cleanup and message
    as Ctrl-C, then death by SIGTERM itself (shell status 143). ``ray``: a local Ray the CLI starts,
    whose ``ray.init`` would otherwise turn SIGTERM into ``sys.exit(15)``."""
    texts = corpus_texts(8000, seed=11)
    (tmp_path / "docs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "vectors"
    args = [str(artifact), "-i", str(tmp_path / "docs.txt"), "-o", str(out), "--rows-per-file", "400", "--runner", runner,
            "--threads-per-worker", "1", "--no-progress"]
    stopped = interrupted_run(args, out, 2, signal.SIGTERM)
    stderr = stopped.stderr.read()
    assert stopped.returncode == -signal.SIGTERM, stderr
    kept = len(list(out.glob("part-*.parquet")))
    assert f"error: interrupted (SIGTERM): {kept} finished shards are kept in {out}; run `kvembed embed-corpus --resume -o {out}`" in stderr
    assert "Traceback" not in stderr and "SIGTERM received" not in stderr  # nor Ray's C++ stack dump
    assert not list(out.glob("*.partial-*")) and not (out / "_SUCCESS").exists()
    manifest = embed_corpus(CorpusOptions(artifact, [str(tmp_path / "docs.txt")], out, rows_per_file=400, threads=2,
                                          resume=True, progress=False))
    assert manifest["rows"] == len(texts) and manifest["shards_resumed"] == kept >= 2


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_stopped_inside_its_first_shard_says_nothing_was_kept(tmp_path, artifact, sig):
    """Interrupted before any shard finished: the output folder the run made is removed, and the
    message says so (not "finished shards are kept"), and a plain rerun starts over."""
    (tmp_path / "docs.txt").write_text("\n".join(corpus_texts(60000, seed=12)) + "\n", encoding="utf-8")
    out = tmp_path / "vectors"
    args = [str(artifact), "-i", str(tmp_path / "docs.txt"), "-o", str(out), "--threads-per-worker", "1", "--no-progress"]
    stopped = interrupted_run(args, out, 0, sig)  # one shard of 60,000 rows: the signal lands inside it
    stderr = stopped.stderr.read()
    assert stopped.returncode == (130 if sig == signal.SIGINT else -sig), stderr
    stopped_by = "interrupted" if sig == signal.SIGINT else "interrupted (SIGTERM)"
    assert f"error: {stopped_by}: no shard was finished, so nothing was kept (no {out} is left); run the same command again" in stderr
    assert "kept;" not in stderr and "--resume" not in stderr and "Traceback" not in stderr
    assert not out.exists()


def test_cli_resume_reads_the_recorded_options(tmp_path, artifact, embedder):
    """``--resume -o OUT`` alone finishes a run started with other than the default options (read from
    its ``_run.json``); an option given again that would change the shards is refused naming both
    values, an equal one is fine, and so is one that only changes how the work runs."""
    texts = corpus_texts(8000, seed=13)
    (tmp_path / "docs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "vectors"
    args = [str(artifact), "-i", str(tmp_path / "docs.txt"), "-o", str(out), "--rows-per-file", "400", "--kind", "query",
            "--output-dtype", "float16", "--max-batch-tokens", "2048", "--format", "txt", "--threads-per-worker", "1", "--no-progress"]
    stopped = interrupted_run(args, out, 2, signal.SIGINT)
    stderr = stopped.stderr.read()
    kept = len(list(out.glob("part-*.parquet")))
    assert stopped.returncode == 130, stderr
    assert f"error: interrupted: {kept} finished shards are kept in {out}; run `kvembed embed-corpus --resume -o {out}` to finish" in stderr

    for given, refused in [(["--rows-per-file", "500"], "was started with --rows-per-file 400, not --rows-per-file 500"),
                           (["--kind", "document"], "was started with --kind query, not --kind document"),
                           (["-i", str(tmp_path / "other.txt")], f"was started with --input {tmp_path / 'docs.txt'}, not --input {tmp_path / 'other.txt'}"),
                           ([str(tmp_path)], f"was started with {artifact.resolve()}, not {tmp_path.resolve()}")]:
        result = run_cli("--resume", "-o", str(out), *given, timeout=120)
        assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
        assert f"error: --resume: '{out}' {refused}; leave" in result.stderr, result.stderr
    assert len(list(out.glob("part-*.parquet"))) == kept and not (out / "_SUCCESS").exists()

    # from another directory, the equal --kind repeated and the batch size changed
    resumed = subprocess.run([sys.executable, "-m", "kvembed.cli", "embed-corpus", "--resume", "-o", str(out), "--kind", "query",
                              "--max-batch-tokens", "4096"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "embedded 8,000 rows" in resumed.stdout and f"{kept} shards from an earlier run" in resumed.stdout
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["embedding"] == {"dim": 32, "dtype": "float16", "kind": "query", "normalized": True}
    options = manifest["options"]
    assert (options["rows_per_file"], options["format"], options["max_batch_tokens"], options["threads"]) == (400, "txt", 4096, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        expected = embedder.encode(texts, kind="query", batch_size=256, max_batch_tokens=16384)
    assert_matches(read_output(out), {f"docs.txt:{i + 1}": row for i, row in enumerate(expected)}, min_cosine=0.999)

    # a finished run: --resume with nothing to do; without a recorded run, ARTIFACT and --input are asked for
    again = run_cli("--resume", "-o", str(out), "--no-progress", timeout=120)
    assert again.returncode == 0 and "embedded 8,000 rows" in again.stdout, again.stderr
    empty = run_cli("--resume", "-o", str(tmp_path / "nothing"), timeout=60)
    assert empty.returncode == 2 and "holds no _run.json; give ARTIFACT and --input as well" in empty.stderr, empty.stderr
    plain = run_cli("-o", str(tmp_path / "nothing"), timeout=60)
    assert plain.returncode == 2 and "give ARTIFACT and --input (or --resume" in plain.stderr, plain.stderr


def test_ray_runner_resumes_only_missing_shards(tmp_path, corpus, ray_output, artifact, ray_session):
    folder, expected = corpus
    out = tmp_path / "vectors"
    shutil.copytree(ray_output[0], out)
    removed = sorted(out.glob("part-*.parquet"))[3]
    removed.unlink()
    (out / (removed.name + ".partial-dead")).write_bytes(b"half a shard")  # left by a killed actor
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}
    manifest = embed_corpus(CorpusOptions(artifact, [str(folder / "*.parquet")], out, text_column="body",
                                          runner="ray", workers=1, threads=1, rows_per_file=SHARD_ROWS, resume=True))
    assert manifest["shards_resumed"] == len(before) == FILES * ROWS_PER_FILE // SHARD_ROWS - 1
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet") if p.name in before} == before
    assert not list(out.glob("*.partial-*"))
    assert_matches(read_output(out), expected)
    assert manifest["rows"] == FILES * ROWS_PER_FILE


def test_cli_ray_run_of_a_healthy_corpus_prints_no_ray_warnings_or_errors(tmp_path, artifact, embedder):
    """The CLI's own local Ray: no token-auth WARNING, no E-level line from Ray's core (actor restarts
    with constructor arguments in the object store), no Ray Data warning (progress bars off, an
    actor pool larger than the shards: one shard here, --workers 2)."""
    texts = corpus_texts(300, seed=14)
    (tmp_path / "docs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    result = run_cli(str(artifact), "-i", str(tmp_path / "docs.txt"), "-o", str(tmp_path / "out"), "--runner", "ray",
                     "--workers", "2", "--threads-per-worker", "1", "--rows-per-file", "1000", "--no-progress", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "embedded 300 rows" in result.stdout
    noise = [line for line in result.stderr.splitlines()
             if re.match(r"\[\S+ \S+ [EWF] \d+ \d+\]", line) or re.search(r"\b(WARNING|ERROR)\b|^warning:|Traceback", line)]
    assert not noise, result.stderr
    expected = dict(zip((f"docs.txt:{i + 1}" for i in range(len(texts))), encode(embedder, texts)))
    assert_matches(read_output(tmp_path / "out"), expected)


def test_cli_joins_a_running_ray_cluster_by_address(tmp_path, artifact, embedder, ray_session):
    texts = corpus_texts(300, seed=9)
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": 1000 + i, "text": t}) + "\n" for i, t in enumerate(texts)))
    address = ray_session.get_runtime_context().gcs_address
    result = run_cli(str(artifact), "-i", str(source), "-o", str(tmp_path / "out"), "--runner", "ray",
                     "--ray-address", address, "--workers", "1", "--threads-per-worker", "1", "--no-progress",
                     timeout=300)
    assert result.returncode == 0, result.stderr
    assert "embedded 300 rows" in result.stdout
    assert ray_session.is_initialized()  # the CLI left the test's cluster running
    expected = dict(zip((str(1000 + i) for i in range(len(texts))), encode(embedder, texts)))
    assert_matches(read_output(tmp_path / "out"), expected)


# -- JSONL and TXT inputs, float16 ----------------------------------------------------------------------


def test_jsonl_input_with_ids_float16_output(tmp_path, artifact, embedder):
    texts = corpus_texts(500, seed=3)
    lines = [json.dumps({"uid": f"u{i}", "text": t, "meta": {"n": i}}) for i, t in enumerate(texts)]
    lines.insert(10, "")  # a blank line holds no record
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[300:]) + "\n", encoding="utf-8")
    manifest = embed_corpus(CorpusOptions(artifact, [str(tmp_path / "*.jsonl")], tmp_path / "out", id_column="uid",
                                          output_dtype="float16", rows_per_file=120, progress=False))
    expected = dict(zip((f"u{i}" for i in range(len(texts))), encode(embedder, texts)))
    assert pq.read_schema(tmp_path / "out" / "part-00000-00000.parquet").field("embedding").type == pa.list_(pa.float16(), 32)
    assert_matches(read_output(tmp_path / "out"), expected, min_cosine=0.999)
    assert manifest["rows"] == 500 and [i["lines"] for i in manifest["inputs"]] == [300, 201]


def test_openvino_provider(tmp_path, artifact, embedder):
    """--provider openvino: every worker runs OpenVINO; its vectors are onnxruntime's (f32 hint:
    the fp32 bar; bf16 where the CPU has it: 0.999), and the manifest records the provider."""
    pytest.importorskip("openvino", reason="needs the openvino package (pip install 'kvembed[openvino]')")
    from kvembed.backends.openvino import default_precision, import_openvino

    texts = corpus_texts(200, seed=7)
    (tmp_path / "docs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    manifest = embed_corpus(CorpusOptions(artifact, [str(tmp_path / "docs.txt")], tmp_path / "out", provider="openvino",
                                          rows_per_file=80, progress=False))
    bar = 0.999 if default_precision(import_openvino().Core()) == "bf16" else 0.99999
    expected = {f"docs.txt:{i + 1}": vector for i, vector in enumerate(encode(embedder, texts))}
    assert_matches(read_output(tmp_path / "out"), expected, min_cosine=bar)
    assert manifest["rows"] == 200 and manifest["options"]["provider"] == "openvino"
    with pytest.raises(CorpusError, match="--provider"):
        CorpusOptions(artifact, [str(tmp_path / "docs.txt")], tmp_path / "x", provider="vulkan")


def test_txt_input_gets_file_and_line_ids(tmp_path, artifact, embedder):
    texts = ["first line", "", "  spaced  ", "Ünïcödé 東京 🎉", "last"]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_bytes(("\r\n".join(texts[:2]) + "\r\n").encode())  # Windows endings
    (tmp_path / "docs" / "more.txt").write_text("\n".join(texts[2:]), encoding="utf-8")  # no final newline
    manifest = embed_corpus(CorpusOptions(artifact, [str(tmp_path / "docs")], tmp_path / "out", progress=False))
    ids = ["notes.txt:1", "notes.txt:2", "more.txt:1", "more.txt:2", "more.txt:3"]
    assert_matches(read_output(tmp_path / "out"), dict(zip(ids, encode(embedder, texts))))
    assert manifest["rows"] == 5 and manifest["columns"]["id"] is None


def test_parquet_integer_ids_are_kept_and_row_ids_used_without_an_id_column(tmp_path, artifact, embedder):
    texts = corpus_texts(50, seed=5)
    pq.write_table(pa.table({"id": pa.array(range(50), pa.int32()), "text": texts}), tmp_path / "with.parquet")
    pq.write_table(pa.table({"text": texts}), tmp_path / "plain.parquet")
    embed_corpus(CorpusOptions(artifact, [str(tmp_path / "with.parquet")], tmp_path / "a", progress=False))
    embed_corpus(CorpusOptions(artifact, [str(tmp_path / "plain.parquet")], tmp_path / "b", progress=False))
    vectors = encode(embedder, texts)
    assert pq.read_schema(tmp_path / "a" / "part-00000-00000.parquet").field("id").type == pa.int64()
    assert_matches(read_output(tmp_path / "a"), dict(zip(range(50), vectors)))
    assert_matches(read_output(tmp_path / "b"), {f"plain.parquet:{i}": v for i, v in enumerate(vectors)})


# -- bad input --------------------------------------------------------------------------------------


def broken_jsonl(path: Path) -> list[str]:
    """A JSONL file with four bad records among good ones; returns the good texts in order."""
    good = ["alpha", "beta", "gamma", "delta"]
    path.write_bytes(b"\n".join([
        json.dumps({"text": good[0]}).encode(),
        b'{"text": "unterminated',                       # line 2: invalid JSON
        json.dumps({"text": 42}).encode(),               # line 3: not a string
        json.dumps({"body": "x"}).encode(),              # line 4: no text key
        json.dumps({"text": good[1]}).encode(),
        b'{"text": "caf\xe9"}',                          # line 6: not UTF-8
        json.dumps(good[2]).encode(),                    # a bare JSON string is a text
        json.dumps({"text": good[3]}).encode(),
    ]) + b"\n")
    return good


@pytest.mark.parametrize(("line", "reason"), [(2, "not valid JSON"), (3, "is a number"), (4, "no 'text' key"), (6, "not valid UTF-8")])
def test_bad_jsonl_records_fail_naming_file_and_line(tmp_path, artifact, line, reason):
    source = tmp_path / "bad.jsonl"
    broken_jsonl(source)
    lines = source.read_bytes().split(b"\n")
    source.write_bytes(b"\n".join([lines[0], lines[line - 1]]) + b"\n")
    with pytest.raises(CorpusError, match=rf"bad\.jsonl:2: .*{reason}.*--on-error skip"):
        embed_corpus(CorpusOptions(artifact, [str(source)], tmp_path / "out", progress=False))
    assert not list((tmp_path / "out").glob("part-*"))


def test_skip_policy_counts_every_bad_record(tmp_path, artifact, embedder):
    good = broken_jsonl(tmp_path / "bad.jsonl")
    (tmp_path / "bad.txt").write_bytes(b"fine\n\xff\xfe broken\nalso fine\n")
    pq.write_table(pa.table({"text": ["ok", None, "ok too"]}), tmp_path / "nulls.parquet")
    jsonl = embed_corpus(CorpusOptions(artifact, [str(tmp_path / "bad.jsonl")], tmp_path / "j", on_error="skip", progress=False))
    assert jsonl["skipped"]["count"] == 4 and jsonl["rows"] == 4
    assert [e["where"].rsplit(":", 1)[1] for e in jsonl["skipped"]["examples"]] == ["2", "3", "4", "6"]
    assert_matches(read_output(tmp_path / "j"), dict(zip(["bad.jsonl:1", "bad.jsonl:5", "bad.jsonl:7", "bad.jsonl:8"], encode(embedder, good))))
    txt = embed_corpus(CorpusOptions(artifact, [str(tmp_path / "bad.txt")], tmp_path / "t", on_error="skip", progress=False))
    assert txt["skipped"]["count"] == 1 and set(read_output(tmp_path / "t")) == {"bad.txt:1", "bad.txt:3"}
    with pytest.raises(CorpusError, match=r"nulls\.parquet row 1: 'text' is null"):
        embed_corpus(CorpusOptions(artifact, [str(tmp_path / "nulls.parquet")], tmp_path / "p", progress=False))
    nulls = embed_corpus(CorpusOptions(artifact, [str(tmp_path / "nulls.parquet")], tmp_path / "p2", on_error="skip", progress=False))
    assert nulls["skipped"]["count"] == 1 and set(read_output(tmp_path / "p2")) == {"nulls.parquet:0", "nulls.parquet:2"}


def test_file_level_problems_are_named(tmp_path, artifact):
    def fails(match: str, inputs: list[str], **options) -> None:
        with pytest.raises(CorpusError, match=match):
            embed_corpus(CorpusOptions(artifact, inputs, tmp_path / "out", progress=False, **options))

    pq.write_table(pa.table({"id": ["a"], "text": ["x"]}), tmp_path / "good.parquet")
    pq.write_table(pa.table({"id": ["b"], "content": ["y"]}), tmp_path / "nocol.parquet")
    pq.write_table(pa.table({"id": [1], "text": [2]}), tmp_path / "inttext.parquet")
    pq.write_table(pa.table({"id": [1], "text": ["z"]}), tmp_path / "intid.parquet")
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    (tmp_path / "fake.parquet").write_text("not parquet")
    (tmp_path / "x.csv").write_text("a,b\n")
    fails(r"nocol\.parquet has no 'text' column \(columns: id, content\); pass --text-column", [str(tmp_path / "nocol.parquet")])
    fails(r"column 'text' of .*inttext\.parquet is int64, expected strings", [str(tmp_path / "inttext.parquet")])
    fails(r"'id' is string in .*good\.parquet but int64 in .*intid\.parquet", [str(tmp_path / "good.parquet"), str(tmp_path / "intid.parquet")])
    fails(r"good\.parquet has no 'key' id column", [str(tmp_path / "good.parquet")], id_column="key")
    fails(r"empty\.parquet is empty; remove it from --input or pass --on-error skip", [str(tmp_path / "empty.parquet")])
    fails(r"fake\.parquet is not a readable Parquet file", [str(tmp_path / "fake.parquet")])
    fails(r"cannot tell the format of .*x\.csv' from its suffix; pass --format parquet\|jsonl\|txt", [str(tmp_path / "x.csv")])
    fails(r"no input file matches", [str(tmp_path / "missing-*.parquet")])
    fails(r"--runner local runs one worker", [str(tmp_path / "good.parquet")], workers=2)
    skipped = embed_corpus(CorpusOptions(artifact, [str(tmp_path / "good.parquet"), str(tmp_path / "empty.parquet")],
                                         tmp_path / "ok", on_error="skip", progress=False))
    assert skipped["rows"] == 1 and skipped["empty_files"] == [str(tmp_path / "empty.parquet")]
    assert skipped["skipped"]["empty_files"] == 1


def test_output_of_an_earlier_run_needs_resume_with_the_same_options(tmp_path, artifact):
    (tmp_path / "docs.txt").write_text("one\ntwo\nthree\n")
    base = dict(artifact=artifact, inputs=[str(tmp_path / "docs.txt")], output=tmp_path / "out", progress=False)
    first = embed_corpus(CorpusOptions(**base, rows_per_file=2))
    with pytest.raises(CorpusError, match="holds an earlier, finished run; pass --overwrite to replace it"):
        embed_corpus(CorpusOptions(**base, rows_per_file=2))
    with pytest.raises(CorpusError, match=r"--resume: .* different rows per file \(2 vs now 3\)"):
        embed_corpus(CorpusOptions(**base, rows_per_file=3, resume=True))
    (tmp_path / "docs.txt").write_text("one\ntwo\nthree\nfour\n")
    with pytest.raises(CorpusError, match="different inputs"):
        embed_corpus(CorpusOptions(**base, rows_per_file=2, resume=True))
    (tmp_path / "docs.txt").write_text("one\ntwo\nthree\n")
    again = embed_corpus(CorpusOptions(**base, rows_per_file=2, resume=True))
    assert again["shards_resumed"] == 2 and again["rows"] == first["rows"] == 3


def test_cli_bad_input_is_one_line_on_stderr_with_exit_2(tmp_path, artifact):
    (tmp_path / "docs.jsonl").write_text('{"text": "fine"}\n{"text": null}\n')
    result = run_cli(str(artifact), "-i", str(tmp_path / "docs.jsonl"), "-o", str(tmp_path / "out"), timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "docs.jsonl:2: 'text' is null" in result.stderr


def test_cli_run_stopped_by_early_bad_input_leaves_no_trace(tmp_path, artifact):
    """A bad record among the first ones, or a --text-column typo, fails before the run records
    itself: once the input or the option is fixed, a plain rerun just works."""
    source, out = tmp_path / "docs.jsonl", tmp_path / "out"
    source.write_text('{"text": "fine"}\n{"text": null}\n')
    bad_record = run_cli(str(artifact), "-i", str(source), "-o", str(out), timeout=120)
    assert bad_record.returncode == 2 and "docs.jsonl:2: 'text' is null" in bad_record.stderr
    assert not out.exists()
    source.write_text('{"text": "fine"}\n{"text": "fixed"}\n')
    typo = run_cli(str(artifact), "-i", str(source), "-o", str(out), "--text-column", "txt", timeout=120)
    assert typo.returncode == 2 and "has no 'txt' key in its first 2 objects (keys: text); pass --text-column" in typo.stderr
    assert not out.exists()
    fixed = run_cli(str(artifact), "-i", str(source), "-o", str(out), timeout=120)
    assert fixed.returncode == 0 and "embedded 2 rows" in fixed.stdout, fixed.stderr


def test_text_column_typo_fails_even_when_skipping_bad_records(tmp_path, artifact):
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"body": f"x{i}", "id": i}) + "\n" for i in range(300)))
    with pytest.raises(CorpusError, match=r"docs\.jsonl has no 'text' key in its first 100 objects \(keys: body, id\)"):
        embed_corpus(CorpusOptions(artifact, [str(tmp_path / "docs.jsonl")], tmp_path / "out", on_error="skip", progress=False))
    assert not (tmp_path / "out").exists()


def late_bad_corpus(folder: Path) -> Path:
    """a.jsonl (150 good lines) and b.jsonl whose line 120 has a null text: past the records
    checked up front, so the run has started (a.jsonl's shard finished) when it stops."""
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": f"a {i}"}) + "\n" for i in range(150)))
    lines = [json.dumps({"text": None if i == 119 else f"b {i}"}) for i in range(150)]
    (folder / "b.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "b.jsonl"


def test_run_stopped_by_a_later_bad_record_says_how_to_go_on(tmp_path, artifact, embedder):
    bad = late_bad_corpus(tmp_path / "docs")
    out = tmp_path / "out"
    options = dict(artifact=artifact, inputs=[str(tmp_path / "docs")], progress=False)
    with pytest.raises(CorpusError, match=r"b\.jsonl:120: .*null.*--on-error skip \(then rerun with --resume to keep the 1 finished "
                                          r"shard, or --overwrite to start again\)"):
        embed_corpus(CorpusOptions(**options, output=out, rows_per_file=200))
    assert sorted(p.name for p in out.iterdir()) == ["_run.json", "part-00000-00000.parquet"]
    with pytest.raises(CorpusError, match=r"holds an earlier, unfinished run \(1 finished shard\); pass --resume to finish it, "
                                          "--overwrite to delete it and start again"):
        embed_corpus(CorpusOptions(**options, output=out, rows_per_file=200))
    kept = (out / "part-00000-00000.parquet").stat().st_mtime_ns
    shutil.copytree(out, tmp_path / "out2")

    # the record fixed: b.jsonl has no finished shard, so its change does not stop the resume
    bad.write_text(bad.read_text().replace("null", '"b 119"'))
    fixed = embed_corpus(CorpusOptions(**options, output=out, rows_per_file=200, resume=True))
    assert fixed["shards_resumed"] == 1 and fixed["rows"] == 300 and fixed["skipped"]["count"] == 0
    assert (out / "part-00000-00000.parquet").stat().st_mtime_ns == kept
    texts = [f"a {i}" for i in range(150)] + [f"b {i}" for i in range(150)]
    ids = [f"a.jsonl:{i + 1}" for i in range(150)] + [f"b.jsonl:{i + 1}" for i in range(150)]
    assert_matches(read_output(out), dict(zip(ids, encode(embedder, texts))))

    # or the bad record skipped: the finished shard holds no bad record, so --on-error may become skip
    bad.write_text(bad.read_text().replace('"b 119"', "null"))
    skipped = embed_corpus(CorpusOptions(**options, output=tmp_path / "out2", rows_per_file=200, resume=True, on_error="skip"))
    assert skipped["shards_resumed"] == 1 and skipped["rows"] == 299 and skipped["skipped"]["count"] == 1
    with pytest.raises(CorpusError, match="different on error"):  # skip -> fail is refused: shards may hold skips
        embed_corpus(CorpusOptions(**options, output=tmp_path / "out2", rows_per_file=200, resume=True))


def test_resume_refuses_a_changed_input_with_finished_shards_and_overwrite_starts_again(tmp_path, artifact):
    bad = late_bad_corpus(tmp_path / "docs")
    out = tmp_path / "out"
    options = dict(artifact=artifact, inputs=[str(tmp_path / "docs")], output=out, rows_per_file=100, progress=False)
    with pytest.raises(CorpusError, match="keep the 3 finished shards"):  # a.jsonl: 2 shards, b.jsonl: 1
        embed_corpus(CorpusOptions(**options))
    bad.write_text(bad.read_text().replace("null", '"b 119"'))
    with pytest.raises(CorpusError, match=r"--resume: .* different inputs: .*b\.jsonl changed \(2,587 -> 2,590 bytes, 150 -> 150 "
                                          r"rows\) and some of its shards are finished; .* --overwrite to delete its 3 finished shards"):
        embed_corpus(CorpusOptions(**options, resume=True))
    with pytest.raises(CorpusError, match="--resume keeps an earlier run and --overwrite deletes it"):
        CorpusOptions(**options, resume=True, overwrite=True)
    again = embed_corpus(CorpusOptions(**options, overwrite=True))
    assert again["shards_replaced"] == 3 and again["shards_resumed"] == 0 and again["rows"] == 300
    assert len(list(out.glob("part-*.parquet"))) == 4 and (out / "_SUCCESS").is_file()


def test_output_with_only_a_run_record_does_not_block_a_new_run(tmp_path, artifact):
    """A run killed before its first shard leaves only _run.json (for other inputs, here): nothing
    finished, nothing to protect. Files that are not kvembed's are never deleted, even by --overwrite."""
    (tmp_path / "docs.txt").write_text("one\ntwo\n")
    base = dict(artifact=artifact, inputs=[str(tmp_path / "docs.txt")], progress=False)
    for resume in (False, True):
        out = tmp_path / f"out-{resume}"
        out.mkdir()
        (out / "_run.json").write_text(json.dumps({"inputs": [{"path": "/elsewhere.txt", "bytes": 1, "rows": 1}]}))
        (out / "part-00000-00000.parquet.partial-dead").write_bytes(b"half a shard")
        manifest = embed_corpus(CorpusOptions(**base, output=out, resume=resume))
        assert manifest["rows"] == 2 and manifest["shards_resumed"] == 0 and not list(out.glob("*.partial-*"))
        assert json.loads((out / "_run.json").read_text())["inputs"][0]["path"] == str(tmp_path / "docs.txt")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    pq.write_table(pa.table({"x": [1]}), foreign / "part-0.parquet")
    with pytest.raises(CorpusError, match=r"holds part-0\.parquet, a part-\*\.parquet file not written by kvembed"):
        embed_corpus(CorpusOptions(**base, output=foreign, overwrite=True))
    assert (foreign / "part-0.parquet").is_file()


def test_cli_unreachable_ray_address_fails_at_once_without_touching_the_output(tmp_path, artifact):
    """``ray.init`` retries a dead HOST:PORT for minutes (logging every attempt); the CLI checks it first."""
    (tmp_path / "docs.txt").write_text("one\n")
    result = run_cli(str(artifact), "-i", str(tmp_path / "docs.txt"), "-o", str(tmp_path / "out"), "--runner", "ray",
                     "--ray-address", "127.0.0.1:9", "--workers", "1", "--threads-per-worker", "1", timeout=60)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
    assert "cannot connect to a Ray cluster at --ray-address 127.0.0.1:9" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_old_names_of_runner_and_max_batch_tokens_are_refused(tmp_path, artifact):
    """``engine=`` and ``batch_tokens=`` are gone (``--engine`` and ``--batch-tokens`` too:
    tests/test_cli_tree.py). The manifest records ``runner``, and an output whose manifest recorded
    ``engine`` (an older kvembed wrote it) still resumes."""
    (tmp_path / "docs.txt").write_text("one\ntwo\nthree\n")
    base = [str(artifact), "-i", str(tmp_path / "docs.txt")]
    for old in ("engine", "batch_tokens"):
        with pytest.raises(TypeError, match=old):
            CorpusOptions(artifact, ["x.txt"], "out", **{old: "local"})
    out = tmp_path / "local"
    local = run_cli(*base, "-o", str(out), "--runner", "local", "--rows-per-file", "2", "--no-progress", timeout=120)
    assert local.returncode == 0 and "embedded 3 rows" in local.stdout, local.stderr
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["options"]["runner"] == "local" and "engine" not in manifest["options"]
    manifest["options"]["engine"] = manifest["options"].pop("runner")  # as an older kvembed wrote it
    (out / "_manifest.json").write_text(json.dumps(manifest))
    (out / "_SUCCESS").unlink()
    next(out.glob("part-*.parquet")).unlink()
    resumed = embed_corpus(CorpusOptions(artifact, [str(tmp_path / "docs.txt")], out, rows_per_file=2, resume=True, progress=False))
    assert resumed["shards_resumed"] == 1 and resumed["rows"] == 3 and resumed["options"]["runner"] == "local"


def test_corpus_imports_without_torch():
    script = "import sys, kvembed.corpus, kvembed.cli.corpus; assert 'torch' not in sys.modules and 'ray' not in sys.modules"
    result = run_python(script, cwd=ROOT)
    assert result.returncode == 0, result.stderr
