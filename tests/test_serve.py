"""``kvembed serve``: a real server process on a free port, the official ``openai`` client and
httpx against it; every vector is checked against ``Embedder.encode`` of the same artifact
in this process (the independent oracle)."""

from __future__ import annotations

import asyncio
import base64
import random
import shutil
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from checks import run_without_torch
from kvembed.bench.served import ANNOUNCED, ServerProcess, kvembed_command, metric, metrics
from serve_util import SlowUpload, oracle_embedders, thread_nices, wait_for

from kvembed.runtime import Embedder
from kvembed.serve.config import DEFAULT_LONG_LANE_NICE

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the a cat dog sat ran on in park mat blue sky why is was happy über 東京 , . ?".split()
ERROR_KEYS = {"message", "type", "param", "code"}


def random_text(rng: random.Random, max_chars: int) -> str:
    """A text of 1..max_chars characters (stories260k's byte tokenizer: about one token per byte)."""
    target, words = rng.randint(1, max_chars), []
    while len(" ".join(words)) < target:
        words.append(rng.choice(WORDS))
    return " ".join(words)[:target]


def assert_rows_equal(got, expected: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float32).reshape(expected.shape)
    cosine = (got * expected).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(expected, axis=-1))
    assert cosine.min() >= 0.99999
    np.testing.assert_allclose(got, expected, atol=1e-5)


def assert_error(response: httpx.Response, status: int, param: str | None = "any") -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_KEYS, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert body["error"]["type"] in ("invalid_request_error", "rate_limit_error", "server_error")
    if param != "any":
        assert body["error"]["param"] == param, body
    return body["error"]


def decode(item: dict, encoding_format: str) -> np.ndarray:
    if encoding_format == "base64":
        return np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
    return np.asarray(item["embedding"], dtype=np.float32)


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def artifacts(stories_artifact, tmp_path_factory) -> dict[str, Path]:
    """kv-embedding (a prompt method) and va (a raw-text method) of the demo model: copies of the
    session's shared exports, in folders named as the server names them (kv, va)."""
    root = tmp_path_factory.mktemp("serve-artifacts")
    shared = {"kv": stories_artifact("kv-embedding"), "va": stories_artifact("va", layers="1-2")}
    return {name: Path(shutil.copytree(path, root / name)) for name, path in shared.items()}


@pytest.fixture(scope="module")
def oracles(artifacts) -> dict[str, Embedder]:
    return {name: Embedder.load(path, provider="cpu") for name, path in artifacts.items()}


@pytest.fixture(scope="module")
def server(artifacts, tmp_path_factory):
    """Both artifacts, served by name, no key."""
    process = ServerProcess([f"kv={artifacts['kv']}", f"va={artifacts['va']}"], tmp_path_factory.mktemp("serve") / "server.log")
    yield process.wait_healthy()
    process.stop()


@pytest.fixture(scope="module")
def strict(artifacts, tmp_path_factory):
    """The va artifact (served as its folder name) with a key from the environment and tight limits
    (a per-input cap above the artifact's max_length, which the artifact's own limit overrides)."""
    args = [str(artifacts["va"]), "--max-concurrent-requests", "1", "--max-client-batch-size", "8",
            "--payload-limit", "4KB", "--cors-origin", "http://example.com", "--max-input-tokens", "100000"]
    process = ServerProcess(args, tmp_path_factory.mktemp("serve") / "strict.log", env={"KVEMBED_API_KEY": "s3cret"})
    yield process.wait_healthy()
    process.stop()


#: the capped server's per-input cap and long-lane threshold, in tokens (the kv prompt alone is 46)
CAP, LONG = 64, 16


@pytest.fixture(scope="module")
def capped(artifacts, tmp_path_factory):
    """Both artifacts capped at CAP tokens per input, cut by default (--auto-truncate), inputs over
    LONG tokens in the long lane; one graph call may take every row of a request (so a long request
    is one long call); on a port the kernel picks, found from the server's announcement."""
    args = [f"va={artifacts['va']}", f"kv={artifacts['kv']}", "--max-input-tokens", str(CAP), "--auto-truncate",
            "--long-input-tokens", str(LONG), "--batch-size", "2048", "--max-batch-tokens", "1000000"]
    process = ServerProcess(args, tmp_path_factory.mktemp("serve") / "capped.log", port=0)
    yield process.wait_healthy()
    process.stop()


@pytest.fixture(scope="module")
def capped_oracles(artifacts) -> dict[str, Embedder]:
    """In-process embedders whose encoder cuts at CAP tokens, as the capped server's do."""
    return oracle_embedders(artifacts, CAP)


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


