"""The exporter (issue 3): every method to ONNX, the parity gate, precisions, artifacts, CLI.

Real components only: the stories260k demo model and conftest's tiny random Llama/Qwen3/Qwen2/
Mistral models (random norm weights and biases, Mistral beyond its sliding window), torch.onnx
(dynamo), onnxruntime. Each (model, method) is traced once per session (conftest's ``traces``)
and written at several precisions from that one trace, to keep this file fast.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import transformers

from conftest import HANG_GUARD_S
from checks import MAX_ABS_FP32, MIN_COSINE, assert_matches_oracle, assert_same
from kvembed.export import ALLOWED_OPS, non_portable_ops, op_types, read_manifest
from kvembed.runtime import Embedder
from kvembed.artifact import REQUIRED_KEYS, sha256_file
from kvembed.export.graph.checks import MATRICES_PER_LAYER, decoder_layers_in_graph, weight_matmuls
from kvembed.artifact.staging import LeftoverWarning, claimed_workdir
from kvembed.export.core import OutputExistsError, ParityError, export
from kvembed.export.gate.verification import verify
from kvembed.methods import ResolvedMethod, demo_model_path

STORIES = "stories260k"
TEXTS = ["A man is playing a guitar.", "", "Ünïcödé café — 東京 🤖", "What is the capital of France?"]
#: every training-free method; causal2vec needs a checkpoint (tests/test_causal2vec.py)
METHODS = ("kv-embedding", "va", "aligned-wva", "token-prepending", "last-token", "mean", "prompteol", "echo")


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine spinning
    OpenMP threads multiply tracing time; restored after this module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)



def _save_with_tokenizer(model_or_config, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model_or_config.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_path() / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def stories_kv(traces, stories_artifact):
    """The stories260k kv-embedding exporter, traced, and its fp32 artifact (shared, read-only).

    Traced here, into the system's temp folder: an exporter's first write traces beside its output
    and keeps that trace folder for later writes, so a test whose write came first would find the
    shared trace in its own folder (whichever pytest-xdist worker made the shared artifact)."""
    exporter = traces.get(STORIES, "kv-embedding")
    exporter.trace()
    return exporter, stories_artifact("kv-embedding")


# -- helpers ------------------------------------------------------------------------------------


def _check_artifact(out: Path, embedder, precision: str) -> dict:
    """Everything an artifact must satisfy, checked independently of the exporter's own gate."""
    manifest = json.loads((out / "kvembed.json").read_text())
    for key in REQUIRED_KEYS:
        assert key in manifest, key
    assert manifest["schema_version"] == 1
    assert manifest["precision"] == precision
    assert manifest["dim"] == embedder.dim
    assert manifest["max_length"] == embedder.max_length
    assert manifest["opset"] >= 18
    assert manifest["method"] == embedder.method.to_dict()
    assert ResolvedMethod.from_dict(manifest["method"]) == embedder.method
    assert manifest["placeholder_id"] == embedder.encoder.placeholder_id
    assert manifest["pad_id"] == embedder.encoder.pad_id and manifest["fallback_id"] == embedder.encoder.fallback_id
    assert len(manifest["source"]["config_sha256"]) == 64
    # hashes of every file
    on_disk = sorted(p.name for p in out.iterdir() if p.name != "kvembed.json")
    assert sorted(manifest["files"]) == on_disk
    for name, record in manifest["files"].items():
        assert sha256_file(out / name) == record["sha256"]
        assert (out / name).stat().st_size == record["bytes"]
    # the recorded parity passed METHODS.md's tolerances
    parity = manifest["parity"]
    assert parity["passed"] and parity["worst_cosine"] >= MIN_COSINE[precision]
    if precision == "fp32":
        assert parity["max_abs_diff"] <= MAX_ABS_FP32
    assert parity["rows"] >= 40
    # the graph: signature, dynamic axes, layers, portable ops
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    inputs = ["input_ids", "attention_mask"] + (["pool_mask"] if embedder.method.uses_pool_mask else [])
    assert [i.name for i in model.graph.input] == inputs
    for value in model.graph.input:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in value.type.tensor_type.shape.dim] == ["batch", "sequence"]
    assert [o.name for o in model.graph.output] == ["embedding", "pooled"]
    for value in model.graph.output:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        dims = value.type.tensor_type.shape.dim
        assert dims[0].dim_param == "batch" and dims[1].dim_value == embedder.dim
    assert decoder_layers_in_graph(model, per_layer=embedder.model.architecture.weight_matrices) == embedder.method.layers_needed
    if precision in ("fp32", "fp16"):
        assert non_portable_ops(model) == [], op_types(model)
        assert manifest["graph"]["tensorrt_ready"]
    # reload without the exporter and embed like the reference
    artifact = Embedder.load(out, provider="cpu")
    for kind in ("query", "document"):
        assert_same(artifact.encode(TEXTS, kind), embedder.encode(TEXTS, kind), precision, f"{precision} {kind}")
    return manifest


