"""Rows per graph call at a fixed padded batch: time and peak RSS of one B x S batch run whole or
in row slices (``Embedder.load(max_call_tokens=rows x S)``), each setting a fresh process, the
settings interleaved over rounds.

    python benchmarks/experiments/call_slices.py ARTIFACT --batch 16 --seq 512 --rows 16,4,2 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, time
sys.path.insert(0, {root!r})
from kvembed.runtime import Embedder
from kvembed.bench.measure import peak_rss_mb
from kvembed.bench.workload import exact_rows, make_batch

artifact, provider, batch, seq, rows = {args!r}
embedder = Embedder.load(artifact, provider=provider, threads=2, verify=False, max_call_tokens=rows * seq)
feeds = make_batch(embedder.encoder, exact_rows(embedder.encoder, seq, batch), batch).inputs
embedder.run(feeds)  # warm-up
times = []
for _ in range(2):
    start = time.perf_counter()
    embedder.run(feeds)
    times.append(time.perf_counter() - start)
print(json.dumps({{"seconds": min(times), "peak_rss_mb": peak_rss_mb()}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rows", default="16,4,2", help="rows per call to compare (the first is the baseline)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    settings = [int(r) for r in args.rows.split(",")]
    results: dict[int, list[dict]] = {rows: [] for rows in settings}
    for _ in range(args.rounds):
        for rows in settings:
            code = CHILD.format(root=str(ROOT), args=(args.artifact, args.provider, args.batch, args.seq, rows))
            out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
            results[rows].append(json.loads(out.strip().splitlines()[-1]))
    tokens = args.batch * args.seq
    base = statistics.median(r["seconds"] for r in results[settings[0]])
    print(f"| rows per call | tokens/s (rounds) | vs {settings[0]} rows | peak RSS MB |\n|---|---|---:|---:|")
    for rows in settings:
        runs = results[rows]
        speeds = ", ".join(f"{tokens / r['seconds']:.0f}" for r in runs)
        seconds = statistics.median(r["seconds"] for r in runs)
        print(f"| {rows} | {speeds} | {base / seconds:.2f}x | {max(r['peak_rss_mb'] for r in runs):,.0f} |")


if __name__ == "__main__":
    main()