# -- the openai client -----------------------------------------------------------------------------


def test_openai_client_base64_and_float_equal_the_runtime(client, oracles):
    texts = ["A cat sat on the mat.", "", "Stock markets fell sharply today.", "über 東京 🎉"]
    single = client.embeddings.create(model="kv", input=texts[0])  # the client asks for base64
    assert single.model == "kv" and len(single.data) == 1 and single.data[0].index == 0
    assert_rows_equal(single.data[0].embedding, oracles["kv"].encode(texts[:1]))
    assert single.usage.prompt_tokens == single.usage.total_tokens == len(oracles["kv"].encoder.encode_one(texts[0]).ids)

    listed = client.embeddings.create(model="kv", input=texts, encoding_format="float")
    assert [item.index for item in listed.data] == [0, 1, 2, 3]
    assert_rows_equal([item.embedding for item in listed.data], oracles["kv"].encode(texts))
    assert listed.usage.prompt_tokens == sum(len(item.ids) for item in oracles["kv"].encoder.encode(texts))


def test_openai_client_query_prompt_and_dimensions(client, oracles):
    texts = ["what is a cat?", "where is the park"]
    queries = client.embeddings.create(model="kv", input=texts, extra_body={"input_type": "query"})
    assert_rows_equal([item.embedding for item in queries.data], oracles["kv"].encode_query(texts))
    assert queries.usage.prompt_tokens == sum(len(item.ids) for item in oracles["kv"].encoder.encode(texts, "query"))
    documents = client.embeddings.create(model="kv", input=texts)
    assert not np.allclose(queries.data[0].embedding, documents.data[0].embedding, atol=1e-3)

    cut = client.embeddings.create(model="kv", input=texts, dimensions=16)
    full = oracles["kv"].encode(texts)[:, :16]
    assert_rows_equal([item.embedding for item in cut.data], full / np.linalg.norm(full, axis=1, keepdims=True))


def test_token_ids_equal_text_for_a_raw_method_and_are_refused_for_a_prompt_method(client, oracles):
    texts = ["a cat sat", "the dog ran in the park"]
    ids = [oracles["va"].encoder.tokenizer.encode(text).ids for text in texts]
    many = client.embeddings.create(model="va", input=ids)
    assert_rows_equal([item.embedding for item in many.data], oracles["va"].encode(texts))
    assert_rows_equal(oracles["va"].encode_ids(ids), oracles["va"].encode(texts))  # the same in Python (README)
    assert many.usage.prompt_tokens == sum(map(len, ids))
    one = client.embeddings.create(model="va", input=ids[1], encoding_format="float")
    assert_rows_equal(one.data[0].embedding, oracles["va"].encode(texts[1:]))
    with pytest.raises(openai.BadRequestError, match="raw-text methods"):
        client.embeddings.create(model="kv", input=ids)


def test_two_artifacts_are_chosen_by_name(server, oracles):
    models = httpx.get(f"{server.url}/v1/models").json()
    cards = {card["id"]: card for card in models["data"]}
    assert models["object"] == "list" and set(cards) == {"kv", "va"}
    assert (cards["kv"]["dim"], cards["va"]["dim"], cards["kv"]["method"], cards["va"]["method"]) == (64, 32, "kv-embedding", "va")
    assert cards["kv"]["max_length"] == cards["kv"]["max_input_tokens"] == 512  # the default cap, 512, is stories260k's own
    assert cards["kv"]["target"] == cards["va"]["target"] == "onnxruntime-cpu"  # fp32 artifacts: auto is onnxruntime
    for name in ("kv", "va", "kv"):
        body = httpx.post(f"{server.url}/embeddings", json={"model": name, "input": ["a blue sky"]}).json()
        assert body["object"] == "list" and body["model"] == name and body["data"][0]["object"] == "embedding"
        assert_rows_equal(body["data"][0]["embedding"], oracles[name].encode(["a blue sky"]))


def test_over_long_text_gets_413_by_default_and_is_cut_with_truncate(server, oracles):
    """As TEI (and OpenAI, with a 400) do: an input over the limit is refused unless the request
    asks for truncation; the message names the limit and the option that sets it."""
    text = "the cat sat on the mat " * 40  # 920 bytes: over stories260k's 512 tokens
    for extra in ({}, {"truncate": False}):
        response = httpx.post(f"{server.url}/v1/embeddings", json={"model": "kv", "input": ["ok", text], **extra})
        error = assert_error(response, 413, "input")
        assert "input[1]" in error["message"] and "512 tokens" in error["message"] and "--max-input-tokens" in error["message"]
        assert error["code"] == "input_too_long"
    body = httpx.post(f"{server.url}/v1/embeddings", json={"model": "kv", "input": [text], "truncate": True}).json()
    with pytest.warns(UserWarning, match="max_length=512"):
        expected = oracles["kv"].encode([text])
    assert_rows_equal(body["data"][0]["embedding"], expected)
    assert body["usage"]["prompt_tokens"] == 512
    with pytest.raises(openai.APIStatusError, match="512 tokens") as refused:  # what the openai client sees
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0).embeddings.create(model="kv", input=text)
    assert refused.value.status_code == 413


