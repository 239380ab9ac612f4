"""Automatic layer selection by intrinsic dimension: TwoNN, the selection rule, the per-layer
final-token states, ``kvembed-layers`` and ``TorchEmbedder.from_pretrained(layers="auto")``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from kvembed.modeling.layers import (
    MIN_POINTS,
    PROMPTS,
    builtin_calibration_path,
    compute_layer_selection,
    distinct_points,
    final_token_states,
    generate_calibration,
    load_calibration,
    select_layers,
    twonn,
    write_report,
)
from kvembed.cli.layers import app
from kvembed.modeling.reference import TorchEmbedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NUM_TEXTS = 200  # the CLI default is 1,000; 200 keeps this file fast
runner = CliRunner()


# ----- TwoNN ---------------------------------------------------------------------------------


def subspace_points(dim: int, n: int = 2000, ambient: int = 256, seed: int = 0) -> np.ndarray:
    """``n`` Gaussian points on a random ``dim``-dimensional linear subspace of R^ambient."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(rng.standard_normal((ambient, dim)))
    return rng.standard_normal((n, dim)) @ basis.T


@pytest.mark.parametrize("dim", [3, 8, 16])
def test_twonn_recovers_the_dimension_of_a_linear_subspace(dim):
    estimate = twonn(subspace_points(dim, seed=dim))
    assert abs(estimate - dim) <= 0.15 * dim, estimate


def test_twonn_ignores_duplicate_and_near_duplicate_points():
    points = subspace_points(5, n=500, ambient=32, seed=1)
    reference = twonn(points)
    jitter = 1e-9 * np.random.default_rng(2).standard_normal((50, 32))
    padded = np.vstack([points, points[:100], points[100:150] + jitter])
    assert len(distinct_points(padded)) == len(points)
    assert twonn(padded) == pytest.approx(reference, rel=1e-6)  # a jittered twin may be the one kept
    assert math.isfinite(twonn(np.vstack([points, points])))


def test_twonn_does_not_depend_on_scale_rotation_or_order():
    points = subspace_points(4, n=400, ambient=16, seed=3)
    rotation, _ = np.linalg.qr(np.random.default_rng(4).standard_normal((16, 16)))
    shuffled = np.random.default_rng(5).permutation(points)
    reference = twonn(points)
    assert twonn(1e3 * points) == pytest.approx(reference, rel=1e-9)
    assert twonn(points @ rotation) == pytest.approx(reference, rel=1e-9)
    assert twonn(shuffled) == pytest.approx(reference, rel=1e-9)


def test_twonn_bad_input():
    with pytest.raises(ValueError, match=f"at least {MIN_POINTS} distinct points, got 19"):
        twonn(subspace_points(3, n=19, ambient=8))
    with pytest.raises(ValueError, match="at least 20 distinct points, got 1"):
        twonn(np.ones((100, 8)))  # one point repeated
    with pytest.raises(ValueError, match="2-D"):
        twonn(np.zeros(30))
    bad = subspace_points(3, n=50, ambient=8)
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        twonn(bad)


# ----- the selection rule --------------------------------------------------------------------


def test_rule_on_a_u_shaped_curve():
    # L = 20: layers 0..3 ignored, window floor(0.1 L) = 2 layers past l*
    curve = [30, 25, 20, 16, 13, 11, 9, 8, 7.5, 7, 6.8, 7.2, 8, 9, 11, 13, 15, 18, 21, 25]
    assert select_layers(curve, 20) == [10, 11, 12]


def test_rule_first_of_several_minima_wins():
    curve = [20, 15, 12, 5, 9, 12, 5, 8, 5, 14]  # L = 10: start 2, window 1
    assert select_layers(curve, 10) == [3, 4]


def test_rule_ignores_a_minimum_in_the_first_20_percent():
    curve = [1.0, 2.0, 3.0, 9, 8, 7, 6, 4, 5, 6, 7, 8, 9, 9, 9]  # L = 15: start 3
    assert select_layers(curve, 15) == [7, 8]
    assert select_layers([1.0, 0.5, 3, 4, 5], 5) == [1]  # floor(0.2 * 5) = 1: layer 1 may win


def test_rule_clips_the_window_at_the_last_layer():
    curve = list(range(40, 0, -1))  # L = 40, minimum at the last layer, window 4
    assert select_layers(curve, 40) == [39]
    curve[37] = 0.5
    assert select_layers(curve, 40) == [37, 38, 39]


