"""The runtime's CPU backends against each other and PyTorch, interleaved in one process.

    python benchmarks/cpu_backends.py --fp32 ART_FP32 [--int8 ART_INT8] [--auto bf16=ART_BF16 ...] [--cpu LABEL=DIR ...] --torch --out DIR

Backends: onnxruntime fp32 (the artifact as users load it), onnxruntime int8 (a second artifact of
the same model), OpenVINO with the ``bf16`` and ``f32`` precision hints (the fp32 artifact's own
``model.onnx``), each ``--auto`` artifact as ``Embedder.load(dir)`` runs it here (a bf16 artifact,
or an int8 one whose OpenVINO graph was certified: OpenVINO bf16 where the CPU has BF16), each
``--cpu`` artifact on onnxruntime's CPU provider, PyTorch fp32 (the reference). For every shape (``BxS``: B rows of S real tokens,
the method's prompt included) the backends take turns call by call for ``--rounds`` rounds, so the
per-round ratios see the same machine speed (this VM drifts 10-30% minute to minute); each ratio
is the median of per-round ratios against onnxruntime fp32. Cosines are per row against PyTorch
and against onnxruntime fp32 on the same padded batch. Peak RSS needs one process per backend:
use ``kvembed bench`` for that.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any, Callable

import numpy as np

from record import figure, write_record  # benchmarks/record.py, beside this script

from kvembed.bench.measure import TorchSubject, cosine_rows, interleaved
from kvembed.bench.report import machine_info
from kvembed.bench.workload import exact_rows, make_batch
from kvembed import OpenVINOOptions
from kvembed.runtime import Embedder

BASE = "onnxruntime fp32"


def labelled_dir(text: str) -> tuple[str, Path]:
    """argparse type for ``--auto``: ``LABEL=DIR`` with DIR an existing directory."""
    label, sep, path = text.partition("=")
    if not sep or not label or not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"expected LABEL=DIR with an existing artifact directory, got {text!r}")
    return label, Path(path)


def parse_shape(text: str) -> tuple[int, int]:
    batch, _, seq = text.lower().partition("x")
    if not (batch.isdigit() and seq.isdigit()):
        raise SystemExit(f"--shapes: {text!r} is not BxS (e.g. 16x128)")
    return int(batch), int(seq)


def load_backends(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]]:
    """name -> call(feeds) -> embeddings; each loaded the way a user loads it (PyTorch's reference
    closed, its patches restored, when ``stack`` closes)."""
    load = lambda path, **kw: Embedder.load(path, threads=args.threads, verify=False, **kw)  # noqa: E731
    runs: dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]] = {}
    embedders = {BASE: load(args.fp32, provider="cpu")}
    if args.int8:
        embedders["onnxruntime int8"] = load(args.int8, provider="cpu")
    for label, path in args.auto:
        embedder = load(path)  # provider auto, as Embedder.load(dir) picks for this artifact here
        embedders[f"{label} ({embedder.target})"] = embedder
    for label, path in args.cpu:
        embedders[f"{label} (onnxruntime-cpu)"] = load(path, provider="cpu")
    for hint in args.ov:
        embedders[f"OpenVINO {hint}"] = load(args.fp32, provider="openvino", options=OpenVINOOptions(precision=hint))
    for name, embedder in embedders.items():
        runs[name] = lambda feeds, e=embedder: e.run(feeds)[0]
    if args.torch:
        reference = stack.enter_context(TorchSubject(args.fp32, args.threads))
        runs["PyTorch fp32"] = reference.run
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp32", type=Path, required=True, help="fp32 artifact (onnxruntime fp32, OpenVINO, PyTorch)")
    parser.add_argument("--int8", type=Path, help="int8 artifact of the same model and method")
    parser.add_argument("--ov", nargs="*", default=["bf16", "f32"], help="OpenVINO precision hints to run (none: skip)")
    parser.add_argument("--torch", action="store_true", help="also run the PyTorch fp32 reference")
    parser.add_argument("--auto", nargs="*", default=[], metavar="LABEL=DIR", type=labelled_dir,
                        help="more artifacts of the same model and method, each loaded with provider auto (e.g. bf16=DIR)")
    parser.add_argument("--cpu", nargs="*", default=[], metavar="LABEL=DIR", type=labelled_dir,
                        help="more artifacts of the same model and method, each run on onnxruntime's CPU provider")
    parser.add_argument("--shapes", default="1x32,16x128,16x512")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        measure(args, shapes, load_backends(args, stack))


def measure(args: argparse.Namespace, shapes: list[tuple[int, int]], runs: dict[str, Callable[[dict[str, np.ndarray]], np.ndarray]]) -> None:
    """Every shape, the backends interleaved; writes ``results.json``."""
    encoder = Embedder.load(args.fp32, provider="cpu", threads=1, verify=False).encoder
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(args.threads),
        "fp32": str(args.fp32), "int8": str(args.int8 or ""), "rounds": args.rounds, "cells": []}
    for batch, seq in shapes:
        feeds = make_batch(encoder, exact_rows(encoder, seq, batch), batch).inputs
        real = int(feeds["attention_mask"].sum())
        outputs = {name: run(feeds) for name, run in runs.items()}
        rounds = args.rounds * (6 if batch * seq <= 512 else 1)  # small calls: more rounds, same cost
        times = interleaved({name: (lambda r=run: r(feeds)) for name, run in runs.items()}, rounds=rounds)
        for name in runs:
            cell = {
                "shape": f"{batch}x{seq}", "backend": name, "real_tokens": real,
                "p50_ms": 1e3 * statistics.median(times[name]),
                "tokens_per_s": real / statistics.median(times[name]),
                "speed_vs_ort_fp32": statistics.median(b / t for t, b in zip(times[name], times[BASE])),
                "cos_vs_ort_fp32_min": float(cosine_rows(outputs[name], outputs[BASE]).min()),
                "cos_vs_torch_min": (float(cosine_rows(outputs[name], outputs["PyTorch fp32"]).min())
                                     if "PyTorch fp32" in outputs else None),
                "seconds": times[name],
            }
            results["cells"].append(cell)
            torch_cos = "-" if cell["cos_vs_torch_min"] is None else f"{cell['cos_vs_torch_min']:.6f}"
            print(f"{cell['shape']:>7} {name:<18} p50 {cell['p50_ms']:8.1f} ms  {cell['tokens_per_s']:7.0f} tok/s  "
                  f"x{cell['speed_vs_ort_fp32']:.2f} vs ort fp32  cos ort {cell['cos_vs_ort_fp32_min']:.6f} torch {torch_cos}",
                  flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    figures = {}
    for cell in results["cells"]:
        figures[f"{cell['shape']} {cell['backend']} / onnxruntime fp32"] = figure(cell["speed_vs_ort_fp32"], "x")
        if cell["cos_vs_torch_min"] is not None:
            figures[f"{cell['shape']} {cell['backend']} worst cosine vs PyTorch"] = figure(cell["cos_vs_torch_min"], "cosine")
    write_record("cpu_backends", figures, fp32=results["fp32"], int8=results["int8"], output=str(args.out))


if __name__ == "__main__":
    main()