def test_per_input_cap_is_listed_and_enforced(capped, capped_oracles):
    """--max-input-tokens 64 on artifacts of max_length 512: /v1/models names both; --auto-truncate
    cuts text and token ids at 64 tokens when the request does not say, truncate=false -> 413."""
    cards = {card["id"]: card for card in httpx.get(f"{capped.url}/v1/models").json()["data"]}
    assert {name: (card["max_length"], card["max_input_tokens"]) for name, card in cards.items()} == {"va": (512, CAP), "kv": (512, CAP)}
    text = "the cat sat on the mat " * 5  # 115 bytes: over 64 tokens, under 512
    for model in ("va", "kv"):
        body = httpx.post(f"{capped.url}/v1/embeddings", json={"model": model, "input": [text, "a cat"]}).json()
        with pytest.warns(UserWarning, match=f"max_length={CAP}"):
            expected = capped_oracles[model].encode([text, "a cat"])
        assert_rows_equal([item["embedding"] for item in body["data"]], expected)
        assert body["usage"]["prompt_tokens"] == CAP + len(capped_oracles[model].encoder.encode_one("a cat").ids)
        error = assert_error(httpx.post(f"{capped.url}/v1/embeddings", json={"model": model, "input": text, "truncate": False}), 413, "input")
        assert f"limit of {CAP} tokens" in error["message"] and "--max-input-tokens" in error["message"] and "512" in error["message"]
    ids = capped_oracles["va"].encoder.tokenizer.encode(text).ids
    assert len(ids) > CAP
    body = httpx.post(f"{capped.url}/v1/embeddings", json={"model": "va", "input": [ids]}).json()
    assert body["usage"]["prompt_tokens"] == CAP
    assert_rows_equal(body["data"][0]["embedding"], capped_oracles["va"].encode_ids([ids[:CAP]]))
    assert_error(httpx.post(f"{capped.url}/v1/embeddings", json={"model": "va", "input": [ids], "truncate": False}), 413, "input")


def test_the_cap_never_exceeds_the_artifact_max_length(strict):
    """--max-input-tokens 100000 on an artifact of max_length 512 serves 512 tokens per input."""
    card = httpx.get(f"{strict.url}/v1/models", headers={"Authorization": "Bearer s3cret"}).json()["data"][0]
    assert (card["max_length"], card["max_input_tokens"]) == (512, 512)


def test_a_long_input_does_not_hold_a_short_one_hostage(capped, capped_oracles):
    """A request of 2,048 long inputs is one graph call of 2,048 x 64 tokens in the long lane
    (seconds of work). A short request sent while that call runs is answered while it still runs:
    with one queue it would wait for the whole call. Requests mixing short and long inputs get
    their rows back in order."""
    rng = random.Random(5)
    long_texts = [random_text(rng, 400) + " " + "x" * 100 for _ in range(2048)]  # all over 64 tokens: cut to 64
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{capped.url}/v1/embeddings", json={"model": "va", "input": long_texts}, timeout=600)
        wait_for(lambda: metric(metrics(capped.url), "kvembed_graph_calls_running", model="va") >= 1, timeout=120, what="the long call")
        short = ["a cat", "the park"]
        body = httpx.post(f"{capped.url}/v1/embeddings", json={"model": "va", "input": short}, timeout=600).json()
        running = metric(metrics(capped.url), "kvembed_graph_calls_running", model="va")
        assert_rows_equal([item["embedding"] for item in body["data"]], capped_oracles["va"].encode(short))
        assert running >= 1 and not pending.done(), "the short request waited for the long input's graph call"
        long_body = pending.result().json()
    nices = thread_nices(capped.process.pid)
    assert DEFAULT_LONG_LANE_NICE in nices and 0 in nices, nices  # the long lane's worker yields the cores; the rest does not
    with pytest.warns(UserWarning, match=f"max_length={CAP}"):
        expected = capped_oracles["va"].encode(long_texts)
    assert_rows_equal([item["embedding"] for item in long_body["data"]], expected)
    mixed = ["a cat", long_texts[0], "sky", long_texts[1], "the dog ran"]
    body = httpx.post(f"{capped.url}/v1/embeddings", json={"model": "va", "input": mixed}).json()
    assert [item["index"] for item in body["data"]] == list(range(5))
    with pytest.warns(UserWarning):
        assert_rows_equal([item["embedding"] for item in body["data"]], capped_oracles["va"].encode(mixed))


