"""Hostile input and hostile artifacts (issue 57): what an attacker or a careless user sends gets a
JSON 4xx or one line and exit 2, nothing is read or written outside an artifact or ``--out``, and a
slow client holds no request slot past ``--read-timeout``.

Artifacts are copies of the demo model's, crafted as an attacker would (a manifest entry that
climbs out, a link out of the folder, a pipe, a tokenizer that panics, each with its hash
rewritten so the integrity check cannot be what stops it); the server is a real ``kvembed serve``
on 127.0.0.1 with short timeouts, reached over raw sockets where a client must misbehave."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from kvembed.bench.served import ServerProcess, kvembed_command, metric, metrics
from serve_util import wait_for

from kvembed.artifact import MANIFEST, MODEL, TOKENIZER
from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: a pre-tokenizer whose regex exhausts Oniguruma's retry limit on a run of "a": tokenizers panics
PANIC_PATTERN = "(a|aa)+$"
PANIC_TEXT = "a" * 40 + "c"
READ_TIMEOUT = 2


def _sha(path: Path) -> dict[str, object]:
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "bytes": path.stat().st_size}


def _copy(artifact: Path, where: Path) -> Path:
    return Path(shutil.copytree(artifact, where))


def _list(artifact: Path, name: str, record: dict[str, object]) -> None:
    """Add (or replace) a manifest entry, as an attacker who also writes the hash would."""
    manifest = json.loads((artifact / MANIFEST).read_text())
    manifest["files"][name] = record
    (artifact / MANIFEST).write_text(json.dumps(manifest))


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kvembed_command(), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines()  # beside the error, only what the command says it does
             if line.strip() and not line.startswith(("runtime: ", "kvembed bundle: adding artifact "))]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


# -- an artifact is a closed folder ---------------------------------------------------------------


@pytest.fixture(scope="module")
def climbing(stories_artifact, tmp_path_factory) -> Path:
    """``evil/art``, whose manifest lists ``../model.py`` (with its true sha256) beside a sibling
    ``evil/model.py``: the file Triton's python backend would run."""
    root = tmp_path_factory.mktemp("evil")
    art = _copy(stories_artifact("kv-embedding"), root / "art")
    (root / "model.py").write_text("raise SystemExit('attacker code ran')\n")
    _list(art, "../model.py", _sha(root / "model.py"))
    return art


def test_triton_build_refuses_an_entry_that_climbs_out_and_writes_nothing(climbing):
    out = climbing.parent / "repo"
    line = _one_line(_cli("triton", "build", str(climbing), "--out", str(out), "--backend", "python"))
    assert "'../model.py'" in line and "plain file names" in line, line
    assert not out.exists()


@pytest.mark.parametrize("entry", ["/etc/passwd", "../../../../etc/passwd", "sub/../../x", "a\x00b", "", ".."])
def test_every_reader_refuses_a_name_outside_the_artifact_without_telling_its_size(stories_artifact, tmp_path, entry):
    art = _copy(stories_artifact("kv-embedding"), tmp_path / "art")
    _list(art, entry, {"sha256": "0" * 64, "bytes": 0})
    with pytest.raises(ValueError, match="plain file names") as refused:
        Embedder.load(art, provider="cpu")
    assert "bytes" not in str(refused.value) and len(str(refused.value)) < 400


def test_the_commands_refuse_it_in_one_line(climbing, tmp_path):
    """embed, verify, serve (before it binds), embed-corpus, bundle and eval: one line each, exit 2,
    naming the entry, and no file's size in it."""
    texts = tmp_path / "in.txt"
    texts.write_text("one\ntwo\n")
    for args in (["embed", str(climbing), "a text"], ["verify", str(climbing)], ["serve", str(climbing), "--port", "0"],
                 ["embed-corpus", str(climbing), "-i", str(texts), "-o", str(tmp_path / "corpus")],
                 ["bundle", str(climbing), "--out", str(tmp_path / "bundle")],
                 ["eval", str(climbing), "--task", "sample-sts", "--out", str(tmp_path / "eval")]):
        line = _one_line(_cli(*args))
        assert "'../model.py'" in line and "bytes" not in line, (args, line)
    assert not any((tmp_path / name).exists() for name in ("corpus", "bundle", "eval"))


