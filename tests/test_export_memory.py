"""The memory-bounded export (issue 30), with real files: a sharded bf16 checkpoint as 4B-8B
models ship, built here at small widths, exported by :func:`kvembed.export.core.export_result`.

What the exporter promises, checked as it happens: the PyTorch reference runs the gate's texts
before the trace, the PyTorch weights are gone before any onnxruntime session is built, the trace
and every conversion keep the weights in external data (written one tensor at a time), the
artifact's layout follows the size threshold, and the manifest names the checkpoint's dtype.
Numbers are checked against the independent oracle. No timings, no RSS.
"""

from __future__ import annotations

import gc
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import numpy_helper
from onnx.external_data_helper import uses_external_data

from checks import assert_matches_oracle
from conftest import tiny_config
from kvembed.artifact import external_data
from kvembed.export import core
from kvembed.export.graph import rewrites
from kvembed.export.gate import verification
from kvembed.export.core import Exporter, export_result, load_embedder
from kvembed.export.graph.checks import MATRICES_PER_LAYER, weight_matmuls
from kvembed.artifact.external_data import DATA_FILE, EXTERNAL_MIN_BYTES
from kvembed.export.gate.parity import GATE_TEXTS, HELD_OUT_TEXTS, gate_batches
from kvembed.export.progress import STAGES
from kvembed.methods import demo_model_path
from kvembed.runtime import Embedder