def test_the_server_says_where_it_listens_once_ready(capped):
    """Started with --port 0: one line names the port the kernel gave, and it answers there."""
    lines = [line for line in capped.output().splitlines() if ANNOUNCED.search(line)]
    assert len(lines) == 1, capped.output()
    count, names, url = ANNOUNCED.search(lines[0]).groups()
    assert (count, names, url) == ("2", "va on onnxruntime-cpu, kv on onnxruntime-cpu", f"http://127.0.0.1:{capped.port}")
    assert capped.port != 0
    assert httpx.get(f"{url}/health").status_code == 200


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "status", "param", "phrase"),
    [
        ({"model": "kv", "input": []}, 400, "input", "empty list"),
        ({"model": "kv", "input": ["a", 3]}, 400, "input", "input[1]"),
        ({"model": "kv", "input": ["a", None]}, 400, "input", "input[1]"),
        ({"model": "kv", "input": [1.5]}, 400, "input", "input[0]"),
        ({"model": "kv", "input": {"text": "a"}}, 400, "input", "dict"),
        ({"model": "va", "input": [[1, 2], []]}, 400, "input", "input[1]"),
        ({"model": "va", "input": [[1, 99999]]}, 400, "input", "input[0]"),
        ({"model": "kv", "input": "a", "colour": "red"}, 400, "colour", "unrecognized"),
        ({"model": "kv", "input": "a", "dimensions": 65}, 400, "dimensions", "at most 64"),
        ({"model": "kv", "input": "a", "output": "nope"}, 400, "output", "nope"),
        ({"model": "gpt-4", "input": "a"}, 404, "model", "kv, va"),
        ({"input": "a"}, 422, "model", "model"),
        ({"model": "kv", "input": "a", "encoding_format": "hex"}, 422, "encoding_format", "base64"),
        ({"model": "kv", "input": "a", "dimensions": "8"}, 422, "dimensions", "integer"),
        ({"model": "kv", "input": "a", "input_type": "passage"}, 400, "input_type", "one of query, document"),
    ],
)
def test_bad_requests_get_openai_errors(server, payload, status, param, phrase):
    error = assert_error(httpx.post(f"{server.url}/v1/embeddings", json=payload), status, param)
    assert phrase in error["message"]


def test_unparseable_bodies_and_unknown_routes(server):
    assert "JSON" in assert_error(httpx.post(f"{server.url}/v1/embeddings", content=b"{not json"), 400)["message"]
    assert_error(httpx.post(f"{server.url}/v1/embeddings", content=b"[1, 2]"), 400)
    assert_error(httpx.get(f"{server.url}/v1/nothing"), 404)
    assert_error(httpx.get(f"{server.url}/v1/embeddings"), 405)


def test_api_key_from_the_environment(strict, oracles):
    url = f"{strict.url}/v1/embeddings"
    payload = {"model": "va", "input": ["a cat"]}
    assert "missing" in assert_error(httpx.post(url, json=payload), 401)["message"]
    wrong = httpx.post(url, json=payload, headers={"Authorization": "Bearer s3cre"})
    assert_error(wrong, 401)
    assert wrong.headers["www-authenticate"] == "Bearer"
    assert_error(httpx.get(f"{strict.url}/v1/models"), 401)
    assert httpx.get(f"{strict.url}/health").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{strict.url}/v1", api_key="wrong", max_retries=0).embeddings.create(model="va", input="a")
    good = openai.OpenAI(base_url=f"{strict.url}/v1", api_key="s3cret", max_retries=0)
    assert_rows_equal(good.embeddings.create(model="va", input="a cat").data[0].embedding, oracles["va"].encode(["a cat"]))


def test_size_limits_give_413_and_too_many_inputs_400(strict):
    """More inputs than --max-client-batch-size break the document's maxItems: 400, as OpenAI answers
    more than its 2048; a body over --payload-limit is 413."""
    auth = {"Authorization": "Bearer s3cret"}
    url = f"{strict.url}/v1/embeddings"
    error = assert_error(httpx.post(url, json={"model": "va", "input": ["a"] * 9}, headers=auth), 400, "input")
    assert "limit of 8" in error["message"] and error["code"] == "too_many_inputs"
    assert "payload limit" in assert_error(httpx.post(url, json={"model": "va", "input": ["x" * 5000]}, headers=auth), 413)["message"]

    def chunked():  # no Content-Length: the limit holds on the streamed body too
        yield b'{"model": "va", "input": ["'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"]}'

    assert_error(httpx.post(url, content=chunked(), headers=auth), 413)


