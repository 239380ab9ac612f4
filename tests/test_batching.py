"""The one batching policy and loop: validation in one place, one name per idea (old names still
accepted), and every server (kvembed serve's batcher, corpus workers, Triton's python model) going
through the runtime's loop with the vectors of ``Embedder.encode``."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from kvembed.artifact.engine import Limits
from kvembed.runtime import Embedder
from kvembed.runtime import embedder as embedder_module
from kvembed.runtime.batching import BatchPolicy, plan_batches, run_batches

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]


def random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = "the a cat dog sat ran on in park mat blue sky why is was happy".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) for _ in range(count)]


# -- the policy ------------------------------------------------------------------------------------


def test_one_name_per_idea_and_old_names_are_refused():
    assert [f.name for f in dataclasses.fields(BatchPolicy)] == [
        "batch_size", "max_batch_tokens", "max_call_tokens", "call_cost", "max_padding"]
    base = BatchPolicy(max_call_tokens=2048, call_cost=32)
    policy = BatchPolicy.from_options(base, batch_size=8, max_batch_tokens=600)
    assert (policy.batch_size, policy.max_batch_tokens) == (8, 600)
    assert policy.max_call_tokens == 2048 and policy.call_cost == 32  # what is not given stays the base's
    assert BatchPolicy.from_options(policy, max_batch_tokens=None).max_batch_tokens is None  # None is a value: no limit
    for old in ("max_tokens", "max_batch_size", "batch_tokens", "rows"):  # the old names are unknown names now
        with pytest.raises(TypeError, match=f"unknown batching option '{old}'; the options are batch_size, call_cost"):
            BatchPolicy.from_options(base, **{old: 3})


@pytest.mark.parametrize("field, value, message", [
    ("batch_size", 0, "batch_size must be an integer >= 1"),
    ("batch_size", 2.5, "batch_size must be an integer >= 1"),
    ("max_batch_tokens", 0, "max_batch_tokens must be an integer >= 1"),
    ("max_call_tokens", True, "max_call_tokens must be an integer >= 1"),
    ("max_call_tokens", "many", "max_call_tokens must be an integer >= 1"),
    ("call_cost", -1, "call_cost must be an integer >= 0"),
    ("max_padding", 1.0, r"max_padding must be in \[0, 1\)"),
])
def test_the_policy_validates_every_field_in_one_place(field, value, message):
    with pytest.raises(ValueError, match=message):
        BatchPolicy(**{field: value})
    with pytest.raises(ValueError, match=message):  # the same check, whoever builds it
        BatchPolicy.from_options(BatchPolicy(), **{field: value})
    with pytest.raises(ValueError, match="max_padding or call_cost, not both"):
        BatchPolicy(call_cost=8, max_padding=0.1)


def test_plan_batches_is_the_policy_plan_and_rows_per_call_keeps_a_row():
    lengths = [random.Random(3).randint(1, 300) for _ in range(200)]
    for kwargs in ({}, {"max_batch_tokens": 1000}, {"max_batch_tokens": 1000, "call_cost": 16}, {"max_padding": 0.2}):
        policy = BatchPolicy.from_options(BatchPolicy(batch_size=16), **kwargs)
        assert plan_batches(lengths, 16, **kwargs) == policy.plan(lengths)
    assert BatchPolicy(max_call_tokens=2048).rows_per_call(512) == 4
    assert BatchPolicy(max_call_tokens=100).rows_per_call(512) == 1
    assert BatchPolicy().rows_per_call(512) is None


def test_the_loop_scatters_rows_back_in_input_order_with_any_pad_and_run():
    """run_batches is generic: lists of ints padded by numpy, a run that sums rows (as a torch
    forward would return pooled rows); rows come back in input order, every batch is reported."""
    rows = [list(range(1, n + 1)) for n in (5, 1, 9, 3, 3, 7, 2)]
    seen: list[list[int]] = []

    def pad(batch):
        width = max(len(row) for row in batch)
        return np.array([row + [0] * (width - len(row)) for row in batch])

    out = np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=np.int64)
    run_batches(rows, BatchPolicy(batch_size=3), pad, lambda batch: (batch.sum(1), np.full(len(batch), batch.shape[1])), out,
                lengths=[len(row) for row in rows], on_batch=lambda indices, batch: seen.append(indices))
    assert out[0].tolist() == [sum(row) for row in rows]
    width = {i: max(len(rows[j]) for j in batch) for batch in seen for i in batch}
    assert out[1].tolist() == [width[i] for i in range(len(rows))]  # each row scattered from its own batch
    assert sorted(i for batch in seen for i in batch) == list(range(len(rows))) and max(map(len, seen)) == 3


# -- the Embedder's public entry points ------------------------------------------------------------


@pytest.fixture(scope="module")
def kv(stories_artifact) -> Path:
    return stories_artifact("kv-embedding")


@pytest.fixture(scope="module")
def echo(stories_artifact) -> Path:
    return stories_artifact("echo")  # a pool_mask method


@pytest.fixture()
def loop_calls(monkeypatch) -> list[int]:
    """How many times the runtime's batching loop ran (items per run)."""
    calls: list[int] = []
    real = embedder_module.run_batches

    def counted(items, *args, **kwargs):
        calls.append(len(items))
        return real(items, *args, **kwargs)

    monkeypatch.setattr(embedder_module, "run_batches", counted)
    return calls


