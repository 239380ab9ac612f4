"""``kvembed serve`` in TEI's and Cohere's dialects, driven by their own clients over a socket:
``huggingface_hub.InferenceClient``, ``langchain_huggingface.HuggingFaceEndpointEmbeddings`` and
``cohere.ClientV2``. Every vector is checked against ``Embedder.encode`` of the same artifact in
this process (the independent oracle); the same input gives the same vector on every route."""

from __future__ import annotations

import base64

import cohere
import httpx
import numpy as np
import pytest
from huggingface_hub import InferenceClient
from langchain_huggingface import HuggingFaceEndpointEmbeddings
from kvembed.bench.served import ServerProcess
from serve_util import oracle_embedders
from tokenizers import Tokenizer

from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KEY = "dialect-key"
#: the server's per-input cap (the kv prompt alone is 46 tokens of the demo model's byte tokenizer)
CAP = 96
TEXTS = ["a cat sat on the mat", "the dog ran in the park", "why is the sky blue?"]
LONG = "the cat sat on the mat and the dog ran in the park. " * 12


@pytest.fixture(scope="module")
def artifacts(stories_artifact) -> dict[str, object]:
    return {"kv": stories_artifact("kv-embedding"), "va": stories_artifact("va", layers="1-2")}


@pytest.fixture(scope="module")
def server(artifacts, tmp_path_factory):
    """kv first (the TEI routes' default model), va second; a key; a cap of CAP tokens per input."""
    args = [f"kv={artifacts['kv']}", f"va={artifacts['va']}", "--max-input-tokens", str(CAP)]
    process = ServerProcess(args, tmp_path_factory.mktemp("dialects") / "server.log", env={"KVEMBED_API_KEY": KEY})
    yield process.wait_healthy()
    process.stop()


@pytest.fixture(scope="module")
def oracle(artifacts) -> dict[str, Embedder]:
    return oracle_embedders(artifacts, CAP)


def headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def assert_rows(got, expected: np.ndarray, atol: float = 1e-5) -> None:
    got = np.asarray(got, dtype=np.float32).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, atol=atol)


# -- TEI ------------------------------------------------------------------------------------------


def test_huggingface_hub_feature_extraction(server, oracle):
    client = InferenceClient(model=server.url, token=KEY)
    assert_rows(client.feature_extraction(TEXTS), oracle["kv"].encode(TEXTS))
    assert_rows(client.feature_extraction(TEXTS[0], prompt_name="query"), oracle["kv"].encode(TEXTS[:1], kind="query"))
    raw = client.feature_extraction(TEXTS, normalize=False)
    assert_rows(raw, oracle["kv"].encode(TEXTS, normalize=False), atol=1e-4)
    assert not np.allclose(np.linalg.norm(raw, axis=-1), 1.0)
    cut = client.feature_extraction(LONG, truncate=True)
    assert_rows(cut, oracle["kv"].encode([LONG]))


def test_langchain_huggingface_endpoint_embeddings(server, oracle):
    embeddings = HuggingFaceEndpointEmbeddings(model=f"{server.url}/embed", huggingfacehub_api_token=KEY)
    assert_rows(embeddings.embed_documents(TEXTS), oracle["kv"].encode(TEXTS))
    assert_rows(embeddings.embed_query(TEXTS[1]), oracle["kv"].encode(TEXTS[1:2]))


def test_tei_errors_keep_tei_shape(server):
    url = f"{server.url}/embed"
    too_long = httpx.post(url, json={"inputs": LONG}, headers=headers(), timeout=30)
    assert too_long.status_code == 413 and set(too_long.json()) == {"error", "error_type"}
    assert too_long.json()["error_type"] == "Validation" and "windows=true" in too_long.json()["error"]
    sideways = httpx.post(url, json={"inputs": "a", "truncation_direction": "up"}, headers=headers(), timeout=30)
    assert sideways.status_code == 422 and "truncation_direction" in sideways.json()["error"]
    keyless = httpx.post(url, json={"inputs": "a"}, timeout=30)
    assert keyless.status_code == 401 and keyless.json()["error_type"] == "Unauthorized"
    with pytest.raises(Exception, match="413"):
        InferenceClient(model=server.url, token=KEY).feature_extraction(LONG)