def _no_partial_dirs(parent: Path) -> bool:
    return not [p for p in parent.iterdir() if ".partial-" in p.name or p.name.startswith(".kvembed-trace-")]


# -- every method, every architecture, every precision --------------------------------------------

#: va reads layers 1-2 of 5, so its graph must stop after layer 2 (see the layer-count test)
STORIES_OPTIONS = {"va": {"layers": "1-2"}}
STORIES_CASES = [(method, "fp32") for method in METHODS] + [
    ("kv-embedding", "fp16"), ("va", "fp16"), ("token-prepending", "fp16"), ("echo", "fp16"),
    ("kv-embedding", "int8"), ("aligned-wva", "int8"), ("prompteol", "int8"),
]


@pytest.mark.parametrize("method,precision", STORIES_CASES)
def test_stories260k(traces, stories_artifact, method, precision):
    """The session's shared demo-model artifacts (other files reuse them), checked in full."""
    options = STORIES_OPTIONS.get(method, {})
    path = stories_artifact(method, precision, **options)
    manifest = _check_artifact(path, traces.get(STORIES, method, **options).embedder, precision)
    if precision == "int8":
        from kvembed.export.precision.convert import INT8_RECIPES

        recipe = INT8_RECIPES[manifest["graph"]["precision_conversion"]["recipe"]]
        ops = set(manifest["graph"]["op_types"])
        if recipe.block:  # weight-only: int8 weights dequantised in blocks before float MatMuls
            assert "DequantizeLinear" in ops and not {"MatMulInteger", "DynamicQuantizeLinear"} & ops
        else:  # per-token recipes quantise activations with element-wise ops, per-tensor ones with DynamicQuantizeLinear
            assert {"MatMulInteger", "ReduceMax" if recipe.per_row else "DynamicQuantizeLinear"} <= ops
        assert not manifest["graph"]["tensorrt_ready"]
    if precision == "fp16":
        weights = [t for t in onnx.load(str(path / "model.onnx")).graph.initializer if len(t.dims) == 2]
        assert weights and all(t.data_type == onnx.TensorProto.FLOAT16 for t in weights)


#: kv-embedding everywhere (its attention patch meets q/k norms, q/k/v biases, GQA); the readouts
#: that hook into layers (residual rewiring, attention output) on the non-Llama architectures;
#: qwen3 also runs the non-default prefix options, granite its multipliers (the attention scale is not
#: 1/sqrt(d)) and olmo2 its whole-projection q/k norms, each under a zero-rotated prefix; phi3 the
#: values read out of its fused qkv_proj; stablelm its biased LayerNorms (LayerNormalization in the
#: graph) under a zero-rotated prefix turned back on its quarter of each head; cohere its parallel
#: sublayers under zero-rotated prefixes turned back pair by pair (its interleaved RoPE); gemma2 its
#: soft-capped eager attention (tanh in the graph, the prefix's bias after the cap) on sliding and
#: global layers, also at fp16 (OpenVINO's advisory check included). stories260k covers every
#: method on Llama.
RANDOM_CASES = [
    ("llama", "kv-embedding", {}),
    ("qwen2", "kv-embedding", {}),
    ("mistral", "kv-embedding", {}),
    ("qwen3", "kv-embedding", {"num_prefix": 2, "prefix_rope": "zero", "bias": 2.0}),
    ("qwen3", "token-prepending", {"tp_start": 0}),
    ("qwen2", "aligned-wva", {"wva": True, "layers": "0"}),
    ("granite", "kv-embedding", {"num_prefix": 2, "prefix_rope": "zero"}),
    ("olmo2", "kv-embedding", {"prefix_rope": "zero"}),
    ("phi3", "va", {"layers": "1,3"}),
    ("stablelm", "kv-embedding", {"prefix_rope": "zero"}),
    ("cohere", "kv-embedding", {"prefix_rope": "zero", "num_prefix": 2}),
    ("gemma2", "kv-embedding", {"prefix_rope": "zero", "num_prefix": 2}),
]


