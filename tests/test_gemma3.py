"""Gemma 3 (``gemma3_text``): kvembed's reference against the independent oracle on tiny random
Gemma 3 models with sliding-window and global layers (each with its own RoPE base), a query
scale that is not head_dim's, Gemma's ``1 + w`` norms and texts longer than the window; and the
real Gemma 3 270M (GGUF, from its pip packages) when installed."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from checks import assert_matches_oracle
from conftest import TEXTS
from independent import Oracle
from kvembed.methods import demo_model_path
from kvembed.modeling.reference import TorchEmbedder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: the tiny model's window in tokens: shorter than every prompt below, so each runs past it
WINDOW = 6
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"]
LONG = TEXTS + ["A long text about " + "cats and dogs and birds, " * 4 + "the end."]

VARIANTS = [
    ("last-token", {}),
    ("mean", {}),
    ("kv-embedding", {"layers": "0-4"}),
    ("kv-embedding", {"layers": "0,2", "num_prefix": 2, "prefix_rope": "zero", "bias": 0.0}),
    ("kv-embedding", {"layers": "1-3", "pooling": "last", "num_prefix": 3, "bias": 2.5, "prefix_rope": "zero"}),
    ("va", {"layers": "0,2"}),
    ("aligned-wva", {"layers": "1-3"}),
    ("aligned-wva", {"layers": "2-4", "wva": True}),
    ("token-prepending", {"tp_start": 0, "tp_stop": 3, "exit_layer": 4}),
    ("prompteol", {}),
    ("echo", {}),
]


def tiny_gemma3_config(**overrides):
    """The tiny Gemma 3's config; ``overrides`` replace its fields (e.g. a longer ``sliding_window``)."""
    from transformers import Gemma3TextConfig

    fields = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=len(LAYER_TYPES), num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=300, max_position_embeddings=256, initializer_range=0.1,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, query_pre_attn_scalar=24, sliding_window=WINDOW,
        layer_types=LAYER_TYPES, tie_word_embeddings=True,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
        },
    )
    return Gemma3TextConfig(**{**fields, **overrides})


