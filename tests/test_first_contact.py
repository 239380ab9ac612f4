"""A new user's first commands (issue 58), through the real console scripts in fresh processes:
``kvembed-export --model qwen3-4b --out X`` as typed (the default method, and on a machine that
cannot reach the hub, an error of at most three short lines saying what failed and the fixes), a
mistyped method, model alias, provider or precision answered with ``did you mean ...?``, and an
empty input refused in one line naming the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvembed.errors import LINE_WIDTH, MAX_LINES
from kvembed.modeling.sources import hub_unreachable

BIN = Path(sys.executable).parent
#: a hub endpoint on loopback where nothing listens (refused at once)
REFUSED_HUB = "http://127.0.0.1:9"


def script(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The console script ``name`` (``kvembed``, ``kvembed-export``) as a user's shell runs it."""
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    """stderr's lines of a user error (exit 2, no traceback)."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result.stderr.strip().splitlines()


def one_line(result: subprocess.CompletedProcess, *words: str) -> str:
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_hub(tmp_path) -> dict[str, str]:
    """The network as it is (this machine reaches no hub), an empty hub cache, HF_HUB_OFFLINE unset;
    where the hub is reachable after all, a refused endpoint, so that no test downloads a model."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": ""}
    if hub_unreachable() is None:
        env["HF_ENDPOINT"] = REFUSED_HUB
    return env