@pytest.mark.parametrize("arch,method,options", RANDOM_CASES, ids=[f"{a}-{m}" for a, m, _ in RANDOM_CASES])
def test_tiny_random_models(traces, tiny_models, oracle, tmp_path, arch, method, options):
    """Each architecture's graph against the PyTorch reference and against the oracle."""
    exporter = traces.get(tiny_models[arch], method, **options)
    result = exporter.write(tmp_path / "fp32", "fp32")
    manifest = _check_artifact(result.path, exporter.embedder, "fp32")
    assert manifest["source"]["model_type"] == arch
    runtime = Embedder.load(result.path, provider="cpu")
    assert_matches_oracle(runtime.encode, oracle(arch), method, TEXTS, what=arch, **options)
    if arch in ("qwen3", "gemma2"):  # one reduced precision per trace is cheap: the trace is cached
        result = exporter.write(tmp_path / "fp16", "fp16")
        _check_artifact(result.path, exporter.embedder, "fp16")


# -- graph properties -----------------------------------------------------------------------------


def test_only_needed_layers_are_in_the_graph(traces, stories_artifact):
    """Early exit: va on layers 1-2 keeps layers 0..2 (of 5), and only v_proj of layer 2."""
    exporter = traces.get(STORIES, "va", **STORIES_OPTIONS["va"])
    path = stories_artifact("va", **STORIES_OPTIONS["va"])
    model = onnx.load(str(path / "model.onnx"))
    config = exporter.embedder.model.decoder.config
    kv_shape = [config.hidden_size, config.num_key_value_heads * config.head_dim]  # k_proj/v_proj, transposed
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    kv_matmuls = [n for n in model.graph.node if n.op_type == "MatMul" and shapes.get(n.input[1]) == kv_shape]
    assert len(kv_matmuls) == 2 + 2 + 1  # k, v of layers 0 and 1; v of layer 2
    assert weight_matmuls(model) == 2 * MATRICES_PER_LAYER + 1
    assert decoder_layers_in_graph(model) == 3 == read_manifest(path)["graph"]["decoder_layers"]
    # token-prepending exits at its exit layer (default L - 1 = 4): layers 0..3, all complete
    tp_model = onnx.load(str(stories_artifact("token-prepending") / "model.onnx"))
    assert weight_matmuls(tp_model) == 4 * MATRICES_PER_LAYER


def test_graph_ops_are_tensorrt_portable(stories_kv):
    """The op types of the kv-embedding graph, against the allow-list from onnx-tensorrt's
    operators.md (If/Loop/Scan/ScatterND excluded): standard domain only."""
    _, out = stories_kv
    model = onnx.load(str(out / "model.onnx"))
    ops = op_types(model)
    assert not {"If", "Loop", "Scan", "ScatterND"} & set(ops)
    assert all(node.domain in ("", "ai.onnx") for node in model.graph.node)
    assert set(ops) <= ALLOWED_OPS, sorted(set(ops) - ALLOWED_OPS)
    attention = "Attention" if read_manifest(out)["graph"]["attention"]["form"] == "fused" else "Softmax"
    assert {"MatMul", attention, "GatherElements", "ReduceL2"} <= set(ops)  # attention, prefix gather, L2 norm
    used = {o.domain for o in model.opset_import}
    assert used <= {"", "ai.onnx"}, used


def test_dynamic_axes_and_padding_sides(stories_kv):
    """Batch and sequence sizes unlike the trace example's (2 rows); right and left padding give
    the same embeddings as each text alone through PyTorch."""
    exporter, out = stories_kv
    artifact = Embedder.load(out, provider="cpu", verify=False)
    embedder = exporter.embedder
    texts = ["x", "a somewhat longer sentence about cats " * 6, "mid length text", "", "🤖", "one two three four"]
    alone = np.stack([embedder.encode([t], "query")[0] for t in texts])
    for size in (1, 3, 6):
        for side in ("right", "left"):
            encoded = artifact.encoder.encode(texts[:size], "query")
            batch = artifact.encoder.pad(encoded, side)
            embedding, pooled = artifact.run(batch)
            assert embedding.shape == (size, embedder.dim) and pooled.shape == (size, embedder.dim)
            assert_same(embedding, alone[:size], what=f"{size} rows, {side} padding")
            assert np.allclose(np.linalg.norm(embedding, axis=-1), 1.0, atol=1e-5)