def build_tiny_gemma3(folder: Path, seed: int, **overrides) -> Path:
    """The tiny Gemma 3 of :func:`tiny_gemma3_config` (with ``overrides``) with random weights (norm
    weights too: Gemma scales by ``1 + w``) and the demo tokenizer, saved in ``folder``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_gemma3_config(**overrides))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_path() / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory) -> Path:
    return build_tiny_gemma3(tmp_path_factory.mktemp("gemma3"), seed=7)


@pytest.fixture(scope="module")
def gemma_oracle(gemma_folder) -> Oracle:
    return Oracle(gemma_folder)


@pytest.mark.parametrize("method,options", VARIANTS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(VARIANTS)])
def test_gemma3_matches_the_oracle(gemma_folder, gemma_oracle, method, options):
    emb = TorchEmbedder.from_pretrained(gemma_folder, method, **options)
    emb.padding_side = "right"
    encode = lambda texts, kind: emb.encode(texts, kind=kind, batch_size=4)  # noqa: E731
    assert_matches_oracle(encode, gemma_oracle, method, LONG, what="gemma3", **options)


def test_the_tiny_gemma3_runs_past_its_window_in_both_kinds_of_layer(gemma_oracle):
    """The test prompts are longer than the window, and both layer kinds are present."""
    ids = gemma_oracle.tokenize("kv-embedding", LONG[-1]).ids
    assert len(ids) > 4 * WINDOW
    assert {"sliding_attention", "full_attention"} == set(gemma_oracle.config["layer_types"])


def test_the_prefix_stays_visible_past_the_window(gemma_folder, gemma_oracle):
    """Re-routing only sliding layers still changes the first token of a long text (it sees the
    prefix, far outside its window), as the oracle says."""
    text = LONG[-1]
    plain = gemma_oracle.embed("kv-embedding", text, layers="none", pooling="mean")
    rerouted = gemma_oracle.embed("kv-embedding", text, layers="0,2,3", pooling="mean")
    assert not np.allclose(plain, rerouted)
    emb = TorchEmbedder.from_pretrained(gemma_folder, "kv-embedding", layers="0,2,3", pooling="mean")
    assert float(emb.encode([text])[0] @ rerouted) > 0.99999


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_gemma3_padding_invariance(gemma_folder, padding_side):
    emb = TorchEmbedder.from_pretrained(gemma_folder, "kv-embedding", layers="0-4", prefix_rope="zero")
    emb.padding_side = padding_side
    batched = emb.encode(LONG, batch_size=len(LONG))
    single = np.stack([emb.encode([t])[0] for t in LONG])
    assert np.abs(batched - single).max() < 1e-5


# ----- the real Gemma 3 270M (Q4_K_M GGUF from its five pip packages) -------------------------


@pytest.fixture(scope="module")
def gemma270m() -> TorchEmbedder:
    from kvembed.methods.models import packaged_part_files

    try:
        packaged_part_files("gemma3-270m")
    except FileNotFoundError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"the Gemma 3 270M packages are not installed ({err})")
    pytest.importorskip("gguf", reason="the gguf package (kvembed[gguf]) is not installed")
    return TorchEmbedder.from_pretrained("gemma3-270m", "kv-embedding", max_length=700)


def test_real_gemma3_270m_loads_from_gguf_and_matches_the_oracle(gemma270m):
    """The dequantized folder kvembed loads, read by the oracle itself: the default kv-embedding
    on a short text and on one longer than the 512-token window."""
    config = gemma270m.model.decoder.config
    assert config.model_type == "gemma3_text" and config.sliding_window == 512
    assert {"sliding_attention", "full_attention"} == set(config.layer_types)
    assert (Path(gemma270m.location) / "kvembed-gguf.json").is_file()  # the dequantized cache folder
    oracle = Oracle(gemma270m.location)
    long_text = "The history of the city, told street by street: " + "old houses, a river, a market, " * 60
    assert len(oracle.tokenize("kv-embedding", long_text).ids) > 512
    layers = ",".join(map(str, gemma270m.model.method.layers))
    texts = ["The cat sat on the mat.", long_text]
    assert_matches_oracle(
        lambda t, kind: gemma270m.encode(t, kind=kind, batch_size=2), oracle, "kv-embedding", texts,
        kinds=("document",), what="gemma3-270m", layers=layers,
    )


def test_real_gemma3_270m_has_real_semantics(gemma270m):
    v = gemma270m.encode(["The cat sat on the mat.", "A kitten was sitting on the rug.", "Stock markets fell sharply today."])
    assert v[0] @ v[1] > v[0] @ v[2]


# ----- the ONNX export of the tiny Gemma 3 (fp32) ----------------------------------------------


@pytest.mark.parametrize(
    "method,options",
    [("kv-embedding", {"layers": "0,2,4", "num_prefix": 2, "prefix_rope": "zero"}),
     ("token-prepending", {"tp_start": 0, "tp_stop": 3, "exit_layer": 4})],
    ids=["kv-embedding", "token-prepending"],
)
def test_gemma3_exports_through_the_parity_gate_and_matches_the_oracle(gemma_folder, gemma_oracle, tmp_path, method, options):
    """The exporter's own gate passes (it raises otherwise) and the artifact, run by the
    torch-free runtime, matches the oracle on texts longer than the window."""
    from kvembed.export.core import export
    from kvembed.runtime import Embedder

    out = export(str(gemma_folder), method, tmp_path / method, "fp32", **options)
    runtime = Embedder.load(out, provider="cpu")
    encode = lambda texts, kind: runtime.encode(texts, kind=kind, batch_size=4)  # noqa: E731
    assert_matches_oracle(encode, gemma_oracle, method, LONG[:4] + LONG[-1:], what="gemma3 onnx", **options)
