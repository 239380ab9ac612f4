"""The torch-free runtime: artifact loading, text -> tokens -> graph parity with the reference,
batching, streaming, concurrency and bad input."""

from __future__ import annotations

import json
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from checks import assert_same, run_without_torch
from conftest import TEXTS

from kvembed.modeling.reference import TorchEmbedder
from kvembed import OnnxRuntimeOptions
from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ALL_METHODS = ("kv-embedding", "va", "aligned-wva", "token-prepending", "last-token", "mean", "prompteol", "echo")
ROOT = Path(__file__).resolve().parents[1]


class Artifacts:
    """method -> the demo model's fp32 artifact (conftest's session-wide ``stories_artifact``)."""

    def __init__(self, make) -> None:
        self.make = make

    def __getitem__(self, method: str) -> Path:
        return self.make(method, "fp32", **({"layers": "1-2"} if method == "va" else {}))


@pytest.fixture(scope="module")
def artifacts(stories_artifact) -> Artifacts:
    return Artifacts(stories_artifact)


def random_texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "the a cat dog sat ran on in park mat blue sky why is was happy über 東京 🎉 , . ?".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(count)]


@pytest.mark.parametrize("method", ALL_METHODS)
def test_runtime_equals_the_reference_through_text(artifacts, method):
    runtime = Embedder.load(artifacts[method], provider="cpu")
    reference = TorchEmbedder.from_pretrained("stories260k", method, **({"layers": "1-2"} if method == "va" else {}))
    texts = TEXTS + ["", "   ", "x" * 3000]  # the last is cut to max_length (prompt kept whole)
    for kind in ("document", "query"):
        with pytest.warns(UserWarning, match="1 of 9 text"):
            ours = runtime.encode(texts, kind=kind, batch_size=4)
        expected = reference.encode(texts, kind=kind)
        assert ours.shape == expected.shape == (len(texts), runtime.dim)
        assert_same(ours, expected, what=f"{method} {kind}")
    raw = runtime.encode(TEXTS, normalize=False)
    np.testing.assert_allclose(raw, reference.encode(TEXTS, normalize=False), rtol=1e-4, atol=1e-4)


def test_token_ids_equal_the_oracle_s(artifacts, oracle):
    """The artifact's tokenizer.json and manifest give the ids the oracle builds from the model
    folder and METHODS.md (the PyTorch reference shares the runtime's TextEncoder: no oracle)."""
    runtime = Embedder.load(artifacts["token-prepending"], provider="cpu")
    reference = oracle("stories260k")
    for kind in ("document", "query"):
        for text in TEXTS + random_texts(50):
            ours = runtime.encoder.encode_one(text, kind)
            theirs = reference.tokenize("token-prepending", text, kind)
            assert list(ours.ids) == theirs.ids and ours.ids.index(runtime.encoder.placeholder_id) == theirs.pst_index
    # a text containing the placeholder itself is refused by name, as in the reference
    with pytest.raises(ValueError, match="<PST>"):
        runtime.encode(["ok", "see <PST> here"])


def test_batched_equals_one_by_one_for_300_texts(artifacts):
    runtime = Embedder.load(artifacts["kv-embedding"], provider="cpu")
    texts = random_texts(300, seed=1)
    batched = runtime.encode(texts, batch_size=16, max_batch_tokens=600)
    single = np.stack([runtime.encode([t])[0] for t in texts])
    assert batched.shape == (300, runtime.dim)
    assert_same(batched, single)  # order kept, none lost


def test_encode_from_eight_threads_matches_serial(artifacts):
    runtime = Embedder.load(artifacts["va"], provider="cpu")
    groups = [random_texts(20, seed=s) for s in range(8)]
    serial = [runtime.encode(g, batch_size=8) for g in groups]
    with ThreadPoolExecutor(max_workers=8) as pool:
        parallel = list(pool.map(lambda g: runtime.encode(g, batch_size=8), groups))
    for a, b in zip(serial, parallel):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_memory_arena_off_gives_memory_back_with_the_same_vectors(artifacts):
    texts = random_texts(40, seed=3)
    default = Embedder.load(artifacts["va"], provider="cpu")
    lean = Embedder.load(artifacts["va"], provider="cpu", options=OnnxRuntimeOptions(memory_arena=False))
    assert default.session.get_session_options().enable_cpu_mem_arena
    assert not lean.session.get_session_options().enable_cpu_mem_arena
    np.testing.assert_allclose(lean.encode(texts), default.encode(texts), atol=1e-6)