def test_token_prepending_placeholder_is_derived_in_graph(stories_artifact):
    path = stories_artifact("token-prepending")
    manifest = read_manifest(path)
    assert [i["name"] for i in manifest["inputs"]] == ["input_ids", "attention_mask"]
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert added["<PST>"] == manifest["placeholder_id"] is not None


# -- the parity gate --------------------------------------------------------------------------------


def test_parity_gate_rejects_a_wrong_graph(stories_kv, tmp_path):
    """Graph exported with R = 1-3, reference built with R = {2}: the gate must fail, write nothing."""
    exporter, _ = stories_kv
    assert exporter.embedder.method.layers == (1, 2, 3)
    out = tmp_path / "wrong"
    with pytest.raises(ParityError) as info:
        exporter.write(out, "fp32", reference_options={"layers": "2"})
    report = info.value.report
    assert not report.passed and report.worst_cosine < MIN_COSINE["fp32"]
    assert "parity FAILED" in str(info.value)
    assert not out.exists()
    assert _no_partial_dirs(tmp_path)


def test_interrupted_write_leaves_no_artifact(stories_kv, tmp_path):
    exporter, _ = stories_kv

    def interrupt(stage: str, detail: str) -> None:
        if stage == "parity":  # model.onnx and tokenizer.json are written by now
            raise KeyboardInterrupt

    exporter.progress = interrupt
    try:
        out = tmp_path / "fresh"
        with pytest.raises(KeyboardInterrupt):
            exporter.write(out, "fp32")
        assert not out.exists()
        # an existing artifact replaced with --force survives an interrupted replacement
        old = tmp_path / "old"
        old.mkdir()
        (old / "keep.txt").write_text("previous content")
        with pytest.raises(KeyboardInterrupt):
            exporter.write(old, "fp16", force=True)
        assert sorted(p.name for p in old.iterdir()) == ["keep.txt"]
        assert _no_partial_dirs(tmp_path)
    finally:
        exporter.progress = lambda stage, detail: None


def _export_until_trace(out: Path) -> tuple[subprocess.Popen, list[str]]:
    """A real ``kvembed export`` of stories260k into ``out``, read until its trace has started (its
    staging and trace directories made, torch.onnx running); the process and its stage lines."""
    process = subprocess.Popen([sys.executable, "-m", "kvembed.cli", "export", "--model", "stories260k", "--method", "mean",
                                "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "KVEMBED_STATUS_AFTER": "0"})  # each stage says when it starts
    seen = []
    for line in process.stderr:  # stage lines, one each when stderr is not a terminal
        seen.append(line)
        if line.startswith("trace:"):
            return process, seen
    process.wait(HANG_GUARD_S)
    pytest.fail(f"the export ended before its trace: {''.join(seen)}")


def test_cli_export_stopped_by_sigterm_cleans_up_and_dies_by_it(tmp_path):
    """``timeout``, schedulers and ``docker stop`` send SIGTERM: the export takes it like Ctrl-C (its
    staging directory and traced graph, several times the model's size, removed), says so in one
    line, and ends by SIGTERM itself."""
    out = tmp_path / "artifact"
    process, seen = _export_until_trace(out)
    process.send_signal(signal.SIGTERM)
    stderr = "".join(seen) + process.stderr.read()
    process.wait(HANG_GUARD_S)
    assert process.returncode == -signal.SIGTERM, stderr
    assert "error: interrupted (SIGTERM)" in stderr and "Traceback" not in stderr
    assert not out.exists() and _no_partial_dirs(tmp_path), sorted(p.name for p in tmp_path.iterdir())


def test_what_a_killed_export_left_is_named_by_the_next_and_a_live_writers_is_not(tmp_path):
    """SIGKILL (the out-of-memory killer) leaves no chance to clean up: the next ``kvembed export``
    into the same folder names what was left, with its size, and deletes nothing; the directories
    of a writer still running there (its lock held, here by this process) and of another output are
    not named."""
    out = tmp_path / "artifact"
    process, _ = _export_until_trace(out)
    process.kill()
    process.stderr.read()
    process.wait(HANG_GUARD_S)
    killed = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert [p.name[:len(".kvembed-trace-")] for p in killed] == [".artifact.parti", ".kvembed-trace-"]
    (killed[1] / "model.onnx.data").write_bytes(b"\0" * 2_500_000)  # what a trace had written by then
    size = sum(f.stat().st_size for d in killed for f in d.rglob("*") if f.is_file())
    other = tmp_path / ".other.partial-dead"  # another output's leftover, its lock free: not this export's to name
    other.mkdir()
    (tmp_path / ".other.partial-dead.lock").touch()
    with claimed_workdir(tmp_path, ".kvembed-trace-") as live:
        (live / "model.onnx").write_bytes(b"\0" * 1000)
        # the next export warns, then goes on: stopped once tracing (SIGTERM: it cleans up its own)
        process, seen = _export_until_trace(out)
        process.send_signal(signal.SIGTERM)
        stderr = "".join(seen) + process.stderr.read()
        process.wait(HANG_GUARD_S)
        assert process.returncode == -signal.SIGTERM, stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert line == (f"warning: {size / 1e6:.1f} MB beside {str(out)!r} left by a run killed before it could clean up "
                    f"(no process holds its lock): {killed[0]}, {killed[1]}; delete them and their .lock files")
    assert str(live) not in line and str(other) not in line
    assert all(p.is_dir() for p in killed)  # nothing deleted
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))  # its own and the live ones' gone
    assert left == sorted([".other.partial-dead", ".other.partial-dead.lock"] + [p.name + s for p in killed for s in ("", ".lock")])


