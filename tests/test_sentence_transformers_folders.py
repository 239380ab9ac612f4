"""Trained decoder embedders from their sentence-transformers folder (issue 61): a folder shaped as
Qwen3-Embedding, gte-Qwen2 and e5-mistral ship theirs (modules.json, 1_Pooling, 2_Normalize, their
real prompts, a tokenizer whose post-processor appends EOS) around a tiny random decoder of the
family; ``kvembed export`` of the folder computes its own recipe, and the torch-free artifact's
vectors are sentence-transformers' own on that folder (the second reference beside kvembed's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import build_tiny_model

from kvembed.artifact import load_manifest
from kvembed.bench.synthetic import write_sentence_transformers_files
from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QWEN3_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
#: family -> (the decoder's architecture, 1_Pooling's mode, config_sentence_transformers.json's prompts), as each ships
FOLDERS = {
    "qwen3-embedding": ("qwen3", "pooling_mode_lasttoken", {"query": QWEN3_QUERY, "document": ""}),
    "gte-qwen2": ("qwen2", "pooling_mode_lasttoken", {"query": QWEN3_QUERY + " "}),
    "e5-mistral": ("mistral", "pooling_mode_lasttoken", {"web_search_query": QWEN3_QUERY + " ",
                                                         "sts_query": "Instruct: Retrieve semantically similar text.\nQuery: "}),
    "mean-pooled": ("llama", "pooling_mode_mean_tokens", {}),
}
QUERIES = ["what is the capital of France?", "how do cats sleep"]
DOCUMENTS = ["Paris is the capital and largest city of France.", "Cats sleep for twelve to sixteen hours a day, often curled up.",
             "The quick brown fox jumps over the lazy dog near the river bank on a sunny afternoon."]


def sentence_transformers_folder(root: Path, family: str) -> Path:
    """A sentence-transformers folder as SentenceTransformer.save() writes one, around a tiny random decoder."""
    arch, mode, prompts = FOLDERS[family]
    folder = build_tiny_model(arch, root / family, seed=5)
    return write_sentence_transformers_files(folder, mode, prompts, eos_id=2)  # the EOS these models are trained with


def kvembed_export(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("kvembed-export")
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(family)`` -> (its folder, ``kvembed export``'s run, the artifact): each family's
    folder exported once for the module (read-only)."""
    made: dict[str, tuple[Path, subprocess.CompletedProcess[str], Path]] = {}

    def get(family: str) -> tuple[Path, subprocess.CompletedProcess[str], Path]:
        if family not in made:
            root = tmp_path_factory.mktemp(family)
            folder = sentence_transformers_folder(root, family)
            made[family] = folder, kvembed_export("--model", str(folder), "--out", str(root / "art")), root / "art"
        return made[family]

    return get


def worst_cosine(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.min(np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))))


@pytest.mark.parametrize("family", list(FOLDERS))
def test_the_exported_folder_embeds_as_sentence_transformers_does(family, exported):
    from sentence_transformers import SentenceTransformer

    folder, done, artifact = exported(family)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "method: st (the sentence-transformers folder's own pooling and prompts" in " ".join((done.stdout + done.stderr).split())
    said = " ".join((done.stdout + done.stderr).split())
    assert "second reference: sentence-transformers" in said and "over 22 texts" in said, said
    record = load_manifest(artifact).source.second_reference
    assert record["compared"] is True and record["worst_cosine"] >= 0.99999, record
    embedder = Embedder.load(artifact, provider="cpu")
    reference = SentenceTransformer(str(folder), device="cpu")
    query_prompt = next((name for name in ("query", "web_search_query") if name in FOLDERS[family][2]), None)
    want_queries = reference.encode(QUERIES, prompt_name=query_prompt, normalize_embeddings=True)
    want_documents = reference.encode(DOCUMENTS, prompt_name="document" if "document" in FOLDERS[family][2] else None,
                                      normalize_embeddings=True)
    assert worst_cosine(embedder.encode(QUERIES, kind="query"), want_queries) >= 0.99999
    assert worst_cosine(embedder.encode(DOCUMENTS, kind="document"), want_documents) >= 0.99999
    if query_prompt is not None:  # the prompt matters: without it the vectors differ
        assert worst_cosine(embedder.encode(QUERIES, kind="document"), want_queries) < 0.9999


