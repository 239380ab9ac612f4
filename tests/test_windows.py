"""Windows: an input over the cap embedded whole, as consecutive windows whose
vectors are averaged by their tokens. Checked against computations made here: the windows' text
read back from their ids with the tokenizers library, the mean computed with numpy."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from typer.testing import CliRunner

from kvembed.methods import resolve
from kvembed.runtime import Embedder
from kvembed.runtime.encoding import TextEncoder, preprocess_text
from kvembed.runtime.windows import aggregate

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CALIBRATION = Path(__file__).resolve().parents[1] / "src" / "kvembed" / "data" / "calibration.txt"
WORDS = "the cat sat on a mat, why? blue sky \"quoted\" ünïcödé 日本語 über-long\twords\nnew line 42.5%".split(" ")


def long_text(words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    """A byte-level BPE with merges (trained here on kvembed's calibration text) and a BOS, as
    real LLM tokenizers are: windows' edges meet the prompt's tokens through merges."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "<pad>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CALIBRATION.read_text(encoding="utf-8").splitlines(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))])
    return tokenizer


def fresh(tokenizer: Tokenizer) -> Tokenizer:
    return Tokenizer.from_str(tokenizer.to_str())


def window_texts(tokenizer: Tokenizer, items, template: str) -> list[str]:
    """Each window's text, read back from its ids: the decoded prompt less the template around it."""
    head, tail = template.split("{text}")[0], template.split("{text}")[-1]
    texts = []
    for item in items:
        prompt = tokenizer.decode(list(item.ids), skip_special_tokens=True)
        assert prompt.startswith(head) and prompt.endswith(tail), prompt
        texts.append(prompt[len(head) : len(prompt) - len(tail)])
    return texts


@pytest.mark.parametrize("method", ["kv-embedding", "echo", "mean"])
def test_windows_fit_the_cap_and_cover_the_text_once(bpe, method):
    spec = resolve(method, 4)
    encoder = TextEncoder(fresh(bpe), spec, max_length=48 if method != "echo" else 80)
    text = long_text(400)
    items = encoder.encode_windows(text)
    assert len(items) > 5
    assert all(len(item.ids) <= encoder.max_length and not item.truncated for item in items)
    template = spec.templates["document"]
    texts = window_texts(bpe, items, template)
    if method == "echo":  # both copies hold the window: the second is what the template's tail follows
        texts = [t.split(", rewritten sentence: ")[-1] for t in texts]
    assert "".join(texts) == text
    bare = bpe.encode(text, add_special_tokens=False)  # the window's share of the text's tokens, independently
    starts = [a for a, _ in bare.offsets]
    edges = np.cumsum([0] + [len(t) for t in texts])
    assert [item.text_tokens for item in items] == [sum(a <= s < b for s in starts) for a, b in zip(edges, edges[1:])]
    assert encoder.encode_windows("a short one") == [encoder.encode_one("a short one")]


def test_token_prepending_windows_keep_one_placeholder_and_clean_each_window(bpe):
    encoder = TextEncoder(fresh(bpe), resolve("token-prepending", 4), max_length=48)
    text = long_text(300, seed=1)
    items = encoder.encode_windows(text)
    assert len(items) > 3 and all(len(i.ids) <= 48 and not i.truncated for i in items)
    assert all(item.ids.count(encoder.placeholder_id) == 1 for item in items)
    cleaned = preprocess_text(text)  # windows are cut from the cleaned text; each is cleaned again as an input
    assert sum(item.text_tokens for item in items) == len(bpe.encode(cleaned, add_special_tokens=False).ids)
    with pytest.raises(ValueError, match="lone surrogate"):
        encoder.encode_windows(text + "\ud800")


def test_causal2vec_windows_get_their_own_context(bpe):
    method = resolve("causal2vec", 4, placeholder="<s>")
    context = fresh(bpe)
    encoder = TextEncoder(fresh(bpe), method, max_length=40, context_tokenizer=context, context_max_length=64)
    text = long_text(200, seed=2)
    items = encoder.encode_windows(text)
    assert len(items) > 3 and all(len(i.ids) <= 40 and not i.truncated for i in items)
    texts = window_texts(bpe, items, "{text}")  # the document prompt is the placeholder (a special token) and the text
    assert "".join(texts) == text
    reference = fresh(bpe)
    reference.enable_truncation(64)
    assert [item.context for item in items] == [tuple(reference.encode(t).ids) for t in texts]
    assert all(item.pool == (item.ids.index(encoder.context_id, 1),) for item in items)


