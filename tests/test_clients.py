"""The clients people point at an OpenAI URL, against a real ``kvembed serve`` on 127.0.0.1:
LangChain's ``OpenAIEmbeddings`` and LlamaIndex's ``OpenAIEmbedding`` give the runtime's vectors,
and the token-id bodies LangChain sends by default (tiktoken's cl100k ids, for OpenAI's models)
are refused with the fix named, for a prompt method and for ids past a raw-text model's vocabulary.

LangChain's default path cannot run here (tiktoken downloads its ids table), so the body it would
send is written out: ``input`` as lists of cl100k ids, as ``OpenAIEmbeddings`` batches them."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from kvembed.bench.served import ServerProcess

from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ["A cat sat on the mat.", "Stock markets fell sharply today.", "über 東京"]
#: "A cat sat on the mat." in cl100k_base, as LangChain's default path sends it
CL100K = [[32, 8415, 7731, 389, 279, 5634, 13]]


@pytest.fixture(scope="module")
def artifacts(stories_artifact, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("client-artifacts")
    shared = {"kv": stories_artifact("kv-embedding"), "va": stories_artifact("va", layers="1-2")}
    return {name: Path(shutil.copytree(path, root / name)) for name, path in shared.items()}


@pytest.fixture(scope="module")
def server(artifacts, tmp_path_factory):
    process = ServerProcess([f"kv={artifacts['kv']}", f"va={artifacts['va']}"], tmp_path_factory.mktemp("clients") / "server.log",
                            env={"KVEMBED_API_KEY": "k3y"})
    yield process.wait_healthy()
    process.stop()


def _close(got: list[list[float]], want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape
    assert float(np.min(np.sum(got * want, axis=1))) > 0.99999


def test_langchain_openai_embeddings(server, artifacts):
    from langchain_openai import OpenAIEmbeddings

    client = OpenAIEmbeddings(model="kv", base_url=f"{server.url}/v1", api_key="k3y", check_embedding_ctx_length=False)
    runtime = Embedder.load(artifacts["kv"], provider="cpu")
    _close(client.embed_documents(TEXTS), runtime.encode(TEXTS))
    _close([client.embed_query(TEXTS[0])], runtime.encode(TEXTS[:1]))


def test_llama_index_openai_embedding(server, artifacts):
    from llama_index.embeddings.openai import OpenAIEmbedding

    client = OpenAIEmbedding(model_name="va", api_base=f"{server.url}/v1", api_key="k3y", max_retries=0)
    runtime = Embedder.load(artifacts["va"], provider="cpu")
    _close(client.get_text_embedding_batch(TEXTS), runtime.encode(TEXTS))


@pytest.mark.parametrize(("model", "says"), [("kv", "wraps text in a prompt"), ("va", "token ids in [0, ")])
def test_tiktoken_ids_are_refused_with_the_fix(server, model, says):
    ids = CL100K if model == "kv" else [[*CL100K[0], 100_000]]  # cl100k reaches 100k; the demo vocabulary does not
    response = httpx.post(f"{server.url}/v1/embeddings", json={"model": model, "input": ids, "encoding_format": "base64"},
                          headers={"Authorization": "Bearer k3y"})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert says in message and "check_embedding_ctx_length=False" in message, message
