"""Build a random-weight model with a real Qwen3's widths, to benchmark without downloading it.

Latency and memory depend on the shape, not the weights. Examples:

    python benchmarks/make_qwen3_06b_shaped.py --layers 8 --out /tmp/qwen3-0.6b-shaped
    kvembed bench --model /tmp/qwen3-0.6b-shaped --method kv-embedding --out /tmp/bench-qwen3
    python benchmarks/make_qwen3_06b_shaped.py --shape 4b --layers 8 --sharded-bf16 --out /tmp/qwen3-4b-shaped

The real Qwen3-0.6B has 28 layers (hidden 1024, 16 query / 8 key-value heads of 128, FFN 3072),
Qwen3-4B 36 (hidden 2560, 32 / 8 heads of 128, FFN 9728); their 151,936-token vocabulary is
replaced by the demo model's byte-level tokenizer (259 tokens) unless ``--vocab`` says otherwise,
which changes only the embedding lookup, not the FLOPs of the decoder layers.

``--sharded-bf16`` writes the checkpoint as real 4B-8B ones ship: bf16 safetensors shards and a
``model.safetensors.index.json``, generated and written one shard at a time, so building a model
never needs its whole size in memory (:func:`write_sharded_bf16`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Iterator

from kvembed.bench.synthetic import QWEN3_06B, build_random_model, copy_demo_tokenizer, tokenizer_folder

#: Qwen3-4B's decoder widths (its config.json); 36 layers and a 151,936-token tied embedding in the real model
QWEN3_4B = {"hidden": 2560, "heads": 32, "kv_heads": 8, "head_dim": 128, "ffn": 9728}
SHAPES = {"0.6b": QWEN3_06B, "4b": QWEN3_4B}
#: the largest shard written (real checkpoints use a few GB; smaller keeps the builder's memory small)
DEFAULT_SHARD_BYTES = 1024**3


def qwen3_config(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                 vocab: int, max_positions: int) -> "object":
    """A Qwen3 config of these widths, tied embedding, bf16 as the checkpoint's declared dtype."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=max_positions, initializer_range=0.02, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, dtype="bfloat16",
        architectures=["Qwen3ForCausalLM"],  # as real checkpoints ship it: converters (llama.cpp's) read it
    )


def tensor_shapes(config: "object") -> Iterator[tuple[str, tuple[int, ...]]]:
    """The names and shapes of a Qwen3 checkpoint's tensors, embedding first, layer by layer
    (``lm_head`` is tied to the embedding and not stored)."""
    hidden, ffn = config.hidden_size, config.intermediate_size
    q, kv, d = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim, config.head_dim
    yield "model.embed_tokens.weight", (config.vocab_size, hidden)
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        yield from (
            (prefix + "input_layernorm.weight", (hidden,)), (prefix + "post_attention_layernorm.weight", (hidden,)),
            (prefix + "self_attn.q_proj.weight", (q, hidden)), (prefix + "self_attn.k_proj.weight", (kv, hidden)),
            (prefix + "self_attn.v_proj.weight", (kv, hidden)), (prefix + "self_attn.o_proj.weight", (hidden, q)),
            (prefix + "self_attn.q_norm.weight", (d,)), (prefix + "self_attn.k_norm.weight", (d,)),
            (prefix + "mlp.gate_proj.weight", (ffn, hidden)), (prefix + "mlp.up_proj.weight", (ffn, hidden)),
            (prefix + "mlp.down_proj.weight", (hidden, ffn)),
        )
    yield "model.norm.weight", (hidden,)


def _shards(config: "object", shard_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Tensors grouped into shards of at most ``shard_bytes`` bf16 bytes (a bigger tensor alone)."""
    import math

    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in tensor_shapes(config):
        nbytes = 2 * math.prod(shape)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    return shards


def write_sharded_bf16(out: str | os.PathLike[str], config: "object", *, seed: int = 0,
                       shard_bytes: int = DEFAULT_SHARD_BYTES, tokenizer: str | None = None) -> Path:
    """Write random bf16 weights for ``config`` as safetensors shards with their index, one shard
    in memory at a time: matrices normal(0, initializer_range) as transformers initialises them,
    norm weights one. Returns ``out``; config.json and the demo tokenizer are written too."""
    import torch
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    groups = _shards(config, shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for index, group in enumerate(groups, 1):
        file = f"model-{index:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for name, shape in group:
            if len(shape) == 1:
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                tensors[name] = (torch.randn(shape, generator=generator) * config.initializer_range).to(torch.bfloat16)
            weight_map[name] = file
            total += tensors[name].numel() * 2
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        del tensors
    index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index_json, indent=2) + "\n", encoding="utf-8")
    config.save_pretrained(out)
    copy_demo_tokenizer(out, config.max_position_embeddings, tokenizer)
    return out


def build_sharded(out: str | os.PathLike[str], shape: str = "4b", layers: int = 8, vocab: int | None = None,
                  max_positions: int = 4096, seed: int = 0, shard_bytes: int = DEFAULT_SHARD_BYTES,
                  tokenizer: str | None = None) -> Path:
    """A random Qwen3 of ``shape``'s widths as a sharded bf16 checkpoint (the tokenizer's
    vocabulary by default; the demo's byte-level tokenizer unless ``tokenizer`` names a model)."""
    from tokenizers import Tokenizer

    from kvembed.bench.synthetic import tokenizer_folder
    from kvembed.methods import demo_model_path

    origin = demo_model_path() if tokenizer is None else tokenizer_folder(tokenizer)
    tokenizer_size = Tokenizer.from_file(str(origin / "tokenizer.json")).get_vocab_size()
    vocab = int(vocab or tokenizer_size)
    if vocab < tokenizer_size:
        raise ValueError(f"vocab {vocab} is smaller than the tokenizer's {tokenizer_size} tokens")
    config = qwen3_config(layers, vocab=vocab, max_positions=max_positions, **SHAPES[shape])
    return write_sharded_bf16(out, config, seed=seed, shard_bytes=shard_bytes, tokenizer=tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Model folder to write.")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.6b", help="Whose widths: Qwen3-0.6B or Qwen3-4B.")
    parser.add_argument("--layers", type=int, default=8, help="Decoder layers (Qwen3-0.6B has 28, Qwen3-4B 36).")
    parser.add_argument("--max-positions", type=int, default=4096, help="max_position_embeddings (>= 2048).")
    parser.add_argument("--sharded-bf16", action="store_true", help="bf16 safetensors shards + index, written shard by shard.")
    parser.add_argument("--vocab", type=int, default=None, help="Vocabulary size (default: the demo tokenizer's).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default=None,
                        help="With --sharded-bf16: copy this model's tokenizer (folder, alias such as smollm2-135m, or "
                             "GGUF) instead of the demo's byte-level one, for a real tokenizer's tokens per text.")
    args = parser.parse_args()
    if args.tokenizer is not None:  # before any weight is written
        try:
            tokenizer_folder(args.tokenizer)
        except FileNotFoundError as err:
            parser.error(str(err))
    start = time.perf_counter()
    if args.sharded_bf16:
        path = build_sharded(args.out, args.shape, args.layers, args.vocab, args.max_positions, args.seed,
                             tokenizer=args.tokenizer)
    else:
        path = build_random_model(args.out, layers=args.layers, max_positions=args.max_positions, seed=args.seed,
                                  vocab_size=args.vocab, **SHAPES[args.shape])
    print(f"wrote a random Qwen3 ({args.layers} layers, {SHAPES[args.shape]}) to {path} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