def test_rule_edge_cases():
    assert select_layers([3.0], 1) == [0]
    assert select_layers([5, 4, float("nan"), 6], 4) == [1]  # NaN never wins
    with pytest.raises(ValueError, match="4 values, got 3"):
        select_layers([1, 2, 3], 4)
    with pytest.raises(ValueError, match="no finite"):
        select_layers([1.0] + [float("nan")] * 4, 5)  # only the ignored layer 0 is finite


# ----- calibration texts ---------------------------------------------------------------------


def test_builtin_calibration_set():
    lines = builtin_calibration_path().read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1000 and len(set(lines)) == 1000
    assert all(line.strip() == line and line for line in lines)
    assert lines == generate_calibration()  # the shipped file is the generator's output
    assert load_calibration() == lines
    assert load_calibration(num_texts=NUM_TEXTS) == lines[:NUM_TEXTS]


def test_calibration_file_and_list(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(["  b  ", "", "a"] + [f"text {i}" for i in range(25)] + ["a"]) + "\n", encoding="utf-8")
    texts = load_calibration(path, num_texts=25)
    assert texts[:2] == ["b", "a"] and len(texts) == 25
    assert load_calibration([f"t{i}" for i in range(30)], 20) == [f"t{i}" for i in range(20)]
    with pytest.raises(FileNotFoundError, match="calibration file not found"):
        load_calibration(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="at least 20"):
        load_calibration(["x"] * 50)
    with pytest.raises(ValueError, match="num_texts must be an integer >= 20"):
        load_calibration(None, 5)


# ----- the per-layer final-token states ------------------------------------------------------


def test_final_token_states_are_the_decoder_layer_outputs(model_paths):
    """Layer l's point is HF's hidden_states[l + 1] at the last real token; for the last layer
    that is before the final norm (HF's hidden_states[L] is the normed last_hidden_state)."""
    embedder = TorchEmbedder.from_pretrained(model_paths["qwen3"], "kv-embedding", layers="none")
    decoder, tokenizer = embedder.model.decoder, embedder.hf_tokenizer
    texts = ["A cat sat on the mat.", "hi", "The quick brown fox jumps over the lazy dog again and again."]
    states = final_token_states(decoder, tokenizer, texts, batch_size=2)
    L = len(decoder.layers)
    assert states.shape == (L, 3, decoder.config.hidden_size) and states.dtype == np.float32
    for row, text in enumerate(texts):
        ids = tokenizer(PROMPTS["document"].format(text=text), return_tensors="pt")["input_ids"]
        assert list(ids[0]) == list(embedder.encoder.encode_one(text).ids)
        with torch.inference_mode():
            hidden = decoder(input_ids=ids, output_hidden_states=True).hidden_states
        for layer in range(L - 1):
            np.testing.assert_allclose(states[layer, row], hidden[layer + 1][0, -1].numpy(), atol=1e-5, rtol=1e-5)
        normed = decoder.norm(torch.from_numpy(states[L - 1, row])).detach().numpy()
        np.testing.assert_allclose(normed, hidden[L][0, -1].numpy(), atol=1e-4, rtol=1e-4)
    # padding: each row's point does not depend on its batch
    alone = np.stack([final_token_states(decoder, tokenizer, [t])[:, 0] for t in texts], axis=1)
    np.testing.assert_allclose(states, alone, atol=1e-5, rtol=1e-5)


# ----- end to end ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def selections(model_paths):
    return {name: compute_layer_selection(str(model_paths[name]), num_texts=NUM_TEXTS) for name in ("stories260k", "qwen3")}


def check_report(folder, num_layers: int) -> dict:
    data = json.loads((folder / "layers.json").read_text(encoding="utf-8"))
    ids = data["intrinsic_dimension"]
    assert len(ids) == num_layers and all(isinstance(v, float) and v > 0 for v in ids)
    assert data["layers"] == select_layers(ids, num_layers)
    assert data["l_star"] == data["layers"][0] and data["num_texts"] == NUM_TEXTS
    assert {"model", "rule", "prompt", "estimator", "calibration"} <= set(data)
    png = (folder / "layers.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(folder / "layers.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    return data


@pytest.mark.parametrize("name", ["stories260k", "qwen3"])
def test_end_to_end_report_and_auto_embedder(selections, model_paths, tmp_path, name):
    selection = selections[name]
    L = selection.num_layers
    assert len(selection.intrinsic_dimension) == L == (5 if name == "stories260k" else 4)
    write_report(selection, tmp_path / "out")
    data = check_report(tmp_path / "out", L)
    assert data["prompt"] == PROMPTS["document"]

    auto = TorchEmbedder.from_pretrained(model_paths[name], "kv-embedding", layers="auto", num_calibration_texts=NUM_TEXTS)
    assert list(auto.method.layers) == list(selection.layers) == auto.method.options["layers"]
    assert auto.layer_selection is not None
    assert auto.layer_selection["layers"] == data["layers"]
    np.testing.assert_allclose(auto.layer_selection["intrinsic_dimension"], data["intrinsic_dimension"], rtol=1e-6)
    texts = ["A cat sat on the mat.", "Stock markets fell sharply today."]
    explicit = TorchEmbedder.from_pretrained(model_paths[name], "kv-embedding", layers=list(selection.layers))
    assert explicit.layer_selection is None
    vectors = auto.encode(texts)
    assert vectors.shape == (2, auto.dim) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors, explicit.encode(texts), atol=1e-6)


