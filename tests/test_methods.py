"""Method specs: layer-set syntax, presets, aliases, option validation. Torch-free."""

from __future__ import annotations

import pytest

from kvembed.methods import ALIASES, METHODS, demo_model_path, format_layers, parse_layers, resolve, resolve_model
from kvembed.methods.models import match_preset_id


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("12-21", tuple(range(12, 22))),
        ("10,11,20,26-31", (10, 11, 20, 26, 27, 28, 29, 30, 31)),
        ("none", ()),
        (" 3 , 1-2 ", (1, 2, 3)),
        ([5, 3, 3], (3, 5)),
        (7, (7,)),
        ("auto", "auto"),
    ],
)
def test_layer_syntax(spec, expected):
    assert parse_layers(spec, 36) == expected


@pytest.mark.parametrize("spec", ["12-", "a-b", "1,,2", "x", True, 3.5])
def test_layer_syntax_errors_show_the_syntax(spec):
    with pytest.raises(ValueError, match="use a range like '12-21'"):
        parse_layers(spec, 36)


def test_layer_range_backwards_and_out_of_range():
    with pytest.raises(ValueError, match="runs backwards"):
        parse_layers("21-12", 36)
    with pytest.raises(ValueError, match=r"36, 40 is out of range: .* valid indices are 0\.\.35"):
        parse_layers("34-36,40", 36)


def test_format_layers_round_trips():
    for text in ["12-21", "10-11,20,26-31", "0", "none"]:
        assert format_layers(parse_layers(text, 36)) == text


def test_paper_presets_through_aliases():
    cases = {
        "qwen3-4b": (36, tuple(range(12, 22))),
        "mistral-7b-instruct": (32, tuple(range(13, 20))),
        "llama-3.1-8b-instruct": (32, (10, 11, 20, 26, 27, 28, 29, 30, 31)),
    }
    for alias, (num_layers, layers) in cases.items():
        location, preset = resolve_model(alias)
        assert location == ALIASES[alias] == preset
        assert resolve("kv-embedding", num_layers, preset).layers == layers


def test_local_folder_named_after_a_model_gets_its_preset(tmp_path):
    folder = tmp_path / "models--Qwen--Qwen3-4B" / "snapshots" / "abc"
    folder.mkdir(parents=True)
    assert match_preset_id(folder) == "Qwen/Qwen3-4B"
    assert match_preset_id(tmp_path / "Qwen3-4B") == "Qwen/Qwen3-4B"
    assert match_preset_id(tmp_path / "my-model") is None


def test_demo_alias_points_into_the_package():
    location, preset = resolve_model("stories260k")
    assert location == str(demo_model_path()) and preset == "stories260k"
    assert (demo_model_path() / "model.safetensors").is_file()


def test_defaults_for_models_without_presets():
    assert resolve("va", 28).layers == tuple(range(14, 28))
    assert resolve("aligned-wva", 28).layers_needed == 28
    tp = resolve("token-prepending", 32)
    assert (tp.options["tp_start"], tp.options["tp_stop"], tp.options["exit_layer"]) == (1, 7, 31)
    assert tp.layers_needed == 31
    assert resolve("token-prepending", 28, "Qwen/Qwen2-7B").options["tp_stop"] == 6
    assert resolve("va", 32, "Qwen/Qwen3-8B").layers == (26, 27, 29, 30, 31)
    assert resolve("va", 32, "Qwen/Qwen3-8B").layers_needed == 32
    assert resolve("va", 32, layers="3-5").layers_needed == 6
    kv = resolve("kv-embedding", 36)
    assert kv.layers == tuple(range(12, 22)) and kv.options["bias"] == 1.0 and kv.pooling == "last-mean"


def test_small_models_clip_token_prepending_defaults():
    tp = resolve("token-prepending", 4)
    assert (tp.options["tp_start"], tp.options["tp_stop"], tp.options["exit_layer"]) == (1, 3, 3)


