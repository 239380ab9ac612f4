"""The command line as a new user meets it: ``kvembed embed`` with an artifact or ``--model``,
one-line errors with the right exit codes, fast failures without network, files in and out.

Each test names the issue-10 item it covers. Errors are asserted on their key words, on the exit
code (2 for bad input, 1 for a failed check) and on the absence of a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvembed.cli.main import app
from kvembed.modeling.reference import TorchEmbedder
from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

runner = CliRunner()


def run(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def run_process(module: str, *args: str, env: dict[str, str] | None = None, stdin: str | None = None):
    """The real console entry point in a fresh interpreter (what a user's shell runs)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, input=stdin,
        env={**os.environ, **(env or {})}, timeout=300,
    )


@pytest.fixture(scope="module")
def kv_artifact(stories_artifact) -> Path:
    return stories_artifact("kv-embedding")


# -- the reference path (--model) ----------------------------------------------------------------


def test_embed_with_model_prints_a_table_and_the_similarity_matrix():
    result = run("embed", "--model", "stories260k", "--similarity", "A cat sat.", "A dog ran.")
    assert result.exit_code == 0, result.output
    assert "kv-embedding on stories260k: 2 x 64" in result.output
    vectors = TorchEmbedder.from_pretrained("stories260k").encode(["A cat sat.", "A dog ran."])
    # the off-diagonal entry, computed independently from the API's vectors, is printed
    assert f"{float(vectors[0] @ vectors[1]):.4f}" in result.output.split("cosine similarity")[1]


def test_embed_writes_npy_equal_to_the_api(tmp_path):
    out = tmp_path / "vectors.npy"
    args = ["embed", "--model", "stories260k", "--method", "token-prepending", "--tp-stop", "2", "--kind", "query",
            "-o", str(out), "one", "two"]
    result = run(*args)
    assert result.exit_code == 0, result.output
    expected = TorchEmbedder.from_pretrained("stories260k", "token-prepending", tp_stop=2).encode_query(["one", "two"])
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6)


# -- item 1: the artifact-vs-texts choice is explicit ---------------------------------------------


def test_a_first_argument_that_is_no_artifact_is_an_error_not_a_text(tmp_path):
    result = run("embed", "nonexistent-dir", "hello")
    assert result.exit_code == 2
    assert "not an artifact directory" in result.output and "--model" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run("embed", str(empty), "hello")
    assert result.exit_code == 2
    assert "not a kvembed artifact" in result.output and "kvembed.json" in result.output
    result = run("embed", str(tmp_path / "typo" / "artifact"), "hello")
    assert result.exit_code == 2 and "no kvembed artifact at" in result.output
    result = run("embed")
    assert result.exit_code == 2 and "ARTIFACT" in result.output


def test_model_folder_given_as_artifact_points_to_model(tmp_path):
    model = shutil.copytree(TorchEmbedder.from_pretrained("stories260k").location, tmp_path / "model")
    result = run("embed", str(model), "hello")
    assert result.exit_code == 2 and f"--model {model}" in result.output


# -- item 2: one line, exit 2 (1 for a failed check), --debug for the traceback ------------------


def test_verify_of_a_truncated_graph_fails_in_one_line(kv_artifact, tmp_path):
    damaged = shutil.copytree(kv_artifact, tmp_path / "damaged")
    graph = damaged / "model.onnx"
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    result = run("verify", str(damaged))
    assert result.exit_code == 1, result.output
    assert "model.onnx has" in result.output and "verification FAILED" in result.output
    result = run("embed", str(damaged), "x")
    assert result.exit_code == 2 and "is damaged" in result.output


