"""One-by-one vs batched throughput of the torch-free runtime on the demo model.

Exports stories260k (fp32) to a temporary artifact, then embeds the same corpus one text per call
and in token-budget batches. Run: python benchmarks/runtime_throughput.py [--method kv-embedding]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
import warnings
from pathlib import Path

from kvembed.export import export
from kvembed.runtime import Embedder


def corpus(count: int, max_words: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "the a little cat dog girl boy ran sat played happy park sun tree home ball big red".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, max_words))) for _ in range(count)]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", default="kv-embedding")
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-words", type=int, default=120)
    args = parser.parse_args()
    texts = corpus(args.texts, args.max_words)
    with tempfile.TemporaryDirectory() as tmp:
        embedder = Embedder.load(export("stories260k", args.method, Path(tmp) / "a"), provider="cpu", threads=args.threads)
        warnings.simplefilter("ignore")  # long texts are truncated on purpose
        embedder.encode(texts[:64])  # warm-up
        tokens = sum(len(item.ids) for item in embedder.encoder.encode(texts))
        single = timed(lambda: [embedder.encode([t]) for t in texts])
        print(f"{args.method} on stories260k, {len(texts)} texts of 3..{args.max_words} words, {tokens} tokens, {args.threads} threads")
        print(f"| mode | seconds | texts/s | tokens/s |\n|---|---|---|---|")
        print(f"| one by one | {single:.2f} | {len(texts) / single:.0f} | {tokens / single:.0f} |")
        for batch_size, max_tokens in ((8, None), (32, None), (128, None), (64, 8192)):
            seconds = timed(lambda: embedder.encode(texts, batch_size=batch_size, max_tokens=max_tokens))
            label = f"batch {batch_size}" + (f", max_tokens {max_tokens}" if max_tokens else "")
            print(f"| {label} | {seconds:.2f} | {len(texts) / seconds:.0f} | {tokens / seconds:.0f} |")


if __name__ == "__main__":
    main()
