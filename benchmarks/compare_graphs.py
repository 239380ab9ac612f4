"""Interleaved A/B of exported artifacts on the same raw token batch (e.g. before/after a graph rewrite).

    python benchmarks/compare_graphs.py A_DIR B_DIR [...] --batch 16 --seq 128 --rounds 5

Prints each artifact's median ms per call and the median over rounds of its time / the first's.
With ``--memory`` each artifact instead runs once in a fresh process per arena setting and the
process's RSS after loading, at its peak and after the call is printed (the memory_arena option).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from kvembed.bench.measure import current_rss_mb, interleaved, peak_rss_mb, ratio
from kvembed.bench.workload import raw_token_batch
from kvembed import OnnxRuntimeOptions
from kvembed.runtime import Embedder


def memory_probe(artifact: str, batch: int, seq: int, threads: int, arena: bool) -> dict:
    """Run in a fresh process: RSS (MB) after load, peak, and after one call."""
    embedder = Embedder.load(artifact, provider="cpu", threads=threads, verify=False, options=OnnxRuntimeOptions(memory_arena=arena))
    loaded = current_rss_mb()
    embedder.run(raw_token_batch(embedder.encoder, batch, seq))
    return {"arena": arena, "after_load_mb": loaded, "peak_mb": peak_rss_mb(), "after_call_mb": current_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifacts", nargs="+")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory", action="store_true", help="RSS with the memory arena on and off instead of time")
    parser.add_argument("--probe", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(memory_probe(args.artifacts[0], args.batch, args.seq, args.threads, args.probe == "on")))
        return
    if args.memory:
        for artifact in args.artifacts:
            for arena in ("on", "off"):
                command = [sys.executable, __file__, artifact, "--probe", arena, "--batch", str(args.batch),
                           "--seq", str(args.seq), "--threads", str(args.threads)]
                print(artifact, subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip())
        return
    embedders = {a: Embedder.load(a, provider="cpu", threads=args.threads, verify=False) for a in args.artifacts}
    feeds = raw_token_batch(next(iter(embedders.values())).encoder, args.batch, args.seq)
    times = interleaved({a: (lambda e=e: e.run(feeds)) for a, e in embedders.items()}, rounds=args.rounds)
    first = args.artifacts[0]
    for artifact in args.artifacts:
        print(f"{Path(artifact).name:>24s} {args.batch}x{args.seq}: median {1e3 * statistics.median(times[artifact]):9.1f} ms"
              f"  ratio to first {ratio(times, artifact, first):.3f}")


if __name__ == "__main__":
    main()