def test_aggregate_is_the_token_weighted_mean_renormalised():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(5, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    out = aggregate(vectors, [1, 3, 1], [7, 10, 20, 5, 3])
    mean = (10 * vectors[1] + 20 * vectors[2] + 5 * vectors[3]) / 35
    assert np.array_equal(out[0], vectors[0]) and np.array_equal(out[2], vectors[4])
    assert np.allclose(out[1], mean / np.linalg.norm(mean), atol=1e-6)
    raw = aggregate(3 * vectors, [1, 3, 1], [7, 10, 20, 5, 3], normalize=False)  # raw pooled windows: the mean only
    assert np.allclose(raw[1], 3 * mean, atol=1e-6) and np.array_equal(raw[0], 3 * vectors[0])
    with pytest.raises(ValueError, match="one row and one weight per window"):
        aggregate(vectors, [1, 1], [1] * 5)


@pytest.fixture(scope="module")
def kv(stories_artifact) -> Embedder:
    embedder = Embedder.load(stories_artifact("kv-embedding"), provider="cpu", threads=1)
    embedder.cap_input_tokens(64)
    return embedder


def test_encode_with_windows_is_the_weighted_mean_of_its_windows(kv):
    text = long_text(200, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # windows cut nothing: no truncation warning
        vectors = kv.encode([text, "short"], windows=True, batch_size=4)
    items = kv.encoder.encode_windows(text)
    texts = window_texts(kv.encoder.tokenizer, items, kv.method.templates["document"])
    assert len(texts) > 4 and "".join(texts) == text
    separate = kv.encode(texts)  # each fits: embedded as ordinary inputs
    weights = np.array([len(kv.encoder.tokenizer.encode(t, add_special_tokens=False).ids) for t in texts], dtype=np.float64)
    mean = weights @ separate / weights.sum()
    assert np.allclose(vectors[0], mean / np.linalg.norm(mean), atol=1e-5)
    with pytest.warns(UserWarning, match="exceed max_length=64"):
        cut = kv.encode([text, "short"])
    assert np.array_equal(cut[1], vectors[1]) or np.allclose(cut[1], vectors[1], atol=1e-6)
    assert not np.allclose(cut[0], vectors[0], atol=1e-3)
    streamed = np.concatenate(list(kv.encode_stream([text, "short"], chunk_size=1, windows=True)))
    assert np.allclose(streamed, vectors, atol=1e-6)


def test_texts_under_the_cap_are_unchanged_by_windows(kv):
    texts = ["a cat", "the blue sky", "why? 日本", ""]  # the prompt is most of the cap
    assert all(not item.truncated for item in kv.encoder.encode(texts))
    assert np.array_equal(kv.encode(texts, windows=True), kv.encode(texts))
    assert np.array_equal(kv.encode("one text", windows=True), kv.encode("one text"))
    assert np.array_equal(kv.encode(texts, windows=True, normalize=False), kv.encode(texts, normalize=False))


def test_token_windows_of_a_raw_method(stories_artifact, kv):
    mean = Embedder.load(stories_artifact("mean"), provider="cpu", threads=1)
    mean.cap_input_tokens(32)
    tokenizer = mean.encoder.tokenizer
    ascii_text = " ".join(word for word in long_text(80, seed=5).split(" ") if word.isascii())  # decodes exactly, even cut anywhere
    long_ids = tokenizer.encode(ascii_text).ids
    short_ids = tokenizer.encode("a cat").ids
    items, counts = mean.token_windows([long_ids, short_ids])
    assert counts[1] == 1 and counts[0] == len(items) - 1 > 2
    bos = long_ids[0]
    assert all(len(item.ids) <= 32 and item.ids[0] == bos and not item.truncated for item in items)
    assert [i for item in items[: counts[0]] for i in item.ids[1:]] == long_ids[1:]  # every id once, in order
    vectors = mean.embed_encoded(items)
    texts = [tokenizer.decode(list(item.ids), skip_special_tokens=True) for item in items]
    assert np.allclose(vectors, mean.encode(texts), atol=1e-6)  # each window is the model input of its text
    with pytest.raises(ValueError, match="raw-text methods"):
        kv.token_windows([short_ids])


runner = CliRunner()


def test_embed_command_with_windows(stories_artifact, tmp_path):
    from kvembed.cli.main import app

    artifact = stories_artifact("kv-embedding")
    embedder = Embedder.load(artifact, provider="cpu", threads=1)
    text = long_text(embedder.max_length // 3, seed=6).replace("\n", " ")  # one line, well over the artifact's cap
    assert not embedder.encoder.encode_windows(text)[0].ids == embedder.encoder.encode_one(text).ids
    (tmp_path / "in.txt").write_text(text + "\nshort line\n", encoding="utf-8")
    result = runner.invoke(app, ["embed", str(artifact), "--input", str(tmp_path / "in.txt"), "--output",
                                 str(tmp_path / "out.npy"), "--windows", "--provider", "cpu"])
    assert result.exit_code == 0, result.output
    assert "exceed max_length" not in result.output
    assert np.allclose(np.load(tmp_path / "out.npy"), embedder.encode([text, "short line"], windows=True), atol=1e-5)


def test_embed_corpus_with_windows_counts_them_and_refuses_a_changed_resume(stories_artifact, tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from kvembed.cli.main import app

    artifact = stories_artifact("kv-embedding")
    embedder = Embedder.load(artifact, provider="cpu", threads=1)
    texts = [long_text(embedder.max_length // 3, seed=7), "short", "another short one"]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    out = tmp_path / "vectors"
    result = runner.invoke(app, ["embed-corpus", str(artifact), "-i", str(source), "-o", str(out), "--windows", "--provider", "cpu"])
    assert result.exit_code == 0, result.output
    assert "1 as windows, 0 truncated" in result.output
    summary = json.loads((out / "_manifest.json").read_text())
    assert (summary["windowed"], summary["truncated"], summary["options"]["windows"]) == (1, 0, True)
    table = pq.read_table(next(out.glob("part-*.parquet")))
    matrix = np.stack(table.column("embedding").to_pylist()).astype(np.float32)
    assert np.allclose(matrix, embedder.encode(texts, windows=True), atol=1e-5)
    plain = tmp_path / "plain"
    assert runner.invoke(app, ["embed-corpus", str(artifact), "-i", str(source), "-o", str(plain), "--provider", "cpu"]).exit_code == 0
    assert json.loads((plain / "_manifest.json").read_text())["truncated"] == 1
    refused = runner.invoke(app, ["embed-corpus", "--resume", "-o", str(plain), "--windows"])
    assert refused.exit_code != 0 and "--windows" in refused.output
