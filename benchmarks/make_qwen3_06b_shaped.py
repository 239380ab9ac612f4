"""Build a random-weight model with Qwen3-0.6B's widths, to benchmark without downloading it.

Latency and memory depend on the shape, not the weights. Example:

    python benchmarks/make_qwen3_06b_shaped.py --layers 8 --out /tmp/qwen3-0.6b-shaped
    kvembed bench --model /tmp/qwen3-0.6b-shaped --method kv-embedding --out /tmp/bench-qwen3

The real Qwen3-0.6B has 28 layers (hidden 1024, 16 query / 8 key-value heads of 128, FFN 3072);
its 151,936-token vocabulary is replaced by the demo model's byte-level tokenizer (259 tokens),
which changes only the embedding lookup, not the FLOPs of the decoder layers.
"""

from __future__ import annotations

import argparse
import time

from kvembed.bench.synthetic import QWEN3_06B, build_random_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Model folder to write.")
    parser.add_argument("--layers", type=int, default=8, help="Decoder layers (Qwen3-0.6B has 28).")
    parser.add_argument("--max-positions", type=int, default=4096, help="max_position_embeddings (>= 2048).")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    path = build_random_model(args.out, layers=args.layers, max_positions=args.max_positions, seed=args.seed, **QWEN3_06B)
    print(f"wrote a random Qwen3 ({args.layers} layers, {QWEN3_06B}) to {path} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