TEXTS = ["A man is playing a guitar.", "", "Ünïcödé café — 東京 🤖", "What is the capital of France?"]
METHOD = "kv-embedding"
OPTIONS = {"layers": "1-2"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sharded_bf16(tmp_path_factory) -> Path:
    """A tiny random Qwen3 saved as real checkpoints ship: bf16 safetensors shards and
    ``model.safetensors.index.json`` (transformers' own sharded writer)."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("sharded") / "qwen3-bf16"
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen3"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="60KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_path() / name, folder / name)
    return folder


class SessionWatch:
    """Records, each time an onnxruntime session is built during an export, whether the export's
    PyTorch model still held weights, and which CPU tensors of a weight's shape were alive."""

    def __init__(self) -> None:
        self.embedder = None
        self.shapes: set[tuple[int, ...]] = set()
        # tensors alive before this export (other tests' session-wide models share its widths)
        gc.collect()
        self.before: set[int] = {id(o) for o in gc.get_objects() if isinstance(o, torch.Tensor)}
        self.sessions: list[dict] = []
        self.events: list[str] = []

    def loaded(self, embedder) -> None:
        self.embedder = embedder
        self.shapes = {tuple(p.shape) for p in embedder.model.parameters() if p.dim() == 2}

    def session_built(self) -> None:
        if self.embedder is None:  # the fused-attention probe, before any model is loaded
            return
        gc.collect()
        live = [tuple(o.shape) for o in gc.get_objects()
                if type(o) in (torch.Tensor, torch.nn.Parameter) and not o.is_meta and _shape(o) in self.shapes
                and id(o) not in self.before]
        held = [n for n, p in self.embedder.model.named_parameters() if not p.is_meta]
        self.sessions.append({"after": self.events[-1], "parameters_held": held, "weight_tensors_alive": live})


def _shape(tensor: torch.Tensor) -> tuple[int, ...] | None:
    """A tensor's concrete shape (None for the symbolic ones torch.export leaves behind)."""
    dims = tuple(tensor.shape)
    return dims if all(isinstance(d, int) for d in dims) else None


@pytest.fixture
def watch(monkeypatch) -> SessionWatch:
    """Wraps (does not replace) the exporter's model loading and onnxruntime's session constructor."""
    return watching(monkeypatch)


def watching(monkeypatch: pytest.MonkeyPatch) -> SessionWatch:
    """A :class:`SessionWatch` wrapped around the loaders and sessions until ``monkeypatch`` undoes it."""
    seen = SessionWatch()
    real_load, real_session = core.load_embedder, onnxruntime.InferenceSession

    def load(*args, **kwargs):
        embedder = real_load(*args, **kwargs)
        seen.loaded(embedder)
        return embedder

    class WatchedSession(real_session):
        def __init__(self, *args, **kwargs):
            seen.session_built()
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(core, "load_embedder", load)
    monkeypatch.setattr(verification, "load_embedder", load)  # verify rebuilds its reference
    monkeypatch.setattr(onnxruntime, "InferenceSession", WatchedSession)
    return seen


def _export(model: Path, out: Path, precision: str, watch: SessionWatch | None = None):
    progress = (lambda stage, detail: watch.events.append(stage)) if watch is not None else None
    return export_result(str(model), METHOD, out, precision, progress=progress, **OPTIONS)


def _external_layout(directory: Path) -> dict:
    """Where each initializer of the artifact's graph lives: 'inline' or its data file."""
    model = onnx.load(str(directory / "model.onnx"), load_external_data=False)
    where = {}
    for tensor in model.graph.initializer:
        if uses_external_data(tensor):
            where[tensor.name] = {e.key: e.value for e in tensor.external_data}["location"]
        else:
            where[tensor.name] = "inline"
    return where


@pytest.fixture(scope="module")
def watched_fp32(sharded_bf16, tmp_path_factory):
    """The sharded checkpoint's fp32 export, watched: (its result, the watch). Read-only."""
    with pytest.MonkeyPatch.context() as patch:
        watch = watching(patch)
        return _export(sharded_bf16, tmp_path_factory.mktemp("watched") / "fp32", "fp32", watch), watch


def test_weights_are_released_before_any_onnxruntime_session(sharded_bf16, watched_fp32, oracle):
    result, watch = watched_fp32
    events = watch.events
    assert [s for s in STAGES if s in events] == [s for s in events if s in STAGES]  # in STAGES' order
    assert events.index("reference") < events.index("trace") < events.index("release") < events.index("optimize")
    # offline optimisation and the gate's session at least, each built with no weights left in PyTorch
    after = [s["after"] for s in watch.sessions]
    assert "optimize" in after and "parity" in after, after
    for session in watch.sessions:
        assert session["parameters_held"] == [], session
        assert session["weight_tensors_alive"] == [], session
    assert result.parity.passed
    artifact = Embedder.load(result.path)
    assert_matches_oracle(lambda t, k: artifact.encode(t, kind=k), oracle(sharded_bf16), METHOD, TEXTS, "fp32",
                          what="sharded bf16 export", **OPTIONS)


def test_verify_frees_the_reference_before_opening_the_artifact(watched_fp32, watch):
    """kvembed verify rebuilds the PyTorch reference: like the export, it runs the gate's texts
    first and frees the weights before onnxruntime opens the artifact (never both in memory)."""
    artifact = watched_fp32[0].path
    result = verification.verify(artifact, progress=lambda stage, detail: watch.events.append(stage))
    assert result.passed, result.report
    assert watch.events.index("reference") < watch.events.index("parity")
    assert [s["after"] for s in watch.sessions] == ["parity"]
    assert watch.sessions[0]["parameters_held"] == [] and watch.sessions[0]["weight_tensors_alive"] == []


class StageSteps:
    """A progress display with ``advance``: records each stage's (done, total) reports."""

    def __init__(self) -> None:
        self.stage = ""
        self.steps: dict[str, list[tuple[int, int]]] = {}

    def __call__(self, stage: str, detail: str) -> None:
        self.stage = stage

    def advance(self, done: int, total: int) -> None:
        self.steps.setdefault(self.stage, []).append((done, total))


@pytest.fixture(scope="module")
def fp16_export(sharded_bf16, tmp_path_factory):
    """The sharded checkpoint's fp16 export at the default external-data threshold, with the
    progress display that saw it: (its result, the display). Read-only."""
    display = StageSteps()
    out = tmp_path_factory.mktemp("fp16") / "fp16"
    return export_result(str(sharded_bf16), METHOD, out, "fp16", progress=display, **OPTIONS), display


def test_manifest_names_the_checkpoint_dtype(sharded_bf16, fp16_export):
    index = json.loads((sharded_bf16 / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    result, display = fp16_export
    # the long stages report their share done (the CLI turns it into the time left), up to all of it
    batches = {"reference": len(gate_batches({**GATE_TEXTS, **HELD_OUT_TEXTS})), "parity": len(gate_batches(GATE_TEXTS))}
    # an advisory check that runs (OpenVINO f16 where this CPU has FP16, else bf16 where it has BF16)
    # runs the gate's batches once more; at most one of them runs unless f16 misses
    advisory = result.manifest.raw["parity"].get("advisory", {})
    assert set(advisory) == {"openvino-f16", "openvino-bf16"}
    runs = {"reference": 1, "parity": 1 + sum("skipped" not in checked for checked in advisory.values())}
    for stage in ("reference", "parity"):
        steps = display.steps[stage]
        # one per padded batch of the gate (the reference runs the held-out batches too, in the same
        # stage: one per held-out group, short, medium and cut)
        assert batches[stage] == {"reference": 13, "parity": 10}[stage] and len(steps) == batches[stage] * runs[stage]
        for run in range(runs[stage]):
            part = steps[run * batches[stage]:(run + 1) * batches[stage]]
            assert [d for d, _ in part] == sorted(d for d, _ in part) and part[-1][0] == part[-1][1] > 0
    # the fp16 conversion: one step per weight tensor of the graph, up to all of them
    tensors = len(onnx.load(str(result.path / "model.onnx"), load_external_data=False).graph.initializer)
    assert display.steps["convert"] == [(done, tensors) for done in range(1, tensors + 1)]
    assert result.manifest.raw["source"]["dtype"] == "bfloat16"
    assert result.manifest.raw["source"]["location"] == str(sharded_bf16.resolve())
    assert result.parity.passed and result.manifest.raw["precision"] == "fp16"


def test_small_artifacts_keep_their_weights_inline(fp16_export):
    """Below the threshold the artifact is one file, though the exporter works in external data.
    (int8 keeps its weights in model.onnx.data at every size: its OpenVINO graph reads the same
    bytes; tests/test_int8_openvino.py.)"""
    result = fp16_export[0]
    assert not (result.path / DATA_FILE).exists()
    assert set(_external_layout(result.path).values()) == {"inline"}
    assert result.manifest.raw["graph"]["external_data"] is False
    assert result.manifest.raw["graph"]["precision_conversion"]["external_data"] is False
    assert result.parity.passed


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_large_artifacts_keep_every_weight_in_one_data_file(sharded_bf16, tmp_path, monkeypatch, oracle, precision):
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_THRESHOLD", 1024)
    result = _export(sharded_bf16, tmp_path / precision, precision)
    layout = _external_layout(result.path)
    model = onnx.load(str(result.path / "model.onnx"), load_external_data=False)
    sizes = {t.name: _stored_bytes(t) for t in model.graph.initializer}
    assert {layout[n] for n, size in sizes.items() if size >= EXTERNAL_MIN_BYTES} == {DATA_FILE}
    assert all(layout[n] == "inline" for n, size in sizes.items() if size < EXTERNAL_MIN_BYTES)
    assert set(result.manifest.raw["files"]) >= {"model.onnx", DATA_FILE, "tokenizer.json"}
    assert result.manifest.raw["graph"]["external_data"] is True
    artifact = Embedder.load(result.path)
    assert_matches_oracle(lambda t, k: artifact.encode(t, kind=k), oracle(sharded_bf16), METHOD, TEXTS, precision,
                          what=f"external {precision}", **OPTIONS)


def _stored_bytes(tensor) -> int:
    if uses_external_data(tensor):
        return int({e.key: e.value for e in tensor.external_data}["length"])
    return len(tensor.raw_data)


def test_trace_writes_weights_external_and_transposed(sharded_bf16):
    """The traced graph's weights go to its data file as MatMul's B (no Transpose left on a
    weight), all 7 matrices of every layer the method needs."""
    embedder = load_embedder(str(sharded_bf16), METHOD, **OPTIONS)
    with Exporter(embedder) as exporter:
        path = exporter.trace()
        assert path.with_name(path.name + ".data").stat().st_size > 0
        model = onnx.load(str(path), load_external_data=False)
        initializers = {t.name for t in model.graph.initializer}
        assert not [n for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in initializers]
        assert weight_matmuls(model) == MATRICES_PER_LAYER * embedder.model.layers_needed
        # the stored B of q_proj in layer 0 is the checkpoint's weight transposed, exactly
        full = onnx.load(str(path))
        stored = [numpy_helper.to_array(t) for t in full.graph.initializer]
        q = embedder.model.decoder.layers[0].self_attn.q_proj.weight.detach().numpy()
        assert any(a.shape == q.T.shape and np.array_equal(a, q.T) for a in stored)
    assert exporter.weights_released is False  # only export_result frees the weights


def test_offline_optimisation_never_rewrites_the_weights():
    """onnxruntime's offline pass sees the weights as graph inputs: the traced graph's data file is
    the same file afterwards (same inode, bytes and modification time), every weight still points
    into it, nothing is left beside it, and the optimised graph computes what the traced one did.
    (The demo model's traced graph has a node onnxruntime removes; the tiny Qwen3's has none.)"""
    embedder = load_embedder(str(demo_model_path()), METHOD, padding_side="right")
    with Exporter(embedder, optimize=False) as exporter:
        path = exporter.trace()
        data = path.with_name(path.name + ".data")
        before = data.stat()
        content = data.read_bytes()
        traced = path.with_name("traced.onnx")
        shutil.copy(path, traced)
        layout = {t.name: {e.key: e.value for e in t.external_data}
                  for t in onnx.load(str(path), load_external_data=False).graph.initializer if uses_external_data(t)}
        assert layout
        record = rewrites.optimize_with_onnxruntime(path)
        assert record["applied"] and record["nodes_after"] < record["nodes_before"], record
        after = data.stat()
        assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
        assert data.read_bytes() == content
        optimized = onnx.load(str(path), load_external_data=False)
        assert len(optimized.graph.node) == record["nodes_after"]
        assert [i.name for i in optimized.graph.input] == ["input_ids", "attention_mask"]
        assert {t.name: {e.key: e.value for e in t.external_data}
                for t in optimized.graph.initializer if uses_external_data(t)} == layout
        assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, data.name, traced.name])
        ids = np.array([[5, 17, 42, 99, 3, 0], [7, 8, 9, 0, 0, 0]], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}
        run = [onnxruntime.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds) for p in (traced, path)]
        for old, new in zip(*run):
            np.testing.assert_allclose(new, old, rtol=1e-5, atol=1e-6)


def test_bf16_checkpoint_loads_to_the_same_float32_model(sharded_bf16):
    """Loading in bf16 and casting (no shards mapped beside the float32 model) gives exactly the
    parameters and buffers of transformers' own float32 load."""
    from transformers import AutoModel

    from kvembed.modeling.hf_loading import find_model

    found = find_model(str(sharded_bf16))
    assert found.stored_dtype == "bfloat16"
    _, ours = found.load(torch.float32)
    theirs = AutoModel.from_pretrained(str(sharded_bf16), dtype=torch.float32)
    mine, want = dict(ours.state_dict(keep_vars=True)), dict(theirs.state_dict(keep_vars=True))
    mine.update(dict(ours.named_buffers()))
    want.update(dict(theirs.named_buffers()))
    assert mine.keys() == want.keys()
    for name, tensor in want.items():
        assert mine[name].dtype == torch.float32 and torch.equal(mine[name], tensor), name
    assert ours.config.dtype == torch.float32