def test_429_when_the_concurrent_request_limit_is_reached(strict, oracles):
    """The limit counts admitted requests (body read): a burst at --max-concurrent-requests 1 gets
    429s beside 200s, every 200 with the right vectors; a request whose body is still arriving holds
    no slot (tests/test_hostile.py sends such bodies for seconds)."""
    auth = {"Authorization": "Bearer s3cret"}
    texts = [f"burst text {i} " * 4 for i in range(8)]
    expected = oracles["va"].encode(texts)
    held = SlowUpload(strict.port, "/v1/embeddings", {"model": "va", "input": ["held back"]}, auth)
    wait_for(lambda: metric(metrics(strict.url), "kvembed_request_bodies_reading") == 1, what="the slow body being read")
    assert httpx.post(f"{strict.url}/v1/embeddings", json={"model": "va", "input": ["a"]}, headers=auth).status_code == 200

    def burst(size: int = 12) -> list[httpx.Response]:
        start = threading.Barrier(size)

        def one() -> httpx.Response:
            start.wait()
            return httpx.post(f"{strict.url}/v1/embeddings", json={"model": "va", "input": texts}, headers=auth, timeout=60)

        with ThreadPoolExecutor(size) as pool:
            return list(pool.map(lambda _: one(), range(size)))

    statuses: list[int] = []
    for _ in range(5):  # until the burst overlaps (the first round does, on any machine seen)
        for response in burst():
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert assert_error(response, 429)["type"] == "rate_limit_error"
            else:
                assert response.status_code == 200, response.text
                assert_rows_equal([item["embedding"] for item in response.json()["data"]], expected)
        if 429 in statuses:
            break
    assert 429 in statuses and 200 in statuses, statuses
    status, body = held.finish()
    assert status == 200
    assert_rows_equal(body["data"][0]["embedding"], oracles["va"].encode(["held back"]))


def test_cors_only_when_asked(strict, server):
    preflight = {"Origin": "http://example.com", "Access-Control-Request-Method": "POST"}
    allowed = httpx.options(f"{strict.url}/v1/embeddings", headers=preflight)
    assert allowed.headers.get("access-control-allow-origin") == "http://example.com"
    plain = httpx.post(f"{server.url}/v1/embeddings", json={"model": "va", "input": "a"}, headers={"Origin": "http://example.com"})
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


def test_the_loader_takes_what_the_preflight_read_and_built(artifacts, oracles):
    """The manifest and the encoder the preflight checked before the bind are the ones the server
    embeds with: nothing is read or built twice, and the vectors are the runtime's."""
    from kvembed.serve import ServeConfig
    from kvembed.serve.app import load_embedders
    from kvembed.serve.preflight import check_artifacts

    config = ServeConfig(artifacts=(("kv", artifacts["kv"]),), provider="cpu")
    checked = check_artifacts(config)
    loaded = load_embedders(config, verify=False, checked=checked)["kv"]
    assert loaded.artifact is checked["kv"].manifest and loaded.encoder is checked["kv"].encoder
    texts = ["a short text", "the cat sat on the mat"]
    np.testing.assert_allclose(loaded.encode(texts), oracles["kv"].encode(texts), atol=1e-6)


def test_503_while_loading_then_200(artifacts):
    import uvicorn
    from kvembed.bench.served import free_port

    from kvembed.serve import ServeConfig, create_app
    from kvembed.serve.app import load_embedders

    gate = threading.Event()

    def slow_loader(config):
        gate.wait(60)
        return load_embedders(config)

    app = create_app(ServeConfig(artifacts=(("va", artifacts["va"]),), provider="cpu"), loader=slow_loader)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, what="uvicorn started")
        url = f"http://127.0.0.1:{port}"
        assert assert_error(httpx.get(f"{url}/health"), 503)["code"] == "loading"
        assert_error(httpx.post(f"{url}/v1/embeddings", json={"model": "va", "input": "a"}), 503)
        gate.set()
        wait_for(lambda: httpx.get(f"{url}/health").status_code == 200, what="loaded")
        assert httpx.post(f"{url}/v1/embeddings", json={"model": "va", "input": "a"}).status_code == 200
    finally:
        gate.set()
        server.should_exit = True
        thread.join(30)


