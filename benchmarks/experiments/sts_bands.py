"""Which kv-embedding re-routing band for a model: each band's Spearman on an STS file, with a
paired bootstrap of its difference to a reference band (by default the model's default band), so
that a small set's noise is shown instead of guessed.

    python benchmarks/experiments/sts_bands.py --model gemma3-270m --bands none,6-10,2-6,4-8,8-12,10-14,12-13,12-16,13-17 \
        --reference 6-10 --out benchmarks/results/eval/gemma3-bands-sts.json

Each band embeds both sides of every pair once with the PyTorch reference (fp32, the same
embedder ``kvembed eval`` runs for a model source); the score is mteb's STS main score,
Spearman of the gold scores vs ``1 - paired_cosine_distances`` (tests/test_eval.py checks that this
equals what ``kvembed eval`` reports). The bootstrap resamples the pairs (the same resample for
every band) and reports the 95% interval of each band's Spearman and of its difference to the
reference. Experiment script: it answered "does Gemma 3 270M need its own band preset".
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for args.py
from args import positive  # noqa: E402


def spearman(gold: np.ndarray, predicted: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(gold, predicted).statistic)


def cosines(model: str, band: str, first: list[str], second: list[str], batch_size: int) -> tuple[np.ndarray, list[int]]:
    """mteb's STS cosines of every pair for one band, and the band's resolved layers."""
    from sklearn.metrics.pairwise import paired_cosine_distances

    from kvembed.modeling.reference import TorchEmbedder

    embedder = TorchEmbedder.from_pretrained(model, "kv-embedding", layers=band)
    a = embedder.encode(first, kind="document", batch_size=batch_size)
    b = embedder.encode(second, kind="document", batch_size=batch_size)
    layers = list(embedder.method.layers)
    del embedder
    gc.collect()
    return 1 - paired_cosine_distances(a, b), layers


def interval(values: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in np.percentile(values, [2.5, 97.5])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--bands", required=True, help="bands separated by ',': 'none', 'auto' or ranges such as '6-10'")
    parser.add_argument("--reference", required=True, help="the band the others are compared with (one of --bands)")
    parser.add_argument("--task", default="sample-sts", help="an STS .tsv/.jsonl file or sample-sts")
    parser.add_argument("--rounds", type=positive, default=2000, help="bootstrap resamples")
    parser.add_argument("--batch-size", type=positive, default=32)
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    args = parser.parse_args(argv)
    bands = [b.strip() for b in args.bands.split(",") if b.strip()]
    if args.reference not in bands:
        parser.error(f"--reference {args.reference!r} is not one of --bands {bands}")

    from kvembed.eval.tasks import load_task, resolve_task_paths

    task = load_task(resolve_task_paths([args.task])[0])
    if task.kind != "sts":
        parser.error(f"{args.task} is a {task.kind} task; this script scores STS pairs")
    gold = np.asarray(task.data["score"], dtype=float)
    first, second = list(task.data["sentence1"]), list(task.data["sentence2"])
    rng = np.random.default_rng(0)
    samples = rng.integers(0, len(gold), size=(args.rounds, len(gold)))

    scores: dict[str, dict] = {}
    boot: dict[str, np.ndarray] = {}
    for band in bands:
        start = time.perf_counter()
        cos, layers = cosines(args.model, band, first, second, args.batch_size)
        boot[band] = np.array([spearman(gold[s], cos[s]) for s in samples])
        scores[band] = {"layers": layers, "spearman": round(spearman(gold, cos), 4), "ci95": interval(boot[band])}
        print(f"{band:>8}: {scores[band]['spearman']:.4f}  95% {scores[band]['ci95']}  "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    for band in bands:
        diff = boot[band] - boot[args.reference]
        scores[band]["minus_reference"] = round(scores[band]["spearman"] - scores[args.reference]["spearman"], 4)
        scores[band]["minus_reference_ci95"] = interval(diff)
        scores[band]["share_of_resamples_above_reference"] = round(float((diff > 0).mean()), 3)
    report = {"model": args.model, "task": str(task.path), "pairs": len(gold), "rounds": args.rounds,
              "reference": args.reference, "bands": scores}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\n| band | layers | Spearman | 95% CI | minus {args.reference} | 95% CI of the difference |")
    print("|---|---|---:|---|---:|---|")
    for band, s in scores.items():
        print(f"| {band} | {s['layers'] or '—'} | {s['spearman']:.4f} | {s['ci95']} | {s['minus_reference']:+.4f} | "
              f"{s['minus_reference_ci95']} |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
