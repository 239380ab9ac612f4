"""CPU per text when a few texts of spread-out lengths run merged (as one Triton or serve batch does).

    python benchmarks/experiments/merged_calls.py ARTIFACT [--texts 48] [--threads 1] [--rounds 2]

The texts are triton_bench's corpus (3-40 words). Settings, interleaved over rounds in one process:
one text per call (no padding at all), then all texts through the runtime's planner
(``plan_batches``: length-sorted) under token budgets of 256-4,096 padded tokens per call, and the
4,096 budget with ``max_padding`` 0.1. Reports process CPU seconds per text (the least over
rounds), the ratio to one text per call, and the planned padded/real tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for its harnesses
from triton_bench import corpus  # noqa: E402

from kvembed.runtime import Embedder  # noqa: E402
from kvembed.runtime.batching import plan_batches  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--texts", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads (Triton's default: 1)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    embedder = Embedder.load(args.artifact, threads=args.threads, max_call_tokens=None)
    texts = corpus(args.texts, seed=1)
    rows = embedder.encoder.encode(texts, "document")
    lengths = [len(row.ids) for row in rows]

    def merged(budget: int, padding: float | None) -> Callable[[], None]:
        plan = plan_batches(lengths, 64, budget, padding)

        def run() -> None:
            for chunk in plan:
                embedder.run(embedder.encoder.pad([rows[i] for i in chunk]))
        run.padded = sum(len(c) * max(lengths[i] for i in c) for c in plan) / sum(lengths)  # type: ignore[attr-defined]
        return run

    def one_by_one() -> None:
        for row in rows:
            embedder.run(embedder.encoder.pad([row]))
    one_by_one.padded = 1.0  # type: ignore[attr-defined]

    settings = {"one text per call": one_by_one,
                **{f"merged, {b} tokens": merged(b, None) for b in (256, 512, 1024, 2048, 4096)},
                "merged, 4096 tokens, max_padding 0.1": merged(4096, 0.1)}
    embedder.run(embedder.encoder.pad(rows[:2]))  # warm-up
    cpu: dict[str, list[float]] = {name: [] for name in settings}
    for round_ in range(args.rounds):
        for name, run in settings.items():
            start = time.process_time()
            run()
            cpu[name].append((time.process_time() - start) / len(texts))
            print(f"round {round_}: {name}: {cpu[name][-1] * 1000:.1f} ms CPU per text", flush=True)
    base = min(cpu["one text per call"])
    print(f"\n{len(texts)} texts of {min(lengths)}-{max(lengths)} tokens, {args.threads} thread(s)\n")
    print("| setting | CPU ms per text | vs one per call | padded / real tokens |\n|---|---:|---:|---:|")
    for name, run in settings.items():
        print(f"| {name} | {min(cpu[name]) * 1000:.1f} | {min(cpu[name]) / base:.2f}x | {run.padded:.3f} |")  # type: ignore[attr-defined]
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"artifact": str(args.artifact), "threads": args.threads, "lengths": lengths,
                                        "cpu_s_per_text": cpu,
                                        "padded_over_real": {n: r.padded for n, r in settings.items()}}, indent=2))  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