def test_encode_goes_through_the_loop_and_refuses_the_old_keyword(kv, loop_calls):
    embedder = Embedder.load(kv, provider="cpu")
    texts = random_texts(30, seed=1)
    batched = embedder.encode(texts, batch_size=8, max_batch_tokens=400)
    encoded = embedder.encoder.encode(texts, "document")
    np.testing.assert_allclose(embedder.embed_encoded(encoded), batched, atol=1e-6)
    assert loop_calls == [30, 30]
    with pytest.raises(TypeError, match="max_tokens"):
        embedder.encode(texts, max_tokens=400)
    assert embedder.policy.max_call_tokens == embedder.max_call_tokens == 2048 and embedder.call_cost == 32
    assert embedder.padding_side == embedder.encoder.padding_side == "right"
    left = embedder.encoder.pad(encoded[:3], "left")  # an explicit side for one call (the parity gate's)
    assert left["attention_mask"][:, -1].all() and embedder.encoder.pad(encoded[:3])["attention_mask"][:, 0].all()


def test_the_serve_batcher_embeds_through_the_loop_with_encodes_vectors(kv, loop_calls):
    from kvembed.serve.batcher import Batcher
    from kvembed.serve.config import ServeConfig
    from kvembed.serve.metrics import Metrics

    embedder = Embedder.load(kv, provider="cpu", threads=1)
    config = ServeConfig(artifacts=(("kv", kv),), batch_size=8, max_batch_tokens=1024)
    policy = config.policy(embedder.policy)
    assert (policy.batch_size, policy.max_batch_tokens, policy.max_call_tokens, policy.call_cost) == (8, 1024, 2048, 32)
    requests = [random_texts(n, seed=n) for n in (1, 5, 12)]

    async def serve_all():
        batcher = Batcher(embedder, "kv", Metrics(), policy)
        batcher.start()
        try:
            return await asyncio.gather(*(batcher.embed(embedder.encoder.encode(texts), None) for texts in requests))
        finally:
            await batcher.stop()

    results = asyncio.run(serve_all())
    assert loop_calls and sum(loop_calls) == sum(map(len, requests))
    oracle = Embedder.load(kv, provider="cpu")
    for texts, got in zip(requests, results):
        np.testing.assert_allclose(got, oracle.encode(texts), atol=1e-5)


def test_a_corpus_worker_embeds_through_the_loop_with_encodes_vectors(kv, loop_calls):
    pytest.importorskip("pyarrow")
    from kvembed.corpus import CorpusOptions
    from kvembed.corpus.worker import Job, ShardWorker

    with pytest.raises(TypeError, match="batch_tokens"):  # the old name of max_batch_tokens
        CorpusOptions(kv, ["x.txt"], "out", batch_tokens=512)
    job = Job(artifact=str(kv), threads=1, kind="document", max_batch_tokens=512, output_dtype="float32",
              on_error="fail", columns=None, files=(), output="")
    worker = ShardWorker(job)
    texts = random_texts(40, seed=7)
    counted: list[tuple[int, int]] = []
    encoded = [worker.embedder.encoder.encode_one(text, "document") for text in texts]
    vectors, tokens, truncated = worker.embed(encoded, lambda rows, tokens: counted.append((rows, tokens)))
    assert loop_calls == [40] and sum(rows for rows, _ in counted) == 40 and sum(t for _, t in counted) == tokens
    np.testing.assert_allclose(vectors, Embedder.load(kv, provider="cpu").encode(texts), atol=1e-5)