@pytest.mark.parametrize("provider", ["cuda", "tensorrt"])
def test_gpu_provider_without_onnxruntime_gpu_is_one_line(kv_artifact, provider):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime-gpu is installed here")
    result = run("embed", str(kv_artifact), "--provider", provider, "x")
    assert result.exit_code == 2
    assert "kvembed[gpu]" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_graph_onnxruntime_cannot_parse_is_named(tmp_path):
    from kvembed.backends.onnxruntime import create_session

    garbage = tmp_path / "model.onnx"
    garbage.write_bytes(b"\x08\x07 this is not a protobuf" * 50)
    with pytest.raises(ValueError, match="cannot load .*model.onnx.*re-export"):
        create_session(garbage, "cpu")


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(tmp_path):
    import typer

    from kvembed.cli.support import run_guarded

    with pytest.raises(typer.Exit) as exit_info:
        run_guarded(lambda: {}["missing-key"])
    assert exit_info.value.exit_code == 1
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\n")
    plain = run_process("kvembed.cli", "embed", "--model", "stories260k", "--input", str(bad), "-o", str(tmp_path / "o.npy"))
    assert plain.returncode == 2 and "Traceback" not in plain.stderr and "bad.txt:1" in plain.stderr
    debug = run_process("kvembed.cli", "embed", "--debug", "--model", "stories260k", "--input", str(bad), "-o", str(tmp_path / "o.npy"))
    assert debug.returncode != 0 and "Traceback" in debug.stderr


@pytest.mark.parametrize(
    "module, args, words",
    [
        ("kvembed.cli", ["embed", "--no-such-flag", "x"], "No such option: --no-such-flag (see kvembed embed --help)"),
        ("kvembed.cli", ["embed", "--batch-size", "many", "x"], "'--batch-size'"),
        ("kvembed.cli", ["no-such-command"], "No such command"),
        ("kvembed.cli.export", ["--model", "stories260k"], "Missing option '--out'"),  # --method defaults
    ],
)
def test_usage_errors_are_one_line_too(module, args, words):
    """typer/click's own usage errors (unknown flag, bad value, missing option) are one line, exit 2."""
    result = run_process(module, *args)
    assert result.returncode == 2 and words in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_export_errors_are_one_line_with_exit_codes(tmp_path):
    result = run_process("kvembed.cli.export", "--model", "stories260k", "--method", "va", "--layers", "9", "--out", str(tmp_path / "a"))
    assert result.returncode == 2 and "Traceback" not in result.stderr and "valid indices are 0..4" in result.stderr


# -- item 3: no network: fail within seconds -----------------------------------------------------


@pytest.mark.parametrize(
    "module, args",
    [
        ("kvembed.cli", ["embed", "--model", "Qwen/Qwen3-0.6B", "x"]),
        ("kvembed.cli.export", ["--model", "qwen3-4b", "--method", "kv-embedding", "--out", "{tmp}/q"]),
        ("kvembed.cli", ["embed", "--model", "nonexistent-dir", "x"]),
    ],
)
def test_an_unreachable_hub_fails_fast_with_a_way_out(tmp_path, module, args):
    # a hub endpoint on loopback where nothing listens: the connection is refused at once;
    # an empty HF_HOME: nothing cached
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": ""}
    started = time.perf_counter()
    result = run_process(module, *[a.replace("{tmp}", str(tmp_path)) for a in args], env=env)
    took = time.perf_counter() - started
    print(f"\nno-network failure of {module} {args[:3]}: {took:.2f} s (process start included)")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "Retrying" not in result.stderr
    assert "cannot be reached" in result.stderr and "HF_HUB_OFFLINE" in result.stderr and "--model /path" in result.stderr


