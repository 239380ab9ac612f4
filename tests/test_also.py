"""Several methods from one forward pass (``kvembed-export --also``).

Which methods may share a pass is checked on resolved methods (torch-free); every extra output
of an exported graph is checked, through the torch-free runtime, against the independent oracle
(tests/independent.py) of that method alone, with the options written out in the test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from checks import assert_matches_oracle
from kvembed.export.core import export_result
from kvembed.export.gate.verification import verify
from kvembed.methods import resolve
from kvembed.methods.sharing import parse_also, resolve_also, sharing_problem
from kvembed.runtime import Embedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STORIES = "stories260k"
TEXTS = ["A man is playing a guitar.", "", "Ünïcödé café — 東京 🤖", "What is the capital of France? It is Paris."]


# -- which methods can share a pass (torch-free) ------------------------------------------------


def test_parse_also():
    assert parse_also("va").method == "va"
    request = parse_also("last=kv-embedding:pooling=last:num-prefix=2")
    assert (request.label, request.method, dict(request.options)) == ("last", "kv-embedding", {"pooling": "last", "num_prefix": "2"})
    assert dict(parse_also("va:layers=10,11,20-22").options) == {"layers": "10,11,20-22"}
    for bad, message in [("", "expects"), ("va:layers", "option=value"), ("Bad Label=va", "label"),
                         ("va:layers=1:layers=2", "twice")]:
        with pytest.raises(ValueError, match=message):
            parse_also(bad)


def test_sharing_rules_follow_the_forward_pass():
    kv = resolve("kv-embedding", 36, layers="12-21")
    # same prompt and same re-routing before the final hidden states: other poolings share
    assert list(resolve_also(kv, ["kv-embedding:pooling=last", "m=kv-embedding:pooling=mean"])) == ["kv-embedding-2", "m"]
    with pytest.raises(ValueError, match="prompt differs"):
        resolve_also(kv, ["va"])
    with pytest.raises(ValueError, match="KV re-routing in layers 12-21 .* would apply nothing"):
        resolve_also(kv, ["kv-embedding:layers=none"])
    with pytest.raises(ValueError, match=r"bias 2"):
        resolve_also(kv, ["kv-embedding:bias=2"])
    # with a raw prompt, values read up to layer 12 come before layer 12's re-routed attention
    raw_kv = resolve("kv-embedding", 36, layers="12-21", prompt="{text}")
    assert sharing_problem(raw_kv, resolve("va", 36, layers="4-12")) is None
    assert "layer 13's value vectors" in sharing_problem(raw_kv, resolve("va", 36, layers="4-13"))
    assert "layer 12's attention output" in sharing_problem(
        resolve("kv-embedding", 36, layers="12-21", prompt='This sentence : "{text}" means in one word:"'),
        resolve("aligned-wva", 36, layers="12"),
    )
    # va with early exit + baselines that run every layer: nothing is changed, all share
    va = resolve("va", 32, layers="20-27")
    assert list(resolve_also(va, ["mean", "last-token", "va:layers=4-8"])) == ["mean", "last-token", "va-2"]
    assert "cleans up the text" in sharing_problem(resolve("aligned-wva", 32), resolve("prompteol", 32))
    # token prepending: earlier exits share the pass when their prepending window matches
    tp = resolve("token-prepending", 32)
    assert sharing_problem(tp, resolve("token-prepending", 32, exit_layer=20)) is None
    assert sharing_problem(tp, resolve("token-prepending", 32, exit_layer=4)) is None  # window 1..3 both
    assert "token prepending before layers 1-6" in sharing_problem(tp, resolve("token-prepending", 32, tp_stop=5))
    with pytest.raises(ValueError, match="used twice"):
        resolve_also(va, ["x=mean", "x=last-token"])
    with pytest.raises(ValueError, match="layers=auto"):
        resolve_also(kv, ["kv-embedding:layers=auto"])
    with pytest.raises(ValueError, match="unknown option"):
        resolve_also(va, ["mean:layers=3"])


# -- exported graphs: every output against the independent computation --------------------------


def _check_outputs(result, expected: dict[str, tuple[str, dict]], oracle) -> None:
    """Every output of the artifact (label -> the oracle's method and options) through the runtime."""
    embedder = Embedder.load(result.path, provider="cpu", threads=1)
    labels = list(expected)
    assert embedder.outputs == labels
    manifest = result.manifest.raw
    assert [o["name"] for o in manifest["outputs"]][2:] == [
        f"{kind}.{label}" for label in labels[1:] for kind in ("embedding", "pooled")
    ]
    assert set(manifest["parity"]["also"]) == set(labels[1:])
    assert all(report["passed"] for report in manifest["parity"]["also"].values())
    for output, (method, options) in expected.items():
        assert embedder.dim_of(output) == len(oracle.embed(method, "x", **options))
        encode = lambda texts, kind: embedder.encode(texts, kind=kind, batch_size=3, output=output)  # noqa: E731
        assert_matches_oracle(encode, oracle, method, TEXTS, what=f"output {output}", **options)


def test_kv_embedding_with_other_poolings(tiny_models, oracle, tmp_path):
    result = export_result(
        tiny_models["qwen3"], "kv-embedding", tmp_path / "a",
        also=["kv-embedding:pooling=last", "mean-pool=kv-embedding:pooling=mean"],
    )
    _check_outputs(result, {  # the 4-layer model's default re-routing band is 1-2 (the oracle's default)
        "kv-embedding": ("kv-embedding", {}),
        "kv-embedding-2": ("kv-embedding", {"pooling": "last"}),
        "mean-pool": ("kv-embedding", {"pooling": "mean"}),
    }, oracle("qwen3"))


def test_early_exit_method_with_full_depth_baselines(oracle, tmp_path):
    """va stops at layer 2 alone; with mean and last-token beside it the graph runs every layer."""
    result = export_result(STORIES, "va", tmp_path / "a", layers="1-2", also=["mean", "last-token", "va:layers=0,3"])
    assert result.manifest.raw["graph"]["decoder_layers"] == result.manifest.raw["method"]["num_layers"] == 5
    _check_outputs(result, {
        "va": ("va", {"layers": "1-2"}), "mean": ("mean", {}), "last-token": ("last-token", {}),
        "va-2": ("va", {"layers": "0,3"}),
    }, oracle(STORIES))


def test_token_prepending_several_exits(oracle, tmp_path):
    result = export_result(STORIES, "token-prepending", tmp_path / "a", exit_layer=3, also=["token-prepending:exit_layer=2"])
    assert result.manifest.raw["graph"]["decoder_layers"] == 3
    _check_outputs(result, {
        "token-prepending": ("token-prepending", {"exit_layer": 3}),
        "token-prepending-2": ("token-prepending", {"exit_layer": 2}),
    }, oracle(STORIES))


def test_verify_checks_extra_outputs(stories_artifact, tmp_path):
    """On the session's shared kv-embedding artifact with a ``last`` output (tests/test_openvino.py
    and tests/test_triton.py read it too), copied: no second export of the same thing."""
    out = Path(shutil.copytree(stories_artifact("kv-embedding", also=("last=kv-embedding:pooling=last",)), tmp_path / "a"))
    checked = verify(out)
    assert checked.passed and set(checked.also) == {"last"} and checked.also["last"].worst_cosine >= 0.99999
    # an artifact whose manifest says the extra output pools differently than its graph does
    copy = tmp_path / "b"
    shutil.copytree(out, copy)
    manifest = json.loads((copy / "kvembed.json").read_text())
    manifest["also"]["last"]["options"]["pooling"] = "mean"
    (copy / "kvembed.json").write_text(json.dumps(manifest))
    checked = verify(copy)
    assert checked.report.passed and not checked.also["last"].passed and not checked.passed


@pytest.fixture(scope="module")
def va_with_mean(tmp_path_factory):
    """``kvembed-export --method va --layers 1 --also mean``: one export for the two tests below."""
    from kvembed.cli.export import app

    out = tmp_path_factory.mktemp("also") / "a"
    result = CliRunner().invoke(app, ["--model", STORIES, "--method", "va", "--layers", "1", "--also", "mean", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


def test_cli_refuses_methods_that_cannot_share(va_with_mean, tmp_path):
    from kvembed.cli.export import app

    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["--model", STORIES, "--method", "kv-embedding", "--also", "va", "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "prompt differs" in result.output and "Traceback" not in result.output
    assert not out.exists()
    result = CliRunner().invoke(app, ["--model", STORIES, "--method", "va", "--also", "nope", "--out", str(out)])
    assert result.exit_code == 2 and "unknown method" in result.output
    assert "extra output 'mean'" in va_with_mean[1]  # and the shareable pair exports


def test_embed_cli_uses_an_extra_output(va_with_mean, tmp_path):
    from kvembed.cli.main import app

    out = va_with_mean[0]
    target = tmp_path / "v.npy"
    result = CliRunner().invoke(app, ["embed", str(out), "--use", "mean", "--output", str(target), "one", "two"])
    assert result.exit_code == 0, result.output
    want = Embedder.load(out, provider="cpu").encode(["one", "two"], output="mean")
    assert np.allclose(np.load(target), want, atol=1e-6) and want.shape[1] == 64
    result = CliRunner().invoke(app, ["embed", str(out), "--use", "nope", "one"])
    assert result.exit_code == 2 and "va, mean" in result.output
