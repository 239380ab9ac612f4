"""How fast a model's fp32 weight GEMMs run at a few rows, in onnxruntime and in PyTorch.

    python benchmarks/experiments/small_m_gemms.py ARTIFACT [--rows 32] [--rounds 20] [--threads 2] [--out DIR]

At batch 1 x 32 an embedding call is mostly its weight MatMuls at M = 32 rows. This times, in one
interleaved loop: the artifact's fp32 weight MatMuls alone in onnxruntime (as goals.py's P1 floor),
``torch.matmul`` over the same weights and inputs, and the 2048^3 onnxruntime GEMM (the peak). It
prints each side's GFLOP/s, its share of the peak and the rate its weights stream at, beside the
two-thread read rate of a 1 GiB tensor (``torch.sum``), so a latency floor can be told apart from
a bandwidth one.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
import torch
import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for args.py
from args import positive  # noqa: E402

from kvembed.bench.measure import interleaved, time_calls
from kvembed.bench.peak import fp32_matmul_weights, gemm_call, matmuls_call
from kvembed.bench.report import machine_info
from kvembed.artifact import MODEL


def read_rate_gbs(threads: int, gib: int = 1) -> float:
    """GB/s of ``torch.sum`` over a ``gib`` GiB fp32 tensor with ``threads`` threads (best of 5)."""
    torch.set_num_threads(threads)
    data = torch.ones(gib * 2**28, dtype=torch.float32)
    best = min(time_calls(data.sum, warmup=1, min_repeats=5, min_seconds=0.0, max_repeats=5))
    return data.numel() * 4 / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path, help="an fp32 kvembed artifact (its model.onnx is read)")
    parser.add_argument("--rows", type=positive, default=32, help="rows (tokens) per GEMM")
    parser.add_argument("--rounds", type=positive, default=20)
    parser.add_argument("--threads", type=positive, default=2)
    parser.add_argument("--out", type=Path, help="also write results.json here")
    args = parser.parse_args()
    model = args.artifact / MODEL
    if not model.is_file():
        parser.error(f"{args.artifact} has no {MODEL}: give an artifact folder written by kvembed-export")

    torch.set_num_threads(args.threads)
    try:
        weights = fp32_matmul_weights(model)
    except ValueError as err:
        parser.error(str(err))
    ort_call, flops = matmuls_call(weights, args.rows, args.threads, "weight_gemms")  # = weight_gemms_call
    tensors = [torch.tensor(w) for w in weights]  # a copy: the arrays onnx gives are read-only
    rng = np.random.default_rng(0)
    inputs = {k: torch.from_numpy(rng.standard_normal((args.rows, k), dtype=np.float32))
              for k in sorted({w.shape[0] for w in weights})}

    def torch_call() -> None:
        with torch.inference_mode():
            for w in tensors:
                torch.matmul(inputs[w.shape[0]], w)

    gemm, gemm_flops = gemm_call(args.threads, 2048)
    times = interleaved({"onnxruntime": ort_call, "torch": torch_call, "gemm": gemm}, rounds=args.rounds, warmup=3)
    peak = gemm_flops / statistics.median(times["gemm"]) / 1e9
    weight_bytes = sum(w.nbytes for w in weights)
    results = {"machine": machine_info(args.threads), "artifact": str(args.artifact), "rows": args.rows,
               "rounds": args.rounds, "matmuls": len(weights), "weight_mb": weight_bytes / 1e6,
               "gemm_peak_gflops": peak, "read_rate_gbs": read_rate_gbs(args.threads), "sides": {}}
    print(f"{len(weights)} fp32 weight MatMuls ({weight_bytes / 1e6:.0f} MB) at {args.rows} rows; "
          f"GEMM peak {peak:.1f} GFLOP/s; {args.threads}-thread read rate {results['read_rate_gbs']:.1f} GB/s")
    for side in ("onnxruntime", "torch"):
        seconds = statistics.median(times[side])
        share = statistics.median((flops / a) / (gemm_flops / g) for a, g in zip(times[side], times["gemm"]))
        results["sides"][side] = {"ms": seconds * 1e3, "gflops": flops / seconds / 1e9, "share_of_peak": share,
                                  "weights_gbs": weight_bytes / seconds / 1e9}
        row = results["sides"][side]
        print(f"  {side:12s} {row['ms']:7.1f} ms  {row['gflops']:6.1f} GFLOP/s  {share:.2f} of peak  "
              f"weights at {row['weights_gbs']:.1f} GB/s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