def test_auto_bad_input(model_paths, tmp_path):
    with pytest.raises(ValueError, match="defined for kv-embedding only"):
        TorchEmbedder.from_pretrained(model_paths["stories260k"], "va", layers="auto")
    with pytest.raises(ValueError, match="only used with layers='auto'"):
        TorchEmbedder.from_pretrained(model_paths["stories260k"], "kv-embedding", calibration=["x"] * 30)
    with pytest.raises(FileNotFoundError, match="calibration file not found"):
        TorchEmbedder.from_pretrained(model_paths["stories260k"], layers="auto", calibration=tmp_path / "none.txt")
    with pytest.raises(ValueError, match="choose one of keep, zero"):  # other options checked too
        TorchEmbedder.from_pretrained(model_paths["stories260k"], layers="AUTO", prefix_rope="bad")


def test_auto_uses_the_method_prompt(model_paths):
    template = 'Text: "{text}" In one word:'
    texts = load_calibration(num_texts=40)
    auto = TorchEmbedder.from_pretrained(model_paths["qwen3"], layers="auto", prompt=template, calibration=texts)
    assert auto.layer_selection["prompt"] == template
    assert auto.layer_selection["num_texts"] == 40 and auto.layer_selection["calibration"] == "texts"


# ----- the command line ----------------------------------------------------------------------


def test_cli_writes_json_and_png(tmp_path, selections):
    out = tmp_path / "report"
    result = runner.invoke(app, ["--model", "stories260k", "--num-texts", str(NUM_TEXTS), "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = check_report(out, 5)
    assert data["model"] == "stories260k" and data["calibration"] == "built-in"
    assert data["layers"] == list(selections["stories260k"].layers)
    assert f"layers: {data['layers_spec']}" in result.output


def test_cli_with_a_calibration_file(tmp_path, model_paths):
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("\n".join(load_calibration(num_texts=1000)[-60:]) + "\n", encoding="utf-8")
    out = tmp_path / "report"
    args = ["-m", str(model_paths["qwen3"]), "-c", str(calibration), "--out", str(out), "--quiet", "--prompt", "raw"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = check_report_counts(out, 4, 60)
    assert data["calibration"] == str(calibration) and data["prompt"] == "{text}"


def check_report_counts(folder, num_layers: int, num_texts: int) -> dict:
    data = json.loads((folder / "layers.json").read_text(encoding="utf-8"))
    assert len(data["intrinsic_dimension"]) == num_layers and data["num_texts"] == num_texts
    assert (folder / "layers.png").read_bytes()[:4] == b"\x89PNG"
    return data


@pytest.mark.parametrize(
    "args,message",
    [
        (["--calibration", "{tmp}/missing.txt"], "calibration file not found"),
        (["--calibration", "{tmp}/short.txt"], "needs at least 20"),
        (["--num-texts", "5"], "num_texts must be an integer >= 20"),
        (["--model", "./no-such-model"], "no model folder at './no-such-model'"),
        (["--model", "{tmp}"], "error:"),  # a folder without config.json
        (["--prompt", "no placeholder"], "template containing '{text}'"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, args, message):
    (tmp_path / "short.txt").write_text("one\ntwo\nthree\n", encoding="utf-8")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--model" not in args:
        args = ["--model", "stories260k", *args]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1
    assert not (tmp_path / "out").exists()


def test_export_with_layers_auto_records_the_curve(tmp_path):
    from kvembed.export import export, read_manifest
    from kvembed.runtime import Embedder

    # 40 texts: what is checked here is that the curve reaches the manifest, not the curve itself
    out = export("stories260k", "kv-embedding", tmp_path / "auto", layers="auto", num_calibration_texts=40)
    manifest = read_manifest(out)
    selection = manifest["layer_selection"]
    assert len(selection["intrinsic_dimension"]) == 5 and selection["num_texts"] == 40
    assert manifest["method"]["layers"] == selection["layers"]
    assert Embedder.load(out, provider="cpu").encode(["a cat"]).shape == (1, 64)