def test_tokenize_decode_and_info(server, artifacts):
    tokenizer = Tokenizer.from_file(str(artifacts["kv"] / "tokenizer.json"))
    got = httpx.post(f"{server.url}/tokenize", json={"inputs": TEXTS[:2]}, headers=headers(), timeout=30).json()
    for text, tokens in zip(TEXTS, got):
        encoding = tokenizer.encode(text)
        assert [t["id"] for t in tokens] == encoding.ids
        assert [t["text"] for t in tokens if not t["special"]] == [text[a:b] for (a, b), s in
                                                                    zip(encoding.offsets, encoding.special_tokens_mask) if not s]
    ids = tokenizer.encode(TEXTS[0]).ids
    decoded = httpx.post(f"{server.url}/decode", json={"ids": [ids, ids[:3]]}, headers=headers(), timeout=30).json()
    assert decoded == [tokenizer.decode(ids), tokenizer.decode(ids[:3])]
    bad = httpx.post(f"{server.url}/decode", json={"ids": [10**9]}, headers=headers(), timeout=30)
    assert bad.status_code == 400 and "ids[0]" in bad.json()["error"]
    info = httpx.get(f"{server.url}/info", headers=headers(), timeout=30).json()
    assert info["model_id"] == "kv" and info["max_input_length"] == CAP and info["models"] == ["kv", "va"]


def test_left_truncation_keeps_the_end(server, oracle):
    """TEI's ``truncation_direction: left`` and Cohere's ``truncate: START`` keep the longest end of
    the text that fits: found here by trying every start in turn."""
    start = next(i for i in range(len(LONG)) if not oracle["kv"].encoder.encode_one(LONG[i:]).truncated)
    expected = oracle["kv"].encode([LONG[start:]])
    tei = httpx.post(f"{server.url}/embed", json={"inputs": LONG, "truncate": True, "truncation_direction": "Left"},
                     headers=headers(), timeout=30)
    assert_rows(tei.json(), expected)
    answer = cohere_client(server).embed(texts=[LONG], model="kv", input_type="search_document", truncate="START")
    assert_rows(answer.embeddings.float_, expected)
    ids = [[5, 7, 9, 11] * 40]
    cut = httpx.post(f"{server.url}/embed", json={"model": "va", "inputs": ids, "truncate": True, "truncation_direction": "left"},
                     headers=headers(), timeout=30)
    assert_rows(cut.json(), oracle["va"].encode_ids([ids[0][-CAP:]]))


# -- Cohere ---------------------------------------------------------------------------------------


def cohere_client(server) -> cohere.ClientV2:
    return cohere.ClientV2(api_key=KEY, base_url=server.url)


def test_cohere_embed_every_type(server, oracle):
    answer = cohere_client(server).embed(texts=TEXTS, model="kv", input_type="search_query",
                                         embedding_types=["float", "int8", "ubinary", "binary", "base64"])
    floats = oracle["kv"].encode(TEXTS, kind="query")
    assert_rows(answer.embeddings.float_, floats)
    bits = np.packbits(floats > 0, axis=-1)  # sign bits, packed: computed here, not by kvembed
    np.testing.assert_array_equal(np.asarray(answer.embeddings.ubinary), bits)
    np.testing.assert_array_equal(np.asarray(answer.embeddings.binary), bits.astype(np.int16) - 128)
    b64 = np.stack([np.frombuffer(base64.b64decode(row), dtype="<f4") for row in answer.embeddings.base64])
    assert_rows(b64, floats)
    np.testing.assert_array_equal(np.asarray(answer.embeddings.int8), oracle["kv"].encode(TEXTS, kind="query", precision="int8"))
    assert answer.meta.billed_units.input_tokens > 0 and answer.texts == TEXTS


def test_cohere_rerank_orders_by_cosine(server, oracle):
    documents = ["stock markets fell sharply", "a kitten sat on the rug", "the dog ran in the park"]
    query = "a cat sat on the mat"
    answer = cohere_client(server).rerank(model="kv", query=query, documents=documents, top_n=2)
    scores = oracle["kv"].encode(documents) @ oracle["kv"].encode([query], kind="query")[0]
    assert [r.index for r in answer.results] == list(np.argsort(-scores)[:2])
    np.testing.assert_allclose([r.relevance_score for r in answer.results], np.sort(scores)[::-1][:2], atol=1e-5)


def test_cohere_errors_keep_cohere_shape(server):
    client = cohere_client(server)
    with pytest.raises(cohere.errors.NotFoundError):
        client.embed(texts=["a"], model="nope", input_type="search_document")
    with pytest.raises(cohere.errors.UnauthorizedError):
        cohere.ClientV2(api_key="wrong", base_url=server.url).embed(texts=["a"], model="kv", input_type="search_document")
    refused = httpx.post(f"{server.url}/v2/embed", json={"model": "kv", "texts": [LONG], "truncate": "NONE"},
                         headers=headers(), timeout=30)
    assert refused.status_code == 413 and set(refused.json()) == {"message"}


# -- one vector, whatever the route ----------------------------------------------------------------


