"""int8 is held to its bar on the held-out texts as well as the gate's: a recipe that passes the
gate but misses on text it never saw is refused and the next recipe is tried; the certificate and
``kvembed verify`` name both text sets, each with its worst cosine."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from kvembed.artifact import Certificate, load_manifest
from kvembed.export.gate.texts import DECIDING_HELD_OUT_TEXTS, GATE_TEXTS
from kvembed.methods import demo_model_path

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: a character the held-out texts hold (their JavaScript) and no gate text does
BRACE = "{"
#: the residual channel only BRACE writes
CHANNEL = 7
#: per-row activation scales, SwiGLU down_projs kept fp32: it passes this model's gate (whose texts
#: never reach the channel) and is spoiled by the one token that does
WEAK = "smooth-rows-keep-down"


@pytest.fixture(scope="module")
def braced(tmp_path_factory) -> Path:
    """The demo model with one residual channel that only BRACE's token writes: its embedding column
    is zero for every other token, no attention or MLP output writes it, and two norms scale it
    500x (a massive activation, as trained LLMs have, that only text with a brace produces)."""
    from safetensors.numpy import load_file, save_file

    folder = tmp_path_factory.mktemp("braced") / "model"
    shutil.copytree(demo_model_path(), folder)
    brace = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(BRACE)
    weights = load_file(str(folder / "model.safetensors"))
    table = weights["model.embed_tokens.weight"].copy()
    table[:, CHANNEL], table[brace, CHANNEL] = 0.0, 1.0
    weights["model.embed_tokens.weight"] = table
    for name in [n for n in weights if n.endswith(("o_proj.weight", "down_proj.weight"))]:
        weights[name] = weights[name].copy()
        weights[name][CHANNEL, :] = 0.0
    for name in ("model.layers.1.post_attention_layernorm.weight", "model.layers.3.input_layernorm.weight"):
        weights[name] = weights[name].copy()
        weights[name][CHANNEL] *= 500.0
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def exported(braced, tmp_path_factory):
    """WEAK alone (refused: the ParityError) and WEAK then weight-only (the result), from one trace."""
    from kvembed.export.core import Exporter, ParityError
    from kvembed.modeling.reference import TorchEmbedder

    root = tmp_path_factory.mktemp("held")
    with Exporter(TorchEmbedder.from_pretrained(braced, "kv-embedding")) as exporter:
        with pytest.raises(ParityError) as alone:
            exporter.write(root / "alone", "int8", int8_recipe=WEAK)
        assert not (root / "alone").exists()
        result = exporter.write(root / "held", "int8", int8_recipe=f"{WEAK},weights")
    return alone.value, result


def test_only_the_held_out_texts_hold_a_brace():
    """The premise: the gate never runs the brace's token, the held-out texts do."""
    tokenizer = Tokenizer.from_file(str(demo_model_path() / "tokenizer.json"))
    brace = tokenizer.token_to_id(BRACE)
    assert not any(brace in tokenizer.encode(text).ids for text in GATE_TEXTS.values())
    assert any(brace in tokenizer.encode(text).ids for text in DECIDING_HELD_OUT_TEXTS.values())


def test_a_recipe_that_misses_on_held_out_texts_is_refused(exported):
    error, _ = exported
    assert error.held_out and "held-out texts" in str(error)
    assert not error.report.passed and error.report.worst_cosine < 0.99
    assert error.report.texts == len(DECIDING_HELD_OUT_TEXTS) and error.report.worst_row["text"] in DECIDING_HELD_OUT_TEXTS


def test_the_next_recipe_is_tried_and_the_certificate_names_both_text_sets(exported):
    _, result = exported
    conversion = result.manifest.raw["graph"]["precision_conversion"]
    tried = conversion["recipes_tried"]
    assert [(t["recipe"], t["passed"]) for t in tried] == [(WEAK, False), ("weights", True)]
    # the weak recipe passed the gate: only the held-out texts refused it
    assert tried[0]["worst_cosine"] >= 0.99 > tried[0]["held_out_worst_cosine"]
    assert conversion["recipe"] == "weights"
    manifest = load_manifest(result.path)
    held = manifest.parity.held_out
    assert held is not None and held.decides and held.meets_bar and held.worst_cosine >= 0.99
    certificates = [Certificate.from_dict(c) for c in result.manifest.raw["certified"]]
    # an advisory OpenVINO certificate, where this CPU runs one, was decided by both sets too
    assert all(list(c.decided_by) == ["gate", "held_out"] for c in certificates)
    [certificate] = [c for c in certificates if c.target == "onnxruntime-cpu"]
    assert certificate.decided_by == {
        "gate": {"texts": result.parity.texts, "rows": result.parity.rows, "worst_cosine": result.parity.worst_cosine},
        "held_out": {"texts": len(DECIDING_HELD_OUT_TEXTS), "rows": held.rows, "worst_cosine": held.worst_cosine},
    }
    assert result.parity.texts == len(GATE_TEXTS)
    assert "gate texts" in certificate.describe() and "held-out texts" in certificate.describe()


def test_verify_says_which_texts_decided(exported):
    from typer.testing import CliRunner

    from kvembed.cli.main import app

    _, result = exported
    run = CliRunner().invoke(app, ["verify", str(result.path), "--no-compare"])
    assert run.exit_code == 0, run.output
    # the gate's target (an advisory OpenVINO check, where this CPU runs one, prints its own line)
    [line] = [line for line in run.output.splitlines() if line.startswith("onnxruntime-cpu decided by")]
    held = load_manifest(result.path).parity.held_out
    assert f"{len(GATE_TEXTS)} gate texts" in line and f"{len(DECIDING_HELD_OUT_TEXTS)} held-out texts" in line
    # the same graph, the same texts: the figures of the export
    assert f"{held.worst_cosine:.5f}" in line and f"{result.parity.worst_cosine:.5f}" in line


def test_other_precisions_are_decided_by_the_gate_texts_alone(stories_artifact):
    manifest = load_manifest(stories_artifact("kv-embedding"))
    assert manifest.parity.held_out is not None and not manifest.parity.held_out.decides
    [certificate] = manifest.certified
    assert list(certificate.decided_by) == ["gate"]
    assert np.isclose(certificate.decided_by["gate"]["worst_cosine"], manifest.parity.gate.worst_cosine)