def test_a_path_too_long_for_the_os_is_one_short_line(tmp_path):
    """A name of thousands of characters (the OS's ENAMETOOLONG): the OS's reason and the name cut,
    not the whole name echoed back."""
    long = "../" * 2000 + "x"
    for args in (["embed", long, "a text"], ["bench", "--artifact", long, "--out", str(tmp_path / "bench")],
                 ["verify", long]):
        line = _one_line(_cli(*args))
        assert "File name too long" in line and " characters)" in line and len(line) < 400, (args, line[:500])


def test_a_link_out_of_the_folder_is_refused_listed_or_not(stories_artifact, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours\n" * 65)
    listed = _copy(stories_artifact("kv-embedding"), tmp_path / "listed")
    tokenizer = listed / TOKENIZER
    _list(listed, TOKENIZER, _sha(secret))
    tokenizer.unlink()
    tokenizer.symlink_to(secret)
    with pytest.raises(ValueError, match=f"{TOKENIZER} is a link out of the artifact folder"):
        Embedder.load(listed, provider="cpu")
    unlisted = _copy(stories_artifact("kv-embedding"), tmp_path / "unlisted")
    (unlisted / "weights.data").symlink_to(secret)  # a graph may name any file of its folder as external data
    line = _one_line(_cli("embed", str(unlisted), "a text"))
    assert "weights.data is a link out of the artifact folder" in line and "650" not in line


def test_bundle_and_verify_refuse_a_link_out_too(stories_artifact, tmp_path):
    """The readers that copy or re-run an artifact refuse what the loaders refuse: a listed file or
    the manifest itself linked out of the folder (bundle would hard-link the outside file into the
    bundle: one line, exit 2, nothing written), and an unlisted link out (verify: not verified)."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours\n" * 65)
    listed = _copy(stories_artifact("kv-embedding"), tmp_path / "listed")
    _list(listed, TOKENIZER, _sha(secret))
    (listed / TOKENIZER).unlink()
    (listed / TOKENIZER).symlink_to(secret)
    line = _one_line(_cli("bundle", str(listed), "--out", str(tmp_path / "bundle")))
    assert f"{TOKENIZER} is a link out of the artifact folder" in line and "650" not in line, line
    manifest = _copy(stories_artifact("kv-embedding"), tmp_path / "manifest")
    (tmp_path / "elsewhere.json").write_bytes((manifest / MANIFEST).read_bytes())
    (manifest / MANIFEST).unlink()
    (manifest / MANIFEST).symlink_to(tmp_path / "elsewhere.json")
    line = _one_line(_cli("bundle", str(manifest), "--out", str(tmp_path / "bundle")))
    assert f"{MANIFEST} is a link out of the artifact folder" in line, line
    assert not (tmp_path / "bundle").exists()
    unlisted = _copy(stories_artifact("kv-embedding"), tmp_path / "unlisted")
    (unlisted / "extra.txt").symlink_to(secret)
    verified = _cli("verify", str(unlisted))  # verify's verdict on damaged files: exit 1, each problem named
    assert verified.returncode == 1 and "problem: extra.txt is a link out of the artifact folder" in verified.stderr, verified
    assert "parity" not in verified.stdout, verified.stdout  # nothing run on it


def test_a_link_inside_the_folder_is_followed(stories_artifact, tmp_path):
    art = _copy(stories_artifact("kv-embedding"), tmp_path / "art")
    (art / TOKENIZER).rename(art / "real-tokenizer.json")
    (art / TOKENIZER).symlink_to("real-tokenizer.json")
    want = Embedder.load(stories_artifact("kv-embedding"), provider="cpu").encode(["a text"])
    assert (Embedder.load(art, provider="cpu").encode(["a text"]) == want).all()


def test_a_pipe_in_the_folder_is_refused_without_blocking(stories_artifact, tmp_path):
    art = _copy(stories_artifact("kv-embedding"), tmp_path / "art")
    os.mkfifo(art / "weights.data")
    started = time.monotonic()
    with pytest.raises(ValueError, match="weights.data is not a regular file"):
        Embedder.load(art, provider="cpu")
    listed = _copy(stories_artifact("kv-embedding"), tmp_path / "listed")
    (listed / TOKENIZER).unlink()
    os.mkfifo(listed / TOKENIZER)
    with pytest.raises(ValueError, match=f"{TOKENIZER} is not a regular file"):
        Embedder.load(listed, provider="cpu")
    assert time.monotonic() - started < 30


def test_a_file_read_but_not_listed_is_refused(stories_artifact, tmp_path):
    art = _copy(stories_artifact("kv-embedding"), tmp_path / "art")
    manifest = json.loads((art / MANIFEST).read_text())
    del manifest["files"][TOKENIZER]
    (art / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=f"{TOKENIZER} is read but not listed in the manifest's files"):
        Embedder.load(art, provider="cpu")


# -- the corpus and embed commands: one rule for text that is not Unicode --------------------------


def test_embed_corpus_skips_and_counts_rows_that_are_not_text(stories_artifact, tmp_path):
    rows = tmp_path / "rows.jsonl"
    lines = [json.dumps({"id": f"r{i}", "text": f"row {i}"}) for i in range(6)]
    lines[2] = '{"id": "r2", "text": "abc\\ud800def"}'  # a lone surrogate, as JSON escapes it
    lines[4] = "[" * 5000 + "]" * 5000  # nested past the parser's depth
    rows.write_text("\n".join(lines) + "\n")
    artifact = str(stories_artifact("kv-embedding"))
    refused = _one_line(_cli("embed-corpus", artifact, "-i", str(rows), "-o", str(tmp_path / "strict"), "--id-column", "id"))
    assert "rows.jsonl:3" in refused and "lone surrogate U+D800" in refused, refused
    done = _cli("embed-corpus", artifact, "-i", str(rows), "-o", str(tmp_path / "out"), "--id-column", "id", "--on-error", "skip")
    assert done.returncode == 0, done.stderr
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out")
    assert sorted(table.column("id").to_pylist()) == ["r0", "r1", "r3", "r5"]
    summary = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert summary["skipped"]["count"] == 2 and summary["duplicate_ids"]["count"] == 0, summary


def _panicking(artifact: Path, where: Path) -> Path:
    """A copy of ``artifact`` whose tokenizer panics on a run of "a" (its hash rewritten to match)."""
    panic = _copy(artifact, where)
    tokenizer = json.loads((panic / TOKENIZER).read_text())
    tokenizer["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": PANIC_PATTERN}, "behavior": "Isolated", "invert": False}
    (panic / TOKENIZER).write_text(json.dumps(tokenizer))
    _list(panic, TOKENIZER, _sha(panic / TOKENIZER))
    return panic


def test_embed_corpus_skips_and_counts_a_row_the_tokenizer_panics_on(stories_artifact, tmp_path):
    panic = _panicking(stories_artifact("kv-embedding"), tmp_path / "panic")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}", "text": t}) + "\n" for i, t in enumerate(["fine", PANIC_TEXT, "also fine"])))
    strict = _cli("embed-corpus", str(panic), "-i", str(rows), "-o", str(tmp_path / "strict"), "--id-column", "id")
    assert strict.returncode == 2 and "Traceback" not in strict.stderr, strict.stderr
    refused = strict.stderr.strip().splitlines()[-1]  # after the Rust panic's own report, which tokenizers prints
    assert refused.startswith("error: ") and "rows.jsonl:2" in refused and "tokenizer failed" in refused, refused
    done = _cli("embed-corpus", str(panic), "-i", str(rows), "-o", str(tmp_path / "out"), "--id-column", "id", "--on-error", "skip")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert summary["rows"] == 2 and summary["skipped"]["count"] == 1, summary


def test_embed_names_the_text_that_is_not_unicode(stories_artifact, tmp_path):
    art = stories_artifact("kv-embedding")
    with pytest.raises(ValueError, match=r"texts\[1\]: the text holds a lone surrogate U\+DC80 at character 1"):
        Embedder.load(art, provider="cpu").encode(["fine", "a\udc80b"])


# -- the server ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_server(stories_artifact, tmp_path_factory):
    """kv (the demo model) and panic (the same with a tokenizer that panics on a run of "a"), two
    request slots and short timeouts, so slow clients show within seconds."""
    root = tmp_path_factory.mktemp("hostile")
    panic = _panicking(stories_artifact("kv-embedding"), root / "panic")
    args = [f"kv={stories_artifact('kv-embedding')}", f"panic={panic}", "--max-concurrent-requests", "2",
            "--read-timeout", str(READ_TIMEOUT), "--graceful-timeout", "3", "--host", "127.0.0.1"]
    process = ServerProcess(args, root / "serve.log")
    yield process.wait_healthy()
    process.stop()


def _json_error(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json"), response.headers
    return response.json()["error"]


def test_malformed_requests_are_json_4xx(hostile_server):
    url = f"{hostile_server.url}/v1/embeddings"
    nested = "[" * 2000 + "]" * 2000
    assert _json_error(httpx.post(url, content=nested), 400)["code"] == "too_deeply_nested"
    error = _json_error(httpx.post(url, content=b'{"model": "kv", "input": ["ok", "fine", "abc\\ud800def"]}'), 400)
    assert error["message"].startswith("input[2]: the text holds a lone surrogate U+D800 at character 3"), error
    error = _json_error(httpx.post(url, json={"model": "panic", "input": ["fine", PANIC_TEXT]}), 400)
    assert error["message"].startswith("input[1]: the artifact's tokenizer failed on this text"), error
    assert httpx.post(url, json={"model": "panic", "input": "fine"}).status_code == 200  # the panic cost nothing else
    long_name = "m" * 1_000_000
    response = httpx.post(url, json={"model": long_name, "input": "a"})
    assert len(response.content) < 2000 and _json_error(response, 404)["param"] == "model"
    response = httpx.post(url, json={"model": "kv", "input": "a", "x" * 100_000: 1})
    assert len(response.content) < 2000 and _json_error(response, 400)
    for path in ("/docs", "/redoc"):  # no pages that load a CDN's scripts without a key
        assert _json_error(httpx.get(f"{hostile_server.url}{path}"), 404)
    assert httpx.get(f"{hostile_server.url}/openapi.json").status_code == 200
    assert "Traceback" not in hostile_server.output()


def _trickle(port: int, head_only: bool = False) -> socket.socket:
    """A connection that sends its request's start and then nothing: of its headers (``head_only``)
    or of a body that its Content-Length says is longer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    body = b'{"model": "kv", "input": "slow"}'
    head = f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    sock.sendall(head.encode()[:30] if head_only else head.encode() + b"\r\n" + body[:5])
    return sock


def _closed_after(sock: socket.socket, limit: float) -> tuple[float, bytes]:
    """Seconds until the server closes ``sock`` (reading what it sent first), at most ``limit``."""
    started = time.monotonic()
    sock.settimeout(limit)
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    return time.monotonic() - started, data


def test_slow_clients_hold_no_slot_and_are_cut_at_the_read_timeout(hostile_server):
    before = metrics(hostile_server.url)
    bodies = [_trickle(hostile_server.port) for _ in range(3)]  # more than the two slots
    heads = [_trickle(hostile_server.port, head_only=True) for _ in range(2)]
    silent = socket.create_connection(("127.0.0.1", hostile_server.port), timeout=30)
    wait_for(lambda: metric(metrics(hostile_server.url), "kvembed_request_bodies_reading") == 3, what="three bodies arriving")
    for _ in range(3):  # the slots are free: served while the slow ones dawdle
        response = httpx.post(f"{hostile_server.url}/v1/embeddings", json={"model": "kv", "input": "quick"})
        assert response.status_code == 200, response.text
    for sock in bodies:
        took, answer = _closed_after(sock, READ_TIMEOUT + 10)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code": "request_timeout"' in answer and took < READ_TIMEOUT + 5
    for sock in [*heads, silent]:
        took, answer = _closed_after(sock, READ_TIMEOUT + 10)
        assert answer == b"" and took < READ_TIMEOUT + 5
    after = metrics(hostile_server.url)
    grown = {stage: metric(after, "kvembed_timeouts_total", stage=stage) - metric(before, "kvembed_timeouts_total", stage=stage)
             for stage in ("body", "headers")}
    assert grown == {"body": 3, "headers": 3}, grown


def test_sigterm_with_a_trickling_client_exits_within_the_graceful_timeout(stories_artifact, tmp_path):
    process = ServerProcess([str(stories_artifact("kv-embedding")), "--graceful-timeout", "2", "--read-timeout", "60"],
                            tmp_path / "serve.log").wait_healthy()
    try:
        sock = _trickle(process.port)
        wait_for(lambda: metric(metrics(process.url), "kvembed_request_bodies_reading") == 1, what="the body arriving")
        started = time.monotonic()
        process.process.send_signal(signal.SIGTERM)
        code = process.process.wait(20)
        assert time.monotonic() - started < 10, process.output()
        assert code == 0, process.output()
        sock.close()
    finally:
        process.stop()


#: a request the demo model computes for many seconds here: 1,024 inputs cut at its 512-token cap
HEAVY = {"model": "kv", "input": [" ".join(f"word{i % 97}" for i in range(170))] * 1024, "truncate": True}


def _computing(url: str) -> bool:
    return metric(metrics(url), "kvembed_graph_calls_running", model="kv") >= 1


def test_sigterm_under_a_heavy_request_exits_within_the_graceful_timeout_and_answers_json(stories_artifact, tmp_path):
    """The request still running at the graceful timeout hears why (503, JSON); queued work is
    dropped and the graph call that cannot be interrupted is left behind, not waited for."""
    import threading

    process = ServerProcess([f"kv={stories_artifact('kv-embedding')}", "--graceful-timeout", "1"], tmp_path / "serve.log").wait_healthy()
    answer: list[httpx.Response] = []
    try:
        client = threading.Thread(target=lambda: answer.append(httpx.post(f"{process.url}/v1/embeddings", json=HEAVY, timeout=120)))
        client.start()
        wait_for(lambda: _computing(process.url), what="the heavy request computing")
        started = time.monotonic()
        process.process.send_signal(signal.SIGTERM)
        code = process.process.wait(30)
        took = time.monotonic() - started
        client.join(30)
    finally:
        process.stop()
    assert code == 0 and took < 5, (code, took, process.output()[-3000:])
    error = _json_error(answer[0], 503)
    assert error["code"] == "shutting_down" and "--graceful-timeout" in error["message"], error
    assert "Traceback" not in process.output() and "Exception in ASGI" not in process.output()


def test_a_client_that_goes_away_stops_its_queued_work(stories_artifact, tmp_path):
    process = ServerProcess([f"kv={stories_artifact('kv-embedding')}"], tmp_path / "serve.log").wait_healthy()
    try:
        body = json.dumps(HEAVY).encode()
        sock = socket.create_connection(("127.0.0.1", process.port), timeout=30)
        sock.sendall(f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_for(lambda: _computing(process.url), what="the heavy request computing")
        sock.close()
        wait_for(lambda: metric(metrics(process.url), "kvembed_requests_total", model="kv", status="499") == 1,
                 timeout=10, what="the request counted as gone (499)")
        samples = metrics(process.url)
        assert metric(samples, "kvembed_queue_depth", model="kv") == 0
        started = time.monotonic()  # what runs is at most the graph calls already started
        assert httpx.post(f"{process.url}/v1/embeddings", json={"model": "kv", "input": "quick"}, timeout=30).status_code == 200
        assert time.monotonic() - started < 5
    finally:
        process.stop()
    assert "Traceback" not in process.output()


def test_a_huge_input_does_not_stall_health(hostile_server):
    """Tokenising holds the GIL; the encoder tokenises only the head of an input that is surely over
    the cap, so 1.2 MB inputs (two at a time: the server's two slots) leave /health answering at once."""
    import threading

    big = ("The quick brown fox jumps over the lazy dog. " * 27000)[:1_200_000]
    answers: list[int] = []

    def send() -> None:
        for _ in range(2):
            answers.append(httpx.post(f"{hostile_server.url}/v1/embeddings", json={"model": "kv", "input": big, "truncate": True},
                                      timeout=120).status_code)

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    slowest = 0.0
    while any(thread.is_alive() for thread in threads):
        started = time.monotonic()
        assert httpx.get(f"{hostile_server.url}/health", timeout=30).status_code == 200
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    assert answers == [200] * 4
    assert slowest < 1.0, slowest


def test_kvembed_embed_names_the_line_that_is_not_text(stories_artifact, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "fine"}\n"abc\\ud800def"\n')
    line = _one_line(_cli("embed", str(stories_artifact("kv-embedding")), "-i", str(rows), "-o", str(tmp_path / "v.npy")))
    assert "rows.jsonl:2: the text holds a lone surrogate U+D800 at character 3" in line, line
    assert not (tmp_path / "v.npy").exists()


def test_embed_corpus_says_when_ids_repeat(stories_artifact, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": ident, "text": f"row {i}"}) + "\n" for i, ident in enumerate(["a", "b", "a", "c", "a"])))
    done = _cli("embed-corpus", str(stories_artifact("kv-embedding")), "-i", str(rows), "-o", str(tmp_path / "out"), "--id-column", "id")
    assert done.returncode == 0, done.stderr
    assert "warning: 1 ids are on more than one row (3 rows in all; e.g. 'a')" in done.stderr, done.stderr
    summary = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert summary["duplicate_ids"] == {"count": 1, "rows": 3, "examples": ["a"]} and summary["rows"] == 5