def test_the_same_input_gives_the_same_vector_on_every_route(server, oracle):
    text = TEXTS[2]
    openai_ = httpx.post(f"{server.url}/v1/embeddings", json={"model": "kv", "input": text}, headers=headers(), timeout=30)
    tei = httpx.post(f"{server.url}/embed", json={"inputs": text}, headers=headers(), timeout=30)
    cohere_ = httpx.post(f"{server.url}/v2/embed", json={"model": "kv", "texts": [text]}, headers=headers(), timeout=30)
    vectors = [np.asarray(openai_.json()["data"][0]["embedding"]), np.asarray(tei.json()[0]),
               np.asarray(cohere_.json()["embeddings"]["float"][0])]
    for vector in vectors[1:]:
        assert float(vector @ vectors[0] / np.linalg.norm(vector) / np.linalg.norm(vectors[0])) == pytest.approx(1.0, abs=1e-6)
    assert_rows(vectors[0], oracle["kv"].encode([text]))


def test_windows_embed_a_long_input_whole_on_every_route(server, oracle):
    expected = oracle["kv"].encode([LONG], windows=True)
    assert not np.allclose(expected, oracle["kv"].encode([LONG]), atol=1e-3)  # not the cut vector
    openai_ = httpx.post(f"{server.url}/v1/embeddings", json={"model": "kv", "input": LONG, "windows": True},
                         headers=headers(), timeout=60)
    tei = httpx.post(f"{server.url}/embed", json={"inputs": LONG, "windows": True}, headers=headers(), timeout=60)
    cohere_ = httpx.post(f"{server.url}/v2/embed", json={"model": "kv", "texts": [LONG], "windows": True},
                         headers=headers(), timeout=60)
    assert_rows(openai_.json()["data"][0]["embedding"], expected)
    assert_rows(tei.json()[0], expected)
    assert_rows(cohere_.json()["embeddings"]["float"][0], expected)
    ids = [[5, 7, 9] * 40]  # a raw-text method's token ids over the cap, in windows
    got = httpx.post(f"{server.url}/v1/embeddings", json={"model": "va", "input": ids, "windows": True}, headers=headers(), timeout=60)
    items, counts = oracle["va"].token_windows(ids)
    assert counts[0] > 1 and all(len(item.ids) <= CAP for item in items)
    rows = oracle["va"].embed_encoded(items)  # the windows' own vectors, put together here
    weights = np.asarray([item.text_tokens for item in items], dtype=np.float64)
    mean = weights @ rows / weights.sum()
    assert got.status_code == 200, got.text
    assert_rows(got.json()["data"][0]["embedding"], (mean / np.linalg.norm(mean))[None, :])


def test_openai_route_quantized_vectors(server, oracle):
    url = f"{server.url}/v1/embeddings"
    ubinary = httpx.post(url, json={"model": "kv", "input": TEXTS, "embedding_types": "ubinary"}, headers=headers(), timeout=30)
    np.testing.assert_array_equal(np.asarray([d["embedding"] for d in ubinary.json()["data"]]),
                                  np.packbits(oracle["kv"].encode(TEXTS) > 0, axis=-1))
    packed = httpx.post(url, json={"model": "kv", "input": TEXTS, "embedding_types": ["ubinary"], "encoding_format": "base64"},
                        headers=headers(), timeout=30)
    raw = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.uint8) for d in packed.json()["data"]])
    np.testing.assert_array_equal(raw, np.packbits(oracle["kv"].encode(TEXTS) > 0, axis=-1))
    two = httpx.post(url, json={"model": "kv", "input": "a", "embedding_types": ["float", "int8"]}, headers=headers(), timeout=30)
    assert two.status_code == 400 and "/v2/embed" in two.json()["error"]["message"]
    narrow = httpx.post(url, json={"model": "kv", "input": "a", "embedding_types": "int8", "dimensions": 8},
                        headers=headers(), timeout=30)
    assert narrow.status_code == 400 and narrow.json()["error"]["param"] == "embedding_types"


@pytest.mark.parametrize(("path", "body", "shape"), [
    ("/embed", '{"inputs": "a \\ud800 b"}', {"error", "error_type"}),
    ("/tokenize", '{"inputs": ["ok", "a \\ud800 b"]}', {"error", "error_type"}),
    ("/v2/embed", '{"model": "kv", "texts": ["a \\ud800 b"]}', {"message"}),
    ("/v2/rerank", '{"model": "kv", "query": "\\udfff", "documents": ["a"]}', {"message"}),
    ("/embed", "[" * 100000 + "]" * 100000, {"error", "error_type"}),
    ("/v2/embed", '{"model": "kv", "texts": ["a"], "images": ["x"]}', {"message"}),
])
def test_hostile_bodies_get_a_4xx_in_the_dialects_shape(server, path, body, shape):
    response = httpx.post(f"{server.url}{path}", content=body.encode(), headers={**headers(), "Content-Type": "application/json"},
                          timeout=30)
    assert response.status_code == 400, response.text
    assert set(response.json()) == shape
