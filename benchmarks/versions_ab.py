"""Interleaved A/B of two kvembed checkouts on one artifact, through the public API only.

    python benchmarks/versions_ab.py ARTIFACT BEFORE_CHECKOUT AFTER_CHECKOUT --rounds 5

For a refactor that must not slow the runtime: each round runs one fresh process per checkout
(``PYTHONPATH`` = the checkout, so ``import kvembed`` loads its code), in turns, and each process
times ``Embedder.load(...).encode`` on the same texts: a mixed-length corpus (the batch planner's
case), 16 texts of equal length (one padded batch), and one short text at a time (latency). The
table shows each cell's median over rounds and the median of the per-round ratio after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

WORDS = ("the model reads every token of the text once and the last one sees them all so its state "
         "summarises what came before while a prefix lets early tokens look ahead too").split()


def texts(count: int, words: tuple[int, int], seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))) for _ in range(count)]


def worker(artifact: str, repeats: int) -> dict[str, float]:
    """Seconds per cell in this process (best of ``repeats``), after one warm-up call each."""
    from kvembed.runtime import Embedder

    embedder = Embedder.load(artifact, provider="cpu", verify=False)
    cells = {
        "mixed 64 texts": lambda: embedder.encode(texts(64, (2, 120), 1), batch_size=32),
        "16 x ~100 words": lambda: embedder.encode(texts(16, (100, 100), 2), batch_size=16),
        "1 text x 20": lambda: [embedder.encode(text) for text in texts(20, (8, 16), 3)],
    }
    out = {}
    for name, call in cells.items():
        call()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - start)
        out[name] = best
    import kvembed

    out["kvembed"] = kvembed.__file__
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact")
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.artifact, args.repeats)))
        return
    results: dict[str, list[dict]] = {"before": [], "after": []}
    for round_ in range(args.rounds):
        order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
        for side in order:
            env = {**os.environ, "PYTHONPATH": getattr(args, side)}
            command = [sys.executable, __file__, args.artifact, "-", "-", "--worker", "--repeats", str(args.repeats)]
            line = subprocess.run(command, env=env, check=True, capture_output=True, text=True, cwd="/").stdout.strip().splitlines()[-1]
            results[side].append(json.loads(line))
    print(f"kvembed before: {results['before'][0]['kvembed']}\nkvembed after:  {results['after'][0]['kvembed']}")
    print(f"{'cell':>18s} {'before ms':>10s} {'after ms':>10s} {'after/before':>13s}")
    for cell in (k for k in results["before"][0] if k != "kvembed"):
        before = [r[cell] for r in results["before"]]
        after = [r[cell] for r in results["after"]]
        ratios = [a / b for a, b in zip(after, before)]
        print(f"{cell:>18s} {1e3 * statistics.median(before):10.1f} {1e3 * statistics.median(after):10.1f} "
              f"{statistics.median(ratios):13.3f}")


if __name__ == "__main__":
    main()
