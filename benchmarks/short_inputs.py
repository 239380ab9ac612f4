"""Short inputs: the default path (a bf16 artifact on OpenVINO bf16) against onnxruntime fp32, interleaved.

    python benchmarks/short_inputs.py --bf16 ART_BF16 [--fp32 ART_FP32] --rounds 30 --out DIR

Every workload is ``Embedder.encode`` end to end (tokeniser, batch plan, padding, the graph calls,
normalisation), as a user calls it: ``16 short`` is sixteen short real texts of spread-out lengths
as queries (kvembed's gate and held-out short texts, then sample STS sentences), ``1x8`` and
``1x32`` one text of exactly that many tokens (prompt included; a prompt longer than 8
tokens makes the first the prompt alone, named by its real length), ``16x128`` the long reference
shape. ``bf16`` is ``Embedder.load(ART_BF16)`` (provider auto: OpenVINO bf16 on a CPU with BF16);
``fp32`` is onnxruntime's CPU provider on ``ART_FP32`` (default: the bf16 artifact itself, which
holds the fp32 graph). The two take turns call by call (A B A B) for ``--rounds`` rounds; a ratio is
the median of per-round ratios, so both sides of a round see the same machine. Process CPU seconds
per call are kept beside wall seconds: on a shared machine the wall ratio also measures how each
backend's threads fare against the other processes, the CPU ratio less so. The load average at the
start and end goes into the record (``benchmarks/record.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

from record import figure, write_record  # benchmarks/record.py, beside this script

from kvembed.bench.measure import cosine_rows, interleaved
from kvembed.bench.workload import exact_rows
from kvembed.export.gate.texts import load_gate_texts
from kvembed.runtime import Embedder

TASKS = Path(__file__).resolve().parents[1] / "src" / "kvembed" / "data" / "tasks" / "sample-sts.tsv"
#: the gate texts' groups the short workload takes first
SHORT_GROUPS = ("queries", "short")
SHORT_COUNT = 16
#: the shaped workloads asked for (rows x tokens, prompt included)
SHAPES = ((1, 8), (1, 32), (16, 128))


def short_texts(count: int = SHORT_COUNT) -> list[str]:
    """``count`` short real texts: the gate's queries and the held-out short texts (spread-out
    lengths, several languages), then distinct sample STS sentences."""
    texts = [t.text for t in load_gate_texts() if t.group in SHORT_GROUPS]
    for line in TASKS.read_text(encoding="utf-8").splitlines()[1:]:
        texts.extend(line.split("\t")[:2])
    return list(dict.fromkeys(texts))[:count]


def workloads(encoder: Any) -> dict[str, list[str]]:
    """name -> the texts one ``encode`` call embeds."""
    shaped = {}
    for batch, tokens in SHAPES:
        rows = exact_rows(encoder, tokens, batch, kind="query")
        shaped[f"{batch}x{max(rows.lengths)}"] = list(rows.texts)  # named as run: 1 x 8 is the prompt alone where that is longer
    return {"16 short": short_texts(), **shaped}


def timed_cpu(call: Callable[[], Any], into: list[float]) -> Callable[[], Any]:
    """``call``, appending the process CPU seconds each call took to ``into``."""
    def run() -> Any:
        start = time.process_time()
        out = call()
        into.append(time.process_time() - start)
        return out
    return run


def ratio(slow: list[float], fast: list[float]) -> float:
    return statistics.median(s / f for s, f in zip(slow, fast))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bf16", type=Path, required=True, help="bf16 artifact (run as Embedder.load(dir) runs it)")
    parser.add_argument("--fp32", type=Path, help="fp32 artifact for onnxruntime (default: --bf16's fp32 graph)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="inference threads of both (default: each backend's own)")
    parser.add_argument("--only", nargs="*", help="workload names to run (default: all)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    load_start = os.getloadavg()
    fast = Embedder.load(args.bf16, threads=args.threads, verify=False)
    base = Embedder.load(args.fp32 or args.bf16, provider="cpu", threads=args.threads, verify=False)
    names = {"bf16": f"bf16 ({fast.target})", "fp32": f"fp32 ({base.target})"}
    cells: dict[str, Any] = {}
    for name, texts in workloads(base.encoder).items():
        if args.only and name not in args.only:
            continue
        lengths = [len(e.ids) for e in base.encoder.encode(texts, "query")]
        cosine = float(cosine_rows(fast.encode(texts, kind="query"), base.encode(texts, kind="query")).min())
        cpu: dict[str, list[float]] = {"bf16": [], "fp32": []}
        calls = {key: timed_cpu(lambda e=e: e.encode(texts, kind="query"), cpu[key]) for key, e in (("bf16", fast), ("fp32", base))}
        wall = interleaved(calls, rounds=args.rounds, warmup=2)
        cpu = {key: values[-args.rounds:] for key, values in cpu.items()}  # the warm-up calls were timed too
        cell = {
            "tokens": lengths, "rounds": args.rounds, "worst_cosine": cosine,
            "wall_ratio": ratio(wall["fp32"], wall["bf16"]), "cpu_ratio": ratio(cpu["fp32"], cpu["bf16"]),
            **{f"{key}_p50_ms": 1e3 * statistics.median(wall[key]) for key in names},
            **{f"{key}_cpu_p50_ms": 1e3 * statistics.median(cpu[key]) for key in names},
            "wall_seconds": wall, "cpu_seconds": cpu,
        }
        cells[name] = cell
        print(f"{name:>9}  {names['bf16']} / {names['fp32']}: wall x{cell['wall_ratio']:.2f} "
              f"(p50 {cell['bf16_p50_ms']:.1f} vs {cell['fp32_p50_ms']:.1f} ms), CPU x{cell['cpu_ratio']:.2f}, "
              f"worst cosine {cosine:.6f}, tokens {min(lengths)}-{max(lengths)}", flush=True)
    load_end = os.getloadavg()
    print(f"load average: start {load_start}, end {load_end} ({os.cpu_count()} cores)")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"backends": names, "load_average_start": load_start, "load_average_end": load_end, "cells": cells}
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    figures = {}
    for name, cell in cells.items():
        figures[f"{name} bf16 / fp32 wall"] = figure(cell["wall_ratio"], "x")
        figures[f"{name} bf16 / fp32 CPU"] = figure(cell["cpu_ratio"], "x")
        figures[f"{name} worst cosine bf16 vs fp32"] = figure(cell["worst_cosine"], "cosine")
    write_record("short_inputs", figures, backends=names, load_average_start=list(load_start),
                 load_average_end=list(load_end), output=str(args.out))


if __name__ == "__main__":
    main()