@pytest.fixture(scope="module")
def default_export(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """``kvembed-export --model stories260k --out X``: no ``--method``."""
    out = tmp_path_factory.mktemp("first") / "stories"
    return out, script("kvembed-export", "--model", "stories260k", "--out", str(out))


# -- item 1: kvembed-export --model qwen3-4b --out X ------------------------------------------------


def test_export_as_typed_without_the_hub_fails_in_three_short_lines(no_hub, tmp_path):
    result = script("kvembed-export", "--model", "qwen3-4b", "--out", str(tmp_path / "q"), env=no_hub)
    lines = error_lines(result)
    assert len(lines) <= MAX_LINES and all(len(line) <= LINE_WIDTH for line in lines), result.stderr
    said = result.stderr
    assert "Missing option" not in said  # --method defaults
    assert lines[0].startswith("error: 'qwen3-4b' (Qwen/Qwen3-4B)") and "cannot be reached" in lines[0]
    assert "--model /path" in said and ".gguf" in said and "HF_HUB_OFFLINE=1" in said, said
    assert not (tmp_path / "q").exists()


def test_with_hf_hub_offline_set_the_fix_says_so_too(tmp_path):
    result = script("kvembed", "embed", "--model", "qwen3-4b", "x", env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    lines = error_lines(result)
    assert len(lines) <= MAX_LINES and all(len(line) <= LINE_WIDTH for line in lines), result.stderr
    assert "HF_HUB_OFFLINE is set" in lines[0] and "--model /path" in result.stderr


def test_export_defaults_to_kv_embedding_and_says_how_to_choose_another(default_export):
    out, result = default_export
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((out / "kvembed.json").read_text(encoding="utf-8"))
    assert manifest["method"]["name"] == "kv-embedding"
    said = " ".join(result.stdout.split())
    assert "kvembed-export kv-embedding on stories260k" in said
    assert "method: kv-embedding (the default; --method chooses another: va," in said
    assert "kvembed export --help" in said


def test_export_help_names_the_default_method():
    shown = script("kvembed", "export", "--help")
    assert shown.returncode == 0 and "(default kv-embedding)" in " ".join(shown.stdout.split()), shown.stdout


# -- item 2: did you mean ----------------------------------------------------------------------------


def test_a_mistyped_method_gets_did_you_mean(tmp_path):
    one_line(script("kvembed-export", "--model", "stories260k", "--method", "kv-embeding", "--out", str(tmp_path / "a")),
             "unknown method 'kv-embeding'", "did you mean 'kv-embedding'?", "available methods")
    one_line(script("kvembed", "embed", "--model", "stories260k", "--method", "Mean_", "x"), "did you mean 'mean'?")
    far = one_line(script("kvembed", "embed", "--model", "stories260k", "--method", "zzzz", "x"), "unknown method 'zzzz'")
    assert "did you mean" not in far


def test_a_mistyped_precision_gets_did_you_mean(tmp_path):
    one_line(script("kvembed-export", "--model", "stories260k", "--precision", "fp61", "--out", str(tmp_path / "a")),
             "precision must be one of", "did you mean 'fp16'?")


def test_a_mistyped_model_alias_gets_did_you_mean(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = script("kvembed-export", "--model", "stories260", "--out", str(tmp_path / "a"), env=env)
    lines = error_lines(result)
    assert len(lines) <= MAX_LINES and all(len(line) <= LINE_WIDTH for line in lines), result.stderr
    assert "did you mean 'stories260k'?" in result.stderr
    one_line(script("kvembed", "embed", "--model", "stories 260k", "x"), "no model folder", "did you mean 'stories260k'?")


def test_a_mistyped_provider_gets_did_you_mean(default_export):
    out, exported = default_export
    assert exported.returncode == 0, exported.stderr[-3000:]
    one_line(script("kvembed", "embed", str(out), "--provider", "cdua", "x"),
             "provider must be one of", "got 'cdua'", "did you mean 'cuda'?")


def test_a_mistyped_backend_or_hint_gets_did_you_mean(default_export, tmp_path):
    """Every command that takes a backend or target name (verify, bench, triton build) and
    ``--ov-precision`` answer a typo with the name meant."""
    out, exported = default_export
    assert exported.returncode == 0, exported.stderr[-3000:]
    one_line(script("kvembed-export", "verify", str(out), "--backends", "onnxruntme-cpu"),
             "unknown backend 'onnxruntme-cpu'", "did you mean 'onnxruntime-cpu'?")
    one_line(script("kvembed", "bench", "--artifact", str(out), "--backends", "runtmie", "--out", str(tmp_path / "b")),
             "unknown value 'runtmie'", "did you mean 'runtime'?")
    one_line(script("kvembed", "triton", "build", str(out), "--out", str(tmp_path / "r"), "--backend", "onnxrntime"),
             "got 'onnxrntime'", "did you mean 'onnxruntime'?")
    one_line(script("kvembed", "embed", str(out), "--provider", "openvino", "--ov-precision", "bf61", "x"),
             "--ov-precision must be one of", "did you mean 'bf16'?")
    assert not (tmp_path / "b").exists() and not (tmp_path / "r").exists()


# -- item 3: an empty input is an error ---------------------------------------------------------------


@pytest.mark.parametrize("name, content, words", [
    ("empty.txt", "", "is empty"),
    ("blank.jsonl", "\n \n", "holds only blank lines"),
])
def test_embed_refuses_an_input_without_texts(default_export, tmp_path, name, content, words):
    out, exported = default_export
    assert exported.returncode == 0, exported.stderr[-3000:]
    source = tmp_path / name
    source.write_text(content, encoding="utf-8")
    vectors = tmp_path / "v.npy"
    one_line(script("kvembed", "embed", str(out), "--input", str(source), "--output", str(vectors)), str(source), words)
    assert not vectors.exists() and not list(tmp_path.glob("v.npy*"))


def test_embed_refuses_empty_standard_input(default_export, tmp_path):
    out, exported = default_export
    assert exported.returncode == 0, exported.stderr[-3000:]
    vectors = tmp_path / "v.npy"
    result = subprocess.run([str(BIN / "kvembed"), "embed", str(out), "--input", "-", "--output", str(vectors)],
                            input="", capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    lines = error_lines(result)
    assert "standard input" in lines[-1] and "is empty" in lines[-1], result.stderr
    assert not vectors.exists()


def test_embed_corpus_refuses_an_empty_file(default_export, tmp_path):
    out, exported = default_export
    assert exported.returncode == 0, exported.stderr[-3000:]
    pytest.importorskip("pyarrow")
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    one_line(script("kvembed", "embed-corpus", str(out), "-i", str(empty), "-o", str(tmp_path / "corpus")), str(empty), "is empty")