def test_command_line_failures_are_one_line_and_exit_2(artifacts, tmp_path, server):
    """Bad options and broken artifacts (a byte flipped in model.onnx, tokenizer.json gone) are one
    error line and exit 2, found before the port is bound: no server starts, so none of uvicorn's
    startup lines are printed."""
    flipped, untokenized = tmp_path / "flipped", tmp_path / "untokenized"
    for damaged in (flipped, untokenized):
        shutil.copytree(artifacts["va"], damaged)
    graph = bytearray((flipped / "model.onnx").read_bytes())
    graph[len(graph) // 2] ^= 0x01
    (flipped / "model.onnx").write_bytes(graph)
    (untokenized / "tokenizer.json").unlink()
    cases = [
        ([str(tmp_path / "missing")], "not a kvembed artifact"),
        ([str(artifacts["va"]), f"va={artifacts['kv']}"], "unique"),
        ([str(artifacts["va"]), "--payload-limit", "lots"], "cannot read size"),
        ([str(artifacts["va"]), "--port", "70000"], "--port must be in 0-65535"),
        ([str(artifacts["va"]), "--log-level", "loud"], "--log-level must be one of"),
        ([str(artifacts["va"]), "--workers", "0"], "workers must be >= 1"),
        ([str(artifacts["va"]), "--call-cost", "-5"], "call-cost must be auto, none or an integer >= 0"),
        ([str(artifacts["va"]), "--call-cost", "cheap"], "call-cost must be auto, none or an integer >= 0"),
        ([str(artifacts["va"]), "--port", str(server.port)], f"cannot serve on 127.0.0.1:{server.port}"),
        ([str(flipped), "--port", "0"], "model.onnx does not match its sha256"),
        ([str(artifacts["va"]), str(untokenized), "--port", "0"], "tokenizer.json is missing"),
        ([str(artifacts["kv"]), "--max-input-tokens", "8", "--port", "0"], "prompt alone takes 46 tokens"),
        ([str(artifacts["va"]), "--long-input-tokens", "0"], "long-input-tokens must be >= 1"),
    ]
    for args, phrase in cases:
        result = subprocess.run([*kvembed_command(), "serve", *args], capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, (args, result.stderr)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and phrase in errors[0], (args, result.stderr)
        assert "Traceback" not in result.stderr
        assert "Started server process" not in result.stderr + result.stdout, (args, result.stderr)


def test_serve_imports_without_torch(artifacts):
    result = run_without_torch(
        f"""
        from fastapi.testclient import TestClient
        from kvembed.serve import ServeConfig, create_app
        import kvembed.cli.serve, kvembed.serve.server

        app = create_app(ServeConfig(artifacts=(("va", {str(artifacts["va"])!r}),), provider="cpu"))
        with TestClient(app) as client:
            import time
            while client.get("/health").status_code != 200:
                time.sleep(0.05)
            print(len(client.post("/v1/embeddings", json={{"model": "va", "input": "a cat"}}).json()["data"][0]["embedding"]))
        """,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["32"]


# -- batching under load ---------------------------------------------------------------------------


def test_a_huge_request_does_not_starve_small_ones(server, oracles):
    rng = random.Random(7)
    # 8 windows of 256 inputs, ~400k tokens: seconds of work even on a quiet machine, while a small
    # request needs one window's turn (texts of <= 30 characters finished before the second small
    # request on a quiet machine)
    huge = [random_text(rng, 400) for _ in range(2000)]
    small = ["a cat", "the park"]
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{server.url}/v1/embeddings", json={"model": "va", "input": huge}, timeout=300)
        wait_for(lambda: metric(metrics(server.url), "kvembed_queue_depth", model="va") > 0, what="the huge request queued")
        for _ in range(2):
            body = httpx.post(f"{server.url}/v1/embeddings", json={"model": "va", "input": small}, timeout=300).json()
            assert_rows_equal([item["embedding"] for item in body["data"]], oracles["va"].encode(small))
            assert not pending.done(), "a small request waited for the whole huge one"
        body = pending.result().json()
    assert [item["index"] for item in body["data"]] == list(range(2000))
    # every 8th row against the oracle: rows are independent, and each of the 8 windows has some
    assert_rows_equal([item["embedding"] for item in body["data"][::8]], oracles["va"].encode(huge[::8]))


CLIENTS, REQUESTS, MAX_TEXTS, MAX_CHARS = 64, 10, 8, 60


def test_64_concurrent_clients_get_their_own_rows_in_order(server, oracles):
    """Scaled from the issue's 64 x 500 (1-64 texts of 1-400 tokens), which needs hours of this
    shared 2-core VM; benchmarks/serve_bench.py --load runs the 64 x 500 request count."""
    rng = random.Random(11)
    pools = [[random_text(rng, MAX_CHARS) for _ in range(24)] for _ in range(CLIENTS)]  # disjoint per client
    models = ["kv" if client % 4 == 3 else "va" for client in range(CLIENTS)]  # kv's prompt adds ~50 tokens a text
    expected = [dict(zip(pool, oracles[model].encode(pool))) for pool, model in zip(pools, models)]
    plans = [
        [[rng.choice(pool) for _ in range(rng.randint(1, MAX_TEXTS))] for _ in range(REQUESTS)] for pool in pools
    ]
    # warm-up, then memory and counters before the load
    for model in ("va", "kv"):
        httpx.post(f"{server.url}/v1/embeddings", json={"model": model, "input": pools[0] * 2}, timeout=120)
    rss_warm = server.rss_kib()
    before = metrics(server.url)

    async def one_client(index: int, http: httpx.AsyncClient) -> int:
        checked = 0
        for number, texts in enumerate(plans[index]):
            fmt = "base64" if (index + number) % 2 else "float"
            response = await http.post("/v1/embeddings", json={"model": models[index], "input": texts, "encoding_format": fmt})
            assert response.status_code == 200, response.text
            body = response.json()
            assert [item["index"] for item in body["data"]] == list(range(len(texts)))
            got = np.stack([decode(item, fmt) for item in body["data"]])
            assert_rows_equal(got, np.stack([expected[index][text] for text in texts]))
            assert body["usage"]["prompt_tokens"] == sum(len(oracles[models[index]].encoder.encode_one(t).ids) for t in texts)
            checked += 1
        return checked

    async def run_all() -> list[int]:
        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as http:
            return await asyncio.gather(*(one_client(i, http) for i in range(CLIENTS)))

    assert asyncio.run(run_all()) == [REQUESTS] * CLIENTS
    after = metrics(server.url)
    for model in ("va", "kv"):
        sent = [texts for index, plan in enumerate(plans) if models[index] == model for texts in plan]
        texts_sent = sum(map(len, sent))
        tokens_sent = sum(len(oracles[model].encoder.encode_one(t).ids) for texts in sent for t in texts)
        delta = {name: metric(after, name, model=model) - metric(before, name, model=model) for name in (
            "kvembed_requests_total", "kvembed_texts_total", "kvembed_tokens_total", "kvembed_batch_size_sum", "kvembed_batch_size_count")}
        assert delta["kvembed_requests_total"] == len(sent)
        assert metric(after, "kvembed_requests_total", model=model, status="200") - metric(before, "kvembed_requests_total", model=model, status="200") == len(sent)
        assert delta["kvembed_texts_total"] == delta["kvembed_batch_size_sum"] == texts_sent
        assert delta["kvembed_tokens_total"] == tokens_sent
        # texts of several requests shared graph calls: calls of more rows than any request has
        merged = delta["kvembed_batch_size_count"] - (
            metric(after, "kvembed_batch_size_bucket", model=model, le="8.0") - metric(before, "kvembed_batch_size_bucket", model=model, le="8.0"))
        assert merged > 0
        assert metric(after, "kvembed_queue_depth", model=model) == 0
    assert server.rss_kib() <= 1.5 * rss_warm


# -- graceful shutdown -----------------------------------------------------------------------------


def test_sigterm_drains_in_flight_requests_refuses_new_ones_and_exits_0(artifacts, oracles, tmp_path):
    process = ServerProcess([f"va={artifacts['va']}"], tmp_path / "sigterm.log").wait_healthy()
    rng = random.Random(3)
    texts = [random_text(rng, 80) for _ in range(40)]
    expected = dict(zip(texts, oracles["va"].encode(texts)))
    outcomes: list[str] = []
    stop = threading.Event()

    def load_client(seed: int) -> None:
        local = random.Random(seed)
        with httpx.Client(base_url=process.url, timeout=120) as http:
            while not stop.is_set():
                batch = [local.choice(texts) for _ in range(local.randint(1, 8))]
                try:
                    response = http.post("/v1/embeddings", json={"model": "va", "input": batch})
                except httpx.TransportError:
                    outcomes.append("refused")
                    return
                try:
                    if response.status_code == 503:  # reached the app after SIGTERM on a kept-alive connection
                        assert response.json()["error"]["code"] == "shutting_down"
                        outcomes.append("503")
                        continue
                    assert response.status_code == 200, response.text
                    assert_rows_equal([item["embedding"] for item in response.json()["data"]], np.stack([expected[t] for t in batch]))
                    outcomes.append("ok")
                except AssertionError as err:
                    outcomes.append(f"bad: {err}")
                    return

    threads = [threading.Thread(target=load_client, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: outcomes.count("ok") >= 16, timeout=120, what="load running")
        held = SlowUpload(process.port, "/v1/embeddings", {"model": "va", "input": ["in flight at SIGTERM"]})
        wait_for(lambda: metric(metrics(process.url), "kvembed_request_bodies_reading") >= 1, what="the held body being read")
        process.process.send_signal(signal.SIGTERM)
        wait_for(lambda: _refuses_connections(process.url), timeout=30, what="the listening socket closed")
        status, body = held.finish()
        assert status == 200
        assert_rows_equal(body["data"][0]["embedding"], oracles["va"].encode(["in flight at SIGTERM"]))
        assert process.process.wait(60) == 0, process.output()
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        process.stop()
    assert not [outcome for outcome in outcomes if outcome.startswith("bad")]
    assert outcomes.count("refused") == len(threads)  # every client ended on a closed socket, none hung
    assert "Traceback" not in process.output()


def _refuses_connections(url: str) -> bool:
    """True once connecting fails; a connection the kernel queued just before the listening socket
    closed is dropped without a response (RemoteProtocolError) or reset (ReadError: "connection
    reset by peer", seen once in CI): not proof yet, so poll again."""
    try:
        httpx.get(f"{url}/health", timeout=2)
    except httpx.ConnectError:
        return True
    except (httpx.RemoteProtocolError, httpx.ReadError):
        return False
    return False


def _accepted_nodelay(sock) -> int:
    """TCP_NODELAY of a connection accepted by an asyncio server (as uvicorn runs) on ``sock``."""
    import asyncio
    import socket

    async def main() -> int:
        seen: list[int] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        await reader.read()  # until the server closes it
        writer.close()
        server.close()
        await server.wait_closed()
        return seen[0]

    return asyncio.run(main())


def test_kept_alive_connections_have_nagle_off():
    """Accepted connections inherit the listener's proto, and asyncio sets TCP_NODELAY only when it
    is IPPROTO_TCP: a listener made the default way leaves Nagle on, and each kept-alive response
    waits ~40 ms for the client's delayed ACK (uvicorn#3149). ``kvembed serve`` binds its own."""
    import socket

    from kvembed.cli.serve import listening_socket

    assert _accepted_nodelay(listening_socket("127.0.0.1", 0)) == 1
    plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    plain.bind(("127.0.0.1", 0))
    assert _accepted_nodelay(plain) == 0  # what the server had before, and uvicorn's own bind_socket has


# -- the batcher's workers -------------------------------------------------------------------------


def test_two_workers_run_graph_calls_at_once_and_every_row_goes_home(artifacts, oracles):
    """Batcher(workers=2) on the real va artifact: 40 requests of 1-8 texts submitted together
    all get their own rows in order (equal to Embedder.encode), and at least two graph calls were
    running at the same moment (their spans, timed around the real session, overlap)."""
    import time

    from kvembed.runtime.batching import BatchPolicy
    from kvembed.serve.batcher import Batcher
    from kvembed.serve.metrics import Metrics

    embedder = Embedder.load(artifacts["va"], provider="cpu", threads=1)
    spans: list[tuple[float, float]] = []
    run = embedder.run_outputs

    def timed_run(feeds, names, policy=None):
        start = time.perf_counter()
        result = run(feeds, names, policy)
        spans.append((start, time.perf_counter()))
        return result

    embedder.run_outputs = timed_run
    rng = random.Random(21)
    requests = [[random_text(rng, 200) for _ in range(rng.randint(1, 8))] for _ in range(40)]

    async def serve_all() -> list[np.ndarray]:
        policy = BatchPolicy.from_options(embedder.policy, max_batch_tokens=2048, batch_size=16)
        batcher = Batcher(embedder, "va", Metrics(), policy, workers=2)
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.embed(embedder.encoder.encode(texts), None) for texts in requests))
        finally:
            await batcher.stop()

    results = asyncio.run(serve_all())
    for texts, got in zip(requests, results):
        assert_rows_equal(got, oracles["va"].encode(texts))
    spans.sort()
    assert len(spans) >= 4
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), "no two graph calls overlapped"
    with pytest.raises(ValueError, match="workers must be >= 1"):
        Batcher(embedder, "va", Metrics(), workers=0)