def test_offline_mode_says_so(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = run_process("kvembed.cli", "embed", "--model", "Qwen/Qwen3-0.6B", "x", env=env)
    assert result.returncode == 2 and "HF_HUB_OFFLINE is set" in result.stderr


# -- item 4: empty input: the command refuses it (issue 58), the API gives (0, dim) ------------------


def test_empty_input_file_is_refused_and_the_api_gives_zero_rows_of_the_right_width(kv_artifact, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    out = tmp_path / "e.npy"
    result = run("embed", str(kv_artifact), "--input", str(empty), "--output", str(out))
    assert result.exit_code == 2 and "is empty" in " ".join(result.output.split()), result.output
    assert not out.exists()
    dim = json.loads((kv_artifact / "kvembed.json").read_text())["dim"]
    assert Embedder.load(kv_artifact).encode([]).shape == (0, dim)


# -- item 5: method options that contradict the artifact are refused ------------------------------


def test_method_and_options_contradicting_the_artifact_are_refused(kv_artifact):
    result = run("embed", str(kv_artifact), "--method", "va", "x")
    assert result.exit_code == 2 and "computes kv-embedding" in result.output and "not 'va'" in result.output
    result = run("embed", str(kv_artifact), "--method", "kv-embedding", "x")  # agrees: fine
    assert result.exit_code == 0, result.output
    result = run("embed", str(kv_artifact), "--bias", "2", "x")
    assert result.exit_code == 2 and "--bias" in result.output and "layers=[1, 2, 3]" in result.output
    result = run("embed", str(kv_artifact), "--max-length", "8", "x")
    assert result.exit_code == 2 and "--max-length" in result.output


# -- item 6: option errors before any weights load ------------------------------------------------


@pytest.fixture
def model_with_broken_weights(tmp_path) -> Path:
    """The demo model's config and tokenizer with unreadable weights: any error that mentions the
    option, not the weights, was raised before loading them."""
    folder = shutil.copytree(TorchEmbedder.from_pretrained("stories260k").location, tmp_path / "broken")
    for weights in folder.glob("*.safetensors"):
        weights.write_bytes(b"not safetensors")
    return folder


@pytest.mark.parametrize(
    "args, words",
    [
        (["--method", "nope"], "available methods"),
        (["--method", "va", "--layers", "7"], "valid indices are 0..4"),
        (["--method", "kv-embedding", "--pooling", "max"], "pooling"),
        (["--method", "token-prepending", "--tp-start", "4", "--tp-stop", "2"], "tp_start"),
    ],
)
def test_embed_validates_options_before_loading_weights(model_with_broken_weights, args, words):
    result = run("embed", "--model", str(model_with_broken_weights), *args, "x")
    assert result.exit_code == 2 and words in result.output, result.output


def test_export_refuses_also_conflicts_before_loading_weights(model_with_broken_weights, tmp_path):
    result = run_process(
        "kvembed.cli.export", "--model", str(model_with_broken_weights), "--method", "kv-embedding", "--also", "va",
        "--out", str(tmp_path / "a"),
    )
    assert result.returncode == 2 and "prompt differs" in result.stderr, result.stderr


# -- item 7: the truncation warning is one readable line ------------------------------------------


def test_truncation_warning_is_one_line_naming_the_texts(kv_artifact):
    result = run("embed", str(kv_artifact), "short", "word " * 3000)
    assert result.exit_code == 0
    lines = [line for line in result.stderr.splitlines() if "max_length" in line]
    assert lines == [lines[0]] and lines[0].startswith("warning: 1 of 2 text(s) exceed max_length=512")
    assert "texts[1]" in lines[0] and "UserWarning" not in result.stderr and "warnings.warn" not in result.stderr


def test_truncation_in_a_stream_names_the_stream_index(kv_artifact):
    embedder = Embedder.load(kv_artifact)
    texts = ["a"] * 5 + ["word " * 3000] + ["b"] * 3
    with pytest.warns(UserWarning, match=r"texts\[5\]"):
        list(embedder.encode_stream(texts, chunk_size=4))


# -- item 9: files, stdin, ids, encodings ---------------------------------------------------------


def test_jsonl_ids_are_carried_through(kv_artifact, tmp_path):
    source = tmp_path / "in.jsonl"
    records = [{"id": "doc-1", "text": "hello"}, {"id": 7, "text": "world"}, {"text": "no id"}]
    source.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    result = run("embed", str(kv_artifact), "--input", str(source), "--output", str(out))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [row.get("id") for row in rows] == ["doc-1", 7, None]
    expected = Embedder.load(kv_artifact).encode([r["text"] for r in records])
    np.testing.assert_allclose(np.array([row["embedding"] for row in rows]), expected, atol=1e-6)


def test_stdin_input(kv_artifact, tmp_path):
    out = tmp_path / "stdin.npy"
    result = run_process("kvembed.cli", "embed", str(kv_artifact), "--input", "-", "--output", str(out), stdin="one\ntwo\n")
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(out), Embedder.load(kv_artifact).encode(["one", "two"]), atol=1e-6)
    result = run("embed", str(kv_artifact), "--input", "-")
    assert result.exit_code == 2 and "needs --output" in result.output


def test_undecodable_input_names_file_and_line_before_any_progress(kv_artifact, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("fine\ncaf\xe9\n".encode("latin-1"))
    result = run("embed", str(kv_artifact), "--input", str(bad), "--output", str(tmp_path / "x.npy"))
    assert result.exit_code == 2 and "latin1.txt:2 is not valid UTF-8" in result.output
    assert not (tmp_path / "x.npy").exists()
    result = run("embed", str(kv_artifact), "--input", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "x.npy"))
    assert result.exit_code == 2 and "no input file" in result.output and "embedding" not in result.output


def test_input_without_output_says_where_it_wrote(kv_artifact, tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("a\nb\n", encoding="utf-8")
    result = run("embed", str(kv_artifact), "--input", str(source))
    assert result.exit_code == 0
    assert f"writing {tmp_path / 'texts.npy'}" in result.stderr and np.load(tmp_path / "texts.npy").shape[0] == 2


def test_mteb_encoder_accepts_a_plain_list(kv_artifact):
    from kvembed.runtime.mteb import MTEBEncoder

    embedder = Embedder.load(kv_artifact)
    encoder = MTEBEncoder(embedder)
    np.testing.assert_allclose(encoder.encode(["hello world", "x"]), embedder.encode(["hello world", "x"]), atol=1e-6)
    np.testing.assert_allclose(encoder.encode([{"text": ["hello world", "x"]}]), embedder.encode(["hello world", "x"]), atol=1e-6)


def test_bf16_without_bf16_cpu_is_refused_in_one_line(monkeypatch):
    """On a CPU without BF16 (stated by KVEMBED_CPU_FEATURES) the bf16 gate cannot run bf16: refused
    before any work, naming the way out; --certify-emulated is for bf16 only."""
    from kvembed.export.gate.certify import check_gate_here

    monkeypatch.setenv("KVEMBED_CPU_FEATURES", "avx2,avx512f")
    with pytest.raises(ValueError, match="no BF16") as caught:
        check_gate_here("bf16")
    assert "--certify-emulated" in str(caught.value) and "\n" not in str(caught.value)
    check_gate_here("bf16", certify_emulated=True)
    with pytest.raises(ValueError, match="bf16 only"):
        check_gate_here("fp32", certify_emulated=True)


def test_readme_points_at_method_definitions_inside_the_repository():
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert "../shared" not in readme and "docs/methods.md" in readme
    methods = (root / "docs" / "methods.md").read_text(encoding="utf-8")
    assert all(f"## {name}" in methods for name in ("kv-embedding", "va", "aligned-wva", "token-prepending", "causal2vec"))
    assert "/artifacts/" in (root / ".gitignore").read_text(encoding="utf-8").splitlines()


# -- item 8: noisy benchmark cells are flagged ----------------------------------------------------


def test_bench_flags_cells_whose_repeats_disagree():
    from kvembed.bench.measure import NOISY_CV, Timing
    from kvembed.bench.report import noisy_note

    steady = Timing((0.0100, 0.0101, 0.0099, 0.0100), batch_size=1, real_tokens=10)
    jumpy = Timing((0.010, 0.030, 0.010, 0.011), batch_size=1, real_tokens=10)
    samples = np.array(jumpy.samples)
    assert jumpy.cv == pytest.approx(samples.std() / samples.mean()) and jumpy.cv > NOISY_CV == 0.25
    assert not steady.noisy and jumpy.noisy
    note = noisy_note([steady.to_dict(), jumpy.to_dict()])
    assert note is not None and note.startswith("1 of 2 cells are noisy")
    assert noisy_note([steady.to_dict()]) is None