def test_call_token_budget_slices_rows_without_changing_vectors(artifacts):
    """A padded batch runs in row slices of at most max_call_tokens padded tokens (CPU default
    2048): the same vectors as one call, with the slices' sizes as planned."""
    texts = random_texts(40, seed=4)
    runtime = Embedder.load(artifacts["kv-embedding"], provider="cpu")
    assert runtime.max_call_tokens == 2048 and runtime.rows_per_call(512) == 4 and runtime.rows_per_call(4096) == 1
    whole = Embedder.load(artifacts["kv-embedding"], provider="cpu", max_call_tokens=None)
    assert whole.rows_per_call(512) is None
    batch = runtime.encoder.pad(runtime.encoder.encode(texts, "document"))
    width = batch["input_ids"].shape[1]
    one_row = Embedder.load(artifacts["kv-embedding"], provider="cpu", max_call_tokens=width)  # a row per call
    assert one_row.rows_per_call(width) == 1
    want = whole.run(batch)
    for sliced in (runtime, one_row):
        rows_seen, real_run = [], sliced.session.run
        sliced.session.run = lambda feeds, names: rows_seen.append(len(feeds["input_ids"])) or real_run(feeds, names)
        got = sliced.run(batch)
        step = sliced.rows_per_call(width)
        assert rows_seen == [min(step, 40 - i) for i in range(0, 40, step)], rows_seen
        np.testing.assert_allclose(got[0], want[0], atol=1e-6)
        np.testing.assert_allclose(got[1], want[1], atol=1e-5)
    assert_same(one_row.encode(texts, batch_size=40), whole.encode(texts, batch_size=40))
    for bad in (0, -5, 2.5, True, "many"):
        with pytest.raises(ValueError, match="max_call_tokens must be an integer >= 1"):
            Embedder.load(artifacts["kv-embedding"], provider="cpu", max_call_tokens=bad)


def test_call_cost_cuts_encode_batches_by_padding_without_changing_vectors(artifacts):
    """encode plans batches with the call cost (CPU default 32): the padded tokens it sends are
    those of the cheapest plan, fewer than greedy cuts on spread-out lengths, and the vectors
    equal greedy cuts' (rows are independent)."""
    texts = random_texts(60, seed=8)
    planned = Embedder.load(artifacts["kv-embedding"], provider="cpu")
    greedy = Embedder.load(artifacts["kv-embedding"], provider="cpu", call_cost=None)
    assert planned.call_cost == 32 and greedy.call_cost is None
    sent: dict[str, list[int]] = {}
    for name, runtime in (("planned", planned), ("greedy", greedy)):
        real_run, sent[name] = runtime.run_outputs, []
        runtime.run_outputs = lambda batch, names, policy=None, real_run=real_run, name=name: sent[name].append(batch["input_ids"].size) or real_run(batch, names, policy)
    assert_same(planned.encode(texts, batch_size=32), greedy.encode(texts, batch_size=32))
    lengths = [len(item.ids) for item in planned.encoder.encode(texts, "document")]
    order = sorted(lengths, reverse=True)
    assert sum(sent["greedy"]) == sum(len(order[i : i + 32]) * order[i] for i in range(0, 60, 32))
    assert sum(sent["planned"]) < sum(sent["greedy"])
    assert sum(sent["planned"]) + 32 * len(sent["planned"]) <= sum(sent["greedy"]) + 32 * len(sent["greedy"])
    for bad in (-1, 2.5, True, "cheap"):
        with pytest.raises(ValueError, match="call_cost must be an integer >= 0"):
            Embedder.load(artifacts["kv-embedding"], provider="cpu", call_cost=bad)