def test_force_replaces_and_refuses_without(stories_kv, tmp_path):
    exporter, _ = stories_kv
    out = tmp_path / "busy"
    out.mkdir()
    (out / "other.txt").write_text("x")
    with pytest.raises(OutputExistsError, match="not empty"):
        exporter.write(out, "fp32")
    result = exporter.write(out, "fp32", force=True)
    assert sorted(p.name for p in result.path.iterdir()) == ["kvembed.json", "model.onnx", "tokenizer.json"]
    empty = tmp_path / "empty"
    empty.mkdir()
    exporter.write(empty, "fp32")  # an empty directory is fine without --force
    assert (empty / "kvembed.json").exists()
    assert _no_partial_dirs(tmp_path)


def test_verify_api_and_damage(stories_kv, tmp_path):
    _, out = stories_kv
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    result = verify(copy)
    assert result.passed and result.report.worst_cosine >= MIN_COSINE["fp32"]
    assert math.isclose(result.report.worst_cosine, read_manifest(copy)["parity"]["worst_cosine"], abs_tol=1e-6)
    with open(copy / "tokenizer.json", "a") as handle:
        handle.write(" ")
    damaged = verify(copy)
    assert not damaged.passed and any(p.startswith("tokenizer.json has") for p in damaged.file_problems)


# -- bad input --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gpt2_folder(tmp_path_factory) -> Path:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=512)
    return _save_with_tokenizer(config, tmp_path_factory.mktemp("gpt2") / "gpt2")


def test_bad_input_raises_user_errors(tmp_path, gpt2_folder, tiny_models):
    out = tmp_path / "out"
    with pytest.raises(FileNotFoundError):
        export(str(tmp_path / "no" / "such" / "model"), "va", out)
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "readme.txt").write_text("hello")
    with pytest.raises((FileNotFoundError, ValueError)):
        export(str(not_a_model), "va", out)
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
        export(str(gpt2_folder), "kv-embedding", out)
    with pytest.raises(ValueError, match="out of range"):
        export(STORIES, "kv-embedding", out, layers="2-9")
    with pytest.raises(ValueError, match="precision"):
        export(STORIES, "va", out, precision="int4")
    with pytest.raises(ValueError, match="opset"):
        export(STORIES, "va", out, opset=13)
    with pytest.raises(ValueError, match="unknown option"):
        export(STORIES, "va", out, bias=2.0)
    with pytest.raises(ValueError, match="would replace the model folder"):
        export(str(tiny_models["llama"]), "va", tiny_models["llama"], force=True)
    (out / "x").mkdir(parents=True)
    with pytest.raises(OutputExistsError):
        export(STORIES, "va", out)
    assert [p.name for p in out.iterdir()] == ["x"]
    assert _no_partial_dirs(tmp_path)