# -- Triton's python model (with a stand-in for Triton's python-backend module) -----------------------


class _Tensor:
    def __init__(self, name, array):
        self.name, self.array = name, array

    def as_numpy(self):
        return self.array


class _Response:
    def __init__(self, output_tensors, error=None):
        self.output_tensors, self.error = output_tensors, error


class _TritonError(Exception):
    INVALID_ARG, INTERNAL = 1, 2

    def __init__(self, message, code=None):
        super().__init__(message)


def _load_triton_model(monkeypatch, artifact: Path, tmp_path: Path, parameters: dict[str, str]):
    fake = types.ModuleType("triton_python_backend_utils")
    fake.get_input_tensor_by_name = lambda request, name: _Tensor(name, request[name]) if name in request else None
    fake.Tensor, fake.InferenceResponse, fake.TritonError = _Tensor, _Response, _TritonError
    fake.Logger = types.SimpleNamespace(log_info=lambda message: None)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the model puts its own folder first
    spec = importlib.util.spec_from_file_location("kvembed_test_onnx_model", ROOT / "src/kvembed/triton/backend/onnx_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "artifact").symlink_to(artifact)
    module.HERE = tmp_path
    manifest = json.loads((artifact / "kvembed.json").read_text())
    config = {"max_batch_size": 8, "parameters": {k: {"string_value": v} for k, v in parameters.items()},
              "input": [{"name": item["name"]} for item in manifest["inputs"]], "output": [{"name": "embedding"}]}
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_name": "test_model"})
    return model


def test_tritons_python_model_runs_the_loop_within_the_backends_row_limit(echo, tmp_path, monkeypatch, loop_calls):
    """Requests padded to different widths merge; their rows go through the runtime's loop, each
    graph call within the session's row limit (a TensorRT engine's), with encode's vectors."""
    model = _load_triton_model(monkeypatch, echo, tmp_path, {"provider": "cpu", "threads": "1", "batch_size": "32",
                                                             "max_batch_tokens": "4096", "max_padding": ""})
    assert model.policy.max_batch_tokens == 4096 and model.policy.max_padding == 0.1 and model.policy.call_cost is None
    session = model.embedder.session
    rows_per_call: list[int] = []
    real_run = session.run
    session.limits = Limits(max_batch_size=2, min_sequence=1, max_sequence=4096)  # what a TensorRT engine's profiles say

    def run(feeds, names):
        rows_per_call.append(len(feeds["input_ids"]))
        return real_run(feeds, names)

    session.run = run
    oracle = Embedder.load(echo, provider="cpu")
    requests = [random_texts(n, seed=10 + n) for n in (3, 1, 6)]
    responses = model.execute([oracle.encoder.pad(oracle.encoder.encode(texts)) for texts in requests])
    assert loop_calls == [10] and rows_per_call and max(rows_per_call) <= 2 and sum(rows_per_call) == 10
    for texts, response in zip(requests, responses):
        assert response.error is None
        np.testing.assert_allclose(response.output_tensors[0].array, oracle.encode(texts), atol=1e-5)


# -- the command lines ------------------------------------------------------------------------------


@pytest.mark.parametrize("command, shown", [
    (["serve"], ["--batch-size", "--max-batch-tokens", "--call-cost"]),
    (["embed-corpus"], ["--max-batch-tokens"]),
    (["triton", "build"], ["--max-batch-tokens"]),
])
def test_every_cli_shows_the_batching_names(command, shown):
    from typer.testing import CliRunner

    from kvembed.cli.main import app

    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "240", "TERMINAL_WIDTH": "240"})
    assert result.exit_code == 0, result.output
    for flag in shown:
        assert flag in result.output
    assert "per graph call" not in result.output.replace("\n", " ")