def test_stream_of_10k_texts_reads_ahead_at_most_one_chunk_and_is_complete(artifacts):
    """Bounded memory, measured: the input generator is never more than one chunk ahead of the
    rows delivered, and the Python heap's peak while streaming stays below what the whole
    output alone would take. Every row arrives, in order."""
    import tracemalloc

    runtime = Embedder.load(artifacts["mean"], provider="cpu")
    total_texts, chunk_size = 10_000, 500
    pulled = 0

    def texts():
        nonlocal pulled
        for i in range(total_texts):
            pulled += 1
            yield f"t{i}"

    delivered, first, last = 0, None, None
    whole_output = total_texts * runtime.dim * 4
    tracemalloc.start()
    try:
        for chunk in runtime.encode_stream(texts(), chunk_size=chunk_size, batch_size=250):
            assert chunk.shape[0] <= chunk_size and chunk.dtype == np.float32
            delivered += chunk.shape[0]
            assert pulled <= delivered + chunk_size, f"read {pulled} texts ahead of {delivered} rows"
            first = chunk[:3].copy() if first is None else first
            last = chunk[-2:].copy()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert delivered == pulled == total_texts
    assert peak < whole_output / 2, f"peak {peak} bytes while streaming; the whole output is {whole_output}"
    np.testing.assert_allclose(first, runtime.encode(["t0", "t1", "t2"]), atol=1e-6)
    np.testing.assert_allclose(last, runtime.encode([f"t{total_texts - 2}", f"t{total_texts - 1}"]), atol=1e-6)


def test_stream_names_the_global_index_of_a_bad_item(artifacts):
    runtime = Embedder.load(artifacts["mean"], provider="cpu")
    with pytest.raises(TypeError, match=r"texts\[5\]"):
        list(runtime.encode_stream(["a", "b", "c", "d", "e", None], chunk_size=2))


def test_bad_inputs(artifacts):
    runtime = Embedder.load(artifacts["echo"], provider="cpu")
    assert runtime.encode([]).shape == (0, runtime.dim)
    assert runtime.encode("one text").shape == (runtime.dim,)
    empties = runtime.encode(["", " ", "\n"])
    np.testing.assert_allclose(np.linalg.norm(empties, axis=1), 1.0, atol=1e-5)
    with pytest.raises(TypeError, match=r"texts\[1\] is NoneType"):
        runtime.encode(["ok", None])
    with pytest.raises(TypeError, match=r"texts\[0\] is int"):
        runtime.encode([7])
    with pytest.raises(ValueError, match="kind must be one of"):
        runtime.encode(["x"], kind="passage")
    with pytest.warns(UserWarning, match=r"2 of 3 text\(s\) exceed max_length=\d+ tokens .*\(texts\[0\], texts\[2\]\)"):
        out = runtime.encode(["a" * 100_000, "b", "c " * 50_000])
    assert np.isfinite(out).all()