@pytest.mark.parametrize("damage, said", [
    (lambda f: (f / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True})),
     "pooling pooling_mode_cls_token is not one kvembed computes"),
    (lambda f: (f / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Transformer", "path": "../.."},
                                                           {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}])),
     "is not a folder inside the model folder"),
    (lambda f: (f / "modules.json").write_text("[" * 5000), "is not readable JSON"),
    (lambda f: (f / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}])),
     "kvembed computes a Transformer, a Pooling and an optional Normalize module"),
], ids=["cls-pooling", "climbing-path", "nested-json", "dense-module"])
def test_a_folder_kvembed_cannot_compute_is_one_line(damage, said, tmp_path):
    folder = sentence_transformers_folder(tmp_path, "qwen3-embedding")
    damage(folder)
    done = kvembed_export("--model", str(folder), "--out", str(tmp_path / "art"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert said in " ".join(done.stderr.split()), done.stderr
    assert not (tmp_path / "art").exists()


def test_method_st_needs_a_sentence_transformers_folder(tmp_path):
    folder = build_tiny_model("qwen3", tmp_path / "plain")
    done = kvembed_export("--model", str(folder), "--method", "st", "--out", str(tmp_path / "art"))
    assert done.returncode == 2 and "method st reads a sentence-transformers folder" in " ".join(done.stderr.split()), done.stderr


def test_the_second_reference_stops_a_folder_whose_vectors_kvembed_does_not_compute(tmp_path):
    """A folder whose Transformer lower-cases text (sentence_bert_config.json's do_lower_case):
    sentence-transformers' vectors are not the st method's, and the export says so and writes nothing."""
    folder = sentence_transformers_folder(tmp_path, "qwen3-embedding")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": True}))
    done = kvembed_export("--model", str(folder), "--out", str(tmp_path / "art"))
    said = " ".join(done.stderr.split())
    assert done.returncode != 0 and "own vectors on this folder: worst cosine" in said, done.stderr[-3000:]
    assert "Loading weights" not in said, said
    assert "Traceback" not in done.stderr and not (tmp_path / "art").exists()


def test_a_trained_embedder_s_alias_exports_its_folder_from_the_hub_cache(tmp_path):
    """``--model qwen3-embedding-0.6b`` names Qwen/Qwen3-Embedding-0.6B: found in the hub cache (as
    ``hf download`` leaves it) it exports as the st method with no --method; offline and not
    cached, the message names it and the fix.

    The folder's EOS is its pad token, as Qwen3's <|endoftext|> is: in a random model that row of
    the embedding table is zero, so an empty document is a zero vector on both sides, which agree
    (as the parity gate counts two equal zero rows)."""
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-Embedding-0.6B" / "snapshots" / "0123abcd"
    folder = build_tiny_model("qwen3", snapshot.parent / "built", seed=5)
    write_sentence_transformers_files(folder, "pooling_mode_lasttoken", FOLDERS["qwen3-embedding"][2], eos_id=0).rename(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd")
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "COLUMNS": "200"}
    script = Path(sys.executable).with_name("kvembed-export")
    done = subprocess.run([str(script), "--model", "qwen3-embedding-0.6b", "--out", str(tmp_path / "art")],
                          capture_output=True, text=True, timeout=600, env=offline)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, said[-3000:]
    assert "kvembed-export st on qwen3-embedding-0.6b" in said and "second reference: sentence-transformers" in said, said
    assert not np.any(Embedder.load(tmp_path / "art", provider="cpu").encode([""], kind="document"))
    gone = subprocess.run([str(script), "--model", "qwen3-embedding-8b", "--out", str(tmp_path / "art8")],
                          capture_output=True, text=True, timeout=600, env=offline)
    assert gone.returncode == 2 and "Traceback" not in gone.stderr, gone.stderr
    said = " ".join(gone.stderr.split())
    assert "'qwen3-embedding-8b' (Qwen/Qwen3-Embedding-8B): not local or cached; HF_HUB_OFFLINE is set" in said and "hf download Qwen/Qwen3-Embedding-8B" in said, said


def test_a_named_prompt_of_the_folder_is_asked_by_name_in_the_api_and_the_server(exported, tmp_path):
    """e5-mistral's folder names ``web_search_query`` and ``sts_query``: each is a prompt kvembed
    embeds with as sentence-transformers' ``prompt_name`` does, in ``Embedder.encode(kind=...)``, in
    OpenAI's ``input_type`` (the official client's extra_body) and TEI's ``prompt_name``; a name the
    folder lacks is a JSON 400 listing the model's prompts."""
    import httpx
    from openai import BadRequestError, OpenAI
    from sentence_transformers import SentenceTransformer

    from kvembed.bench.served import ServerProcess, stop_process

    folder, done, artifact = exported("e5-mistral")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    want = SentenceTransformer(str(folder), device="cpu").encode(QUERIES, prompt_name="sts_query", normalize_embeddings=True)
    embedder = Embedder.load(artifact, provider="cpu")
    assert worst_cosine(embedder.encode(QUERIES, kind="sts_query"), want) >= 0.99999
    assert worst_cosine(embedder.encode(QUERIES, kind="web_search_query"), want) < 0.9999  # another prompt, other vectors
    server = ServerProcess([str(artifact)], tmp_path / "serve.log").wait_healthy()
    try:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        got = client.embeddings.create(model="art", input=QUERIES, extra_body={"input_type": "sts_query"})
        assert worst_cosine(np.array([row.embedding for row in got.data]), want) >= 0.9999
        with pytest.raises(BadRequestError) as refused:
            client.embeddings.create(model="art", input=QUERIES, extra_body={"input_type": "nope" * 100})
        assert "is not a prompt of model 'art'; one of query, document, web_search_query, sts_query" in str(refused.value)
        tei = httpx.post(f"{server.url}/embed", json={"inputs": QUERIES, "prompt_name": "sts_query"}, timeout=60)
        assert tei.status_code == 200 and worst_cosine(np.array(tei.json()), want) >= 0.9999
        bad = httpx.post(f"{server.url}/tokenize", json={"inputs": "hi", "prompt_name": "nope"}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"].startswith("prompt_name='nope' is not a prompt"), bad.text
        assert bad.json()["error_type"] == "Validation", bad.text
    finally:
        stop_process(server.process, 10)