@pytest.mark.parametrize(
    "method,options,message",
    [
        ("kv-embedding", {"prefix_rope": "none"}, "choose one of keep, zero"),
        ("kv-embedding", {"pooling": "max"}, "choose one of last-mean, last, mean"),
        ("kv-embedding", {"num_prefix": 0}, "must be >= 1"),
        ("kv-embedding", {"bias": float("nan")}, "finite"),
        ("kv-embedding", {"bias": "high"}, "expects float"),
        ("kv-embedding", {"layers": "auto"}, r"TorchEmbedder\.from_pretrained\(\.\.\., layers='auto'\)"),
        ("va", {"layers": "auto"}, "defined for kv-embedding only"),
        ("va", {"layers": "none"}, "needs at least one"),
        ("aligned-wva", {"prompt": "pirate"}, "prompteol, futureeol or a template"),
        ("token-prepending", {"prompt": 'Say "{text}"'}, "'<PST>'"),
        ("token-prepending", {"tp_stop": -1}, "must be >= 0"),
        ("token-prepending", {"exit_layer": 9}, r"1\.\.8"),
        ("token-prepending", {"tp_start": 5, "tp_stop": 3}, r"0\.\.tp_stop=3"),
        ("mean", {"layers": "1"}, r"valid options: \(none\)"),
    ],
)
def test_bad_options_name_the_valid_choices(method, options, message):
    with pytest.raises(ValueError, match=message):
        resolve(method, 8, **options)


def test_cli_strings_are_coerced():
    resolved = resolve("aligned-wva", 8, wva="true", layers="2-3")
    assert resolved.options["wva"] is True
    assert resolve("kv-embedding", 8, bias="2", num_prefix="3").options == {
        "layers": [2, 3, 4], "bias": 2.0, "num_prefix": 3, "prefix_rope": "keep", "pooling": "last-mean", "prompt": "compress",
    }


def test_custom_prompt_template_applies_to_both_kinds():
    resolved = resolve("kv-embedding", 8, prompt="Represent: {text}")
    assert resolved.templates == {"query": "Represent: {text}", "document": "Represent: {text}"}


def test_resolved_method_round_trips_through_json():
    import json

    from kvembed.methods import ResolvedMethod

    for name, spec in METHODS.items():
        resolved = resolve(name, 8, **({"placeholder": "<s>"} if spec.contextual else {}))
        assert ResolvedMethod.from_dict(json.loads(json.dumps(resolved.to_dict()))) == resolved


def test_causal2vec_needs_its_checkpoint_placeholder():
    with pytest.raises(ValueError, match="placeholder of method 'causal2vec' must name the token"):
        resolve("causal2vec", 8)
    method = resolve("causal2vec", 8, placeholder="<s>", eos="</s>")
    assert method.contextual and method.uses_pool_mask and method.templates["document"] == "{context}{text}</s>"


def test_token_prepending_accepts_the_official_settings_past_the_exit():
    """The official code runs tp_start=1, tp_stop=7, exit_layer=6: layers from the exit on never run,
    so the stop is the exit; the effective values are what the method (and manifest) records."""
    resolved = resolve("token-prepending", 32, tp_start=1, tp_stop=7, exit_layer=6)
    assert (resolved.options["tp_start"], resolved.options["tp_stop"], resolved.options["exit_layer"]) == (1, 6, 6)
    assert resolve("token-prepending", 32, tp_start="1", tp_stop="7", exit_layer="6").options == resolved.options
    beyond = resolve("token-prepending", 32, tp_start=7, tp_stop=9, exit_layer=6)
    assert (beyond.options["tp_start"], beyond.options["tp_stop"]) == (6, 6)  # nothing rewired: well defined
    with pytest.raises(ValueError, match=r"0\.\.tp_stop=2"):
        resolve("token-prepending", 32, tp_start=3, tp_stop=2, exit_layer=6)