def test_missing_corrupted_and_future_artifacts(artifacts, tmp_path):
    with pytest.raises(FileNotFoundError, match="no artifact directory"):
        Embedder.load(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError, match="has no kvembed.json"):
        Embedder.load(tmp_path)

    damaged = tmp_path / "damaged"
    shutil.copytree(artifacts["mean"], damaged)
    with open(damaged / "tokenizer.json", "a", encoding="utf-8") as handle:
        handle.write(" ")
    with pytest.raises(ValueError, match="tokenizer.json .*(sha256|bytes)"):
        Embedder.load(damaged)
    (damaged / "model.onnx").unlink()
    with pytest.raises(ValueError, match="model.onnx is missing"):
        Embedder.load(damaged)

    future = tmp_path / "future"
    shutil.copytree(artifacts["mean"], future)
    manifest = json.loads((future / "kvembed.json").read_text())
    manifest["schema_version"] = 99
    (future / "kvembed.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="newer than this kvembed reads .* upgrade kvembed"):
        Embedder.load(future)

    (future / "kvembed.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        Embedder.load(future)


def test_gpu_providers_fail_clearly_without_onnxruntime_gpu(artifacts):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has onnxruntime-gpu")
    for provider in ("cuda", "tensorrt"):
        with pytest.raises(RuntimeError, match="onnxruntime-gpu"):
            Embedder.load(artifacts["mean"], provider=provider)
    assert Embedder.load(artifacts["mean"], provider="auto").target == "onnxruntime-cpu"
    with pytest.raises(ValueError, match="provider must be one of auto, cpu, cuda, tensorrt"):
        Embedder.load(artifacts["mean"], provider="gpu")


def test_runtime_imports_without_torch_or_transformers(artifacts):
    result = run_without_torch(
        f"""
        from kvembed.runtime import Embedder
        embedder = Embedder.load({str(artifacts["kv-embedding"])!r}, provider="cpu")
        print(embedder.encode(["a cat"]).shape)
        """,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "(1, 64)" in result.stdout


def test_mteb_adapter_follows_the_encoder_protocol(artifacts):
    from kvembed.runtime.mteb import MTEBEncoder

    runtime = Embedder.load(artifacts["kv-embedding"], provider="cpu")
    adapter = MTEBEncoder(runtime, batch_size=4)
    batches = [{"text": TEXTS[:3]}, {"text": TEXTS[3:]}]  # what iterating mteb's DataLoader yields
    queries = adapter.encode(batches, task_metadata=None, hf_split="test", hf_subset="default", prompt_type="query")
    documents = adapter.encode(batches, task_metadata=None, hf_split="test", hf_subset="default", prompt_type=None)
    np.testing.assert_allclose(queries, runtime.encode_query(TEXTS), atol=1e-6)
    np.testing.assert_allclose(documents, runtime.encode_document(TEXTS), atol=1e-6)
    matrix = adapter.similarity(queries, documents)
    assert matrix.shape == (len(TEXTS), len(TEXTS))
    np.testing.assert_allclose(np.diag(matrix), adapter.similarity_pairwise(queries, documents), atol=1e-6)
    expected = queries[0] @ documents[1] / (np.linalg.norm(queries[0]) * np.linalg.norm(documents[1]))
    assert abs(matrix[0, 1] - expected) < 1e-6
    with pytest.raises(ValueError, match="text only"):
        adapter.encode([{"image": [1]}], prompt_type=None)
    with pytest.raises(ValueError, match="unknown prompt_type"):
        adapter.encode(batches, prompt_type="instruction")


def test_cli_embeds_with_an_artifact_and_files(artifacts, tmp_path):
    from typer.testing import CliRunner

    from kvembed.cli.main import app

    runner = CliRunner()
    directory = str(artifacts["va"])
    result = runner.invoke(app, ["embed", directory, "A cat.", "A dog."])
    assert result.exit_code == 0, result.output
    assert "va on" in result.output and "2 x 32" in result.output

    source = tmp_path / "texts.txt"
    lines = [f"line {i} " + "word " * (i % 17) for i in range(300)]
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    target = tmp_path / "out" / "vectors.jsonl"
    result = runner.invoke(app, ["embed", "--model", directory, "--input", str(source), "--output", str(target)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [row["index"] for row in rows] == list(range(300))
    expected = Embedder.load(artifacts["va"]).encode(lines)
    np.testing.assert_allclose(np.array([row["embedding"] for row in rows]), expected, atol=1e-6)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": 1}\n', encoding="utf-8")
    result = runner.invoke(app, ["embed", directory, "--input", str(bad), "--output", str(tmp_path / "x.npy")])
    assert result.exit_code == 2 and "bad.jsonl:2" in result.output
    assert not (tmp_path / "x.npy").exists() and not (tmp_path / "x.npy.partial").exists()
    result = runner.invoke(app, ["embed", directory, "--layers", "1", "x"])
    assert result.exit_code == 2 and "fixes its method options" in result.output and "drop --layers" in result.output


def test_an_input_cap_cuts_like_a_shorter_max_length_and_never_raises_it(stories_artifact):
    """``cap_input_tokens`` (kvembed serve's per-input limit) lowers the cut point only: a capped
    text embeds exactly like the reference truncated to the same length."""
    path = stories_artifact("mean")
    embedder = Embedder.load(path)
    full = embedder.max_length
    embedder.cap_input_tokens(full + 100)
    assert embedder.max_length == full
    embedder.cap_input_tokens(6)
    assert embedder.max_length == 6
    text = "The quick brown fox jumps over the lazy dog."
    with pytest.warns(UserWarning):
        got = embedder.encode([text])
    want = TorchEmbedder.from_pretrained("stories260k", "mean", max_length=6).encode([text])
    assert_same(got, want, "fp32", "capped at 6 tokens")
    with pytest.raises(ValueError, match=">= 1 token"):
        embedder.cap_input_tokens(0)
