"""An architecture is one entry in ``kvembed.methods.architectures.SUPPORTED`` (issue 48, item 5):
the GGUF loader's map and the export's memory estimate derive from the entries, so each test
here runs over every entry and a new one is checked without a line added.

The independent counts are real files: the safetensors that transformers writes for a tiny model
of each architecture (its own classes decide which tensors exist), and the tensors of the
packaged SmolLM2 and Gemma 3 270M GGUF files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_gguf
from kvembed.export.memory import count_parameters, export_memory_check
from kvembed.methods.architectures import BY_GGUF_NAME, SUPPORTED

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: every bias switch some entry honours: turned on for every architecture, the model decides
SWITCHES = sorted({switch for arch in SUPPORTED.values() for switch in arch.bias_switches})


def saved_tiny_model(model_type: str, folder: Path, **fields) -> Path:
    """A tiny random model of ``model_type`` saved by transformers (head_dim not hidden / heads)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=50, pad_token_id=0, **fields,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def tensor_sizes(folder: Path) -> dict[str, int]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        return {name: int(np.prod(weights.get_slice(name).get_shape())) for name in weights.keys()}


@pytest.mark.parametrize("switched", [False, True], ids=["plain", "bias-switches-on"])
@pytest.mark.parametrize("model_type", sorted(SUPPORTED))
def test_every_entry_counts_as_its_saved_weights(model_type, switched, tmp_path):
    folder = saved_tiny_model(model_type, tmp_path, **{switch: True for switch in SWITCHES if switched})
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.pop("tie_word_embeddings")  # as older config.json files leave it: the entry's default
    sizes = tensor_sizes(folder)
    counts = count_parameters(config)
    assert counts.decoder(counts.num_layers) == sum(n for name, n in sizes.items() if name != "lm_head.weight")
    assert counts.lm_head == sizes.get("lm_head.weight", 0)
    # the export counts a graph's layers by the entry's matrices per layer: transformers' own tensors
    matrices = [name for name in sizes if name.startswith("model.layers.0.") and name.endswith("proj.weight")]
    assert len(matrices) == SUPPORTED[model_type].weight_matrices, matrices


def test_an_architecture_without_an_entry_has_no_estimate():
    with pytest.raises(ValueError, match="no memory estimate for architecture 'gpt2'"):
        count_parameters({"model_type": "gpt2", "hidden_size": 8})


@pytest.mark.parametrize("model_type", sorted(SUPPORTED))
def test_every_entry_is_read_from_a_gguf_of_its_name(model_type, tmp_path):
    pytest.importorskip("gguf", reason="the gguf package (kvembed[gguf]) is not installed")
    from kvembed.modeling.gguf import GGUFError, read_info

    arch = SUPPORTED[model_type]
    name = arch.gguf_name
    if not arch.gguf_loadable:  # transformers' GGUF loader has no converter for it: refused by name
        assert name not in BY_GGUF_NAME
        with pytest.raises(GGUFError, match=f"a GGUF of {name}, which transformers' GGUF loader does not convert"):
            read_info(tiny_gguf(tmp_path / f"{name}.gguf", name, layers=3))
        return
    assert BY_GGUF_NAME[name] is arch  # one entry per GGUF name
    info = read_info(tiny_gguf(tmp_path / f"{name}.gguf", name, layers=3))
    assert (info.architecture, info.model_type, info.num_layers) == (name, model_type, 3)
    with pytest.raises(GGUFError, match="architecture 'gpt2'") as refused:
        read_info(tiny_gguf(tmp_path / "gpt2.gguf", "gpt2"))
    assert name in str(refused.value)  # the refusal lists what is supported


@pytest.mark.parametrize("model_type", sorted(SUPPORTED))
def test_an_entry_is_gguf_loadable_exactly_when_transformers_converts_its_name(model_type):
    """kvembed dequantizes a GGUF through transformers' loader: an entry that claims a GGUF it cannot
    convert would fail minutes in, one that denies a convertible one refuses a usable file."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = SUPPORTED[model_type]
    assert arch.gguf_loadable == (arch.gguf_name in GGUF_SUPPORTED_ARCHITECTURES)


def test_a_gguf_header_is_parsed_once_per_file_version(tmp_path):
    """The header is remembered per (path, size, mtime): a file rewritten with the same size and
    mtime reads as remembered (no second parse), a rewritten file with a new mtime is read anew."""
    pytest.importorskip("gguf", reason="the gguf package (kvembed[gguf]) is not installed")
    import os

    from kvembed.modeling.gguf import read_info

    path = tiny_gguf(tmp_path / "llama.gguf", "llama", layers=3)
    stamp = path.stat().st_mtime_ns
    assert read_info(path).num_layers == 3
    tiny_gguf(path, "llama", layers=4)  # same size: only the block count differs
    os.utime(path, ns=(stamp, stamp))
    assert read_info(path).num_layers == 3  # remembered, not parsed again
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    assert read_info(path).num_layers == 4


@pytest.mark.parametrize("alias, layers", [("smollm2-135m", 30), ("gemma3-270m", 18)])
def test_a_packaged_gguf_is_estimated_from_its_header(alias, layers):
    """The header's shape gives the parameter count of the file's tensors (tied embeddings: no
    output.weight, no lm_head); the estimate by alias (a GGUF shipped in parts is joined first, as
    the loader would) reads the header, or the dequantized folder another test left: the same count."""
    pytest.importorskip("gguf", reason="the gguf package (kvembed[gguf]) is not installed")
    from kvembed.export.memory import _gguf_config
    from kvembed.methods.models import packaged_model_path
    from kvembed.modeling.gguf import read_header, read_info

    try:
        estimate = export_memory_check(alias, "kv-embedding", "fp32")
    except FileNotFoundError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    path = packaged_model_path(alias)
    parsed = read_header(path)  # parsed once per file: the estimate above left it in the cache
    tensors = sum(parsed.tensors.values())
    info = read_info(path)
    header = count_parameters(_gguf_config(parsed, info.architecture, info.model_type))
    assert estimate is not None and estimate.num_layers == header.num_layers == layers
    assert estimate.params_loaded == header.decoder(layers) == tensors
