"""Shared fixtures: tiny random models of every supported architecture, and the demo model.

Tiny models are built from transformers configs, given non-trivial norm weights (so Qwen3's
q_norm/k_norm matter) and a larger init scale (so attention is not flat), saved with
``save_pretrained`` and reloaded from the folder like any user model. They share the demo
model's byte-level tokenizer.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from kvembed.methods import demo_model_path

ARCHITECTURES = ("llama", "qwen3", "qwen2", "mistral")
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
LLAMA2_TOKENIZER = SHARED / "models" / "llama2-tokenizer"

TEXTS = [
    "A man is playing a guitar.",
    "hi",
    "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill.",
    "Ünïcödé — 東京 🎉 works?",
    "Why is the sky blue?",
    'She said "no" twice.',
]


def tiny_config(arch: str):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=300,
        max_position_embeddings=256,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen3":
        return Qwen3Config(**common)
    if arch == "qwen2":
        common.pop("head_dim")  # Qwen2 derives head_dim = hidden_size / heads = 16
        return Qwen2Config(**common)
    if arch == "mistral":
        return MistralConfig(**common)
    raise ValueError(arch)


def build_tiny_model(arch: str, folder: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    demo = demo_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """arch -> folder of a saved tiny random model with the demo tokenizer."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: build_tiny_model(arch, root / arch, seed=i) for i, arch in enumerate(ARCHITECTURES)}


@pytest.fixture(scope="session")
def model_paths(tiny_models) -> dict[str, Path]:
    """Every test model: the four tiny architectures and the real stories260k."""
    return {**tiny_models, "stories260k": demo_model_path()}


@pytest.fixture(scope="session")
def llama2_tokenizer_path() -> Path:
    if not (LLAMA2_TOKENIZER / "tokenizer.json").is_file():
        pytest.skip(f"the Llama 2 tokenizer is not at {LLAMA2_TOKENIZER} (it lives in ../shared, not in the repo)")
    return LLAMA2_TOKENIZER