# -- command line -----------------------------------------------------------------------------------


def _invoke(app, args):
    from typer.testing import CliRunner

    return CliRunner().invoke(app, args)


def test_cli_export_and_verify(tiny_models, tmp_path):
    """The one-call path (load, trace, gate, commit) through ``kvembed export``, then ``kvembed verify``
    and ``kvembed export verify``."""
    from kvembed.cli.main import app as kvembed_app

    out = tmp_path / "cli-artifact"
    result = _invoke(kvembed_app, ["export", "--model", str(tiny_models["llama"]), "--method", "va", "--layers", "0",
                                   "--precision", "fp32", "--out", str(out)])
    assert result.exit_code == 0, result.output
    for word in ("model.onnx", "tokenizer.json", "kvembed.json", "passed", "trace"):
        assert word in result.output
    assert read_manifest(out)["method"]["layers"] == [0]
    assert sorted(os.listdir(tmp_path)) == ["cli-artifact"]  # no trace or staging left behind
    # verify through the main kvembed CLI
    result = _invoke(kvembed_app, ["verify", str(out)])
    assert result.exit_code == 0, result.output
    assert "verified" in result.output
    (out / "model.onnx").write_bytes(b"broken")
    for command in (["verify"], ["export", "verify"]):
        result = _invoke(kvembed_app, [*command, str(out)])
        assert result.exit_code != 0 and "FAILED" in result.output, (command, result.output)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "/no/such/model", "--method", "va"], "no model folder"),
        (["--model", STORIES, "--method", "va", "--layers", "7"], "out of range"),
        (["--model", STORIES, "--method", "nope"], "unknown method"),
        (["--model", STORIES, "--method", "va", "--precision", "fp8"], "precision"),
        (["--model", "GPT2", "--method", "va"], "unsupported architecture"),
    ],
)
def test_cli_user_errors_exit_2_without_traceback(tmp_path, gpt2_folder, args, message):
    from kvembed.cli.export import app

    args = [str(gpt2_folder) if a == "GPT2" else a for a in args]
    result = _invoke(app, args + ["--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_cli_refuses_non_empty_out(tmp_path):
    from kvembed.cli.export import app

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "file").write_text("x")
    result = _invoke(app, ["--model", STORIES, "--method", "va", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "--force" in result.output
    assert (tmp_path / "out" / "file").read_text() == "x"


def test_cli_verify_parity_failure_exits_1(stories_kv, tmp_path):
    """A failing gate is not a user error: exit code 1 and a clear message."""
    from kvembed.cli import export as cli

    _, out = stories_kv
    manifest = read_manifest(out)
    copy = tmp_path / "artifact"
    shutil.copytree(out, copy)
    # rewrite the recorded method so the rebuilt reference differs from the graph (R = {2})
    manifest["method"]["options"]["layers"] = [2]
    (copy / "kvembed.json").write_text(json.dumps(manifest))
    result = _invoke(cli.app, ["verify", str(copy)])
    assert result.exit_code == 1
    assert "FAILED" in result.output


def test_bf16_is_gated_on_openvino_because_onnxruntime_cpu_cannot_run_it():
    """Why a bf16 artifact holds the fp32 graph and is gated on OpenVINO (kvembed.export.gate.certify):
    the installed onnxruntime's CPU provider has no bf16 MatMul. If this starts failing, onnxruntime
    gained bf16 CPU kernels and a bf16-typed graph could be gated on it."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], "bf16",
        [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [2, 2]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED|Could not find an implementation"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_onnxruntime_fuses_every_rms_norm_at_load(stories_kv, tmp_path):
    """The portable file keeps standard ops; the runtime's session turns each RMSNorm (two per
    layer and the final one) into one SimplifiedLayerNormalization kernel."""
    import onnxruntime as ort

    from kvembed.backends.onnxruntime import session_options

    _, out = stories_kv
    portable = onnx.load(str(out / "model.onnx"))
    assert "SimplifiedLayerNormalization" not in op_types(portable)
    options = session_options(1)
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(out / "model.onnx"), options, providers=["CPUExecutionProvider"])
    fused = op_types(onnx.load(str(tmp_path / "optimized.onnx")))
    layers = read_manifest(out)["method"]["num_layers"]
    assert fused.get("SimplifiedLayerNormalization", 0) == 2 * layers + 1
    assert "Reciprocal" not in fused and "Pow" not in fused
