"""Random-weight checkpoints shaped as a real model of each family, for the precision bars.

Each entry of :data:`FAMILY_SHAPES` is the part of a published checkpoint's ``config.json`` that
shapes its computation (widths, heads, norms, RoPE, multipliers, biases), keyed by kvembed's
architecture name. :func:`build` writes one with fewer layers (the bars are per layer: a layer's
precision loss compounds, its kind does not change), the demo tokenizer's vocabulary in place of
the real one (only the embedding lookup changes), randomised norm weights and biases (so each
matters, as trained ones do), and bf16 safetensors shards with an index, as such checkpoints ship.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

#: family -> (the checkpoint it is shaped as, the config.json fields that shape it)
FAMILY_SHAPES: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "qwen2": ("Qwen/Qwen2.5-0.5B", dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3": ("Qwen/Qwen3-0.6B", dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)),
    "mistral": ("mistralai/Mistral-7B-v0.3", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None,
        tie_word_embeddings=False)),
    "granite": ("ibm-granite/granite-3.1-2b-instruct", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=40, num_attention_heads=32,
        num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=5000000.0, attention_bias=False, mlp_bias=False,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=8.0,
        tie_word_embeddings=True)),
    "olmo2": ("allenai/OLMo-2-0425-1B", dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=16, rms_norm_eps=1e-6, rope_theta=500000.0, attention_bias=False,
        tie_word_embeddings=False)),
    "phi3": ("microsoft/Phi-3-mini-4k-instruct", dict(
        hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, sliding_window=2047,
        original_max_position_embeddings=4096, tie_word_embeddings=False)),
    "stablelm": ("stabilityai/stablelm-2-1_6b", dict(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, layer_norm_eps=1e-5, rope_theta=10000.0, partial_rotary_factor=0.25,
        use_qkv_bias=True, qk_layernorm=False, use_parallel_residual=False, hidden_act="silu",
        tie_word_embeddings=False)),
    "cohere": ("CohereForAI/aya-23-8B", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, layer_norm_eps=1e-5, logit_scale=0.125, rope_theta=10000.0, use_qk_norm=False,
        tie_word_embeddings=True)),
    "gemma2": ("google/gemma-2-2b", dict(
        hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256, rms_norm_eps=1e-6, rope_theta=10000.0,
        sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)),
}


def build(family: str, out: Path, layers: int = 4, seed: int = 0, shard: str = "400MB") -> Path:
    """Write a random checkpoint shaped as ``family``'s entry, with ``layers`` layers, into ``out``."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from kvembed.bench.synthetic import copy_demo_tokenizer
    from kvembed.methods import demo_model_path

    checkpoint, fields = FAMILY_SHAPES[family]
    vocab = Tokenizer.from_file(str(demo_model_path() / "tokenizer.json")).get_vocab_size()
    config = AutoConfig.for_model(family, **{**fields, "num_hidden_layers": min(layers, fields["num_hidden_layers"]),
                                             "vocab_size": vocab, "max_position_embeddings": 4096,
                                             "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.02)
    model.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()
    model.save_pretrained(out, max_shard_size=shard)
    copy_demo_tokenizer(out, 4096)
    (out / "README.md").write_text(f"Random weights shaped as {checkpoint} ({config.num_hidden_layers} of its "
                                   f"{fields['num_hidden_layers']} layers), built by benchmarks/shape_alike.py.\n")
    return out
