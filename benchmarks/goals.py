"""Performance goals P1-P8 on a Qwen3-0.6B-shaped model (issues 5 and 14), each a ratio in one run.

    python benchmarks/goals.py --layers 8 --out benchmarks/results/goals

This machine's speed drifts by 10-30% from minute to minute (a shared 2-core VM), so every ratio
is measured *interleaved*: the calls being compared take turns, round after round, and each goal
reports the median over rounds of the per-round ratio. Inputs are real token ids of exact
lengths (a byte-level tokenizer on English text), identical for every backend.

Every timed call starts after a settle gap (``interleaved``'s ``gap``): onnxruntime's spinning pool
would otherwise slow the PyTorch call after it by ~20% and flatter P1. The runtime is called
through ``Embedder.run`` (row slices included), as users call it.

P1 batch 1 x 32: runtime fp32 latency / PyTorch eager fp32 <= 1 / 1.5 (issue 5), <= 0.5 (issue 14); also reported:
   the ratio a call of only its FLOPs at the GEMM peak would reach (the floor for any fp32 graph), and
   the ratio of the graph's weight MatMuls alone at 32 rows in onnxruntime (its kernels' small-M floor)
P2 kv-embedding (layer set) vs the same model exported with --layers none: <= +3%
P3 int8 throughput at 16 x 128 / PyTorch fp32 >= 2.5 (5), >= 3.0 (14); cosine int8 vs fp32 >= 0.99
P4 early exit: va / token-prepending graph cost <= 1.05 x (layers kept / all) x full-depth graph
P5 fp32 throughput at 16 x 128 / the fp32 GEMM peak (a 2048^3 onnxruntime MatMul) >= 0.75 (5), >= 0.85 (14)
P6 mixed lengths 8..512: token-budget batching >= 1.5 x texts/s of fixed batches in input order
P7 runtime fp32 tokens/s at 16 x 512 / tokens/s at 16 x 128 >= 0.75 (14)
P8 runtime fp32 peak RSS / PyTorch's, one 16 x 512 batch, each in a fresh process: <= 1.0 (14)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
from args import positive  # benchmarks/args.py, beside this script
from record import figure, write_record  # benchmarks/record.py

from kvembed.bench.measure import TorchSubject, cosine_rows, interleaved, peak_rss_mb, ratio
from kvembed.bench.worker import CellInput, WorkerSpec, run_isolated
from kvembed.bench.peak import gemm_call, model_shape, weight_gemms_call
from kvembed.bench.report import machine_info
from kvembed.bench.synthetic import build_random_model
from kvembed.bench.workload import mixed_corpus, raw_token_batch
from kvembed.runtime import Embedder
from kvembed.artifact import load_manifest, read_manifest


def artifacts_for(model: Path, root: Path, layers: int) -> dict[str, Path]:
    """Export (once; reused on later runs) every graph the goals compare."""
    from kvembed.export.core import Exporter, load_embedder

    half = layers // 2
    plan = {  # name -> (method, options, precisions)
        "kv": ("kv-embedding", {}, ("fp32", "int8")),
        "kv-none": ("kv-embedding", {"layers": "none"}, ("fp32",)),
        "va": ("va", {"layers": f"{half // 2}-{half - 1}"}, ("fp32",)),
        "va-full": ("va", {"layers": f"{layers - half // 2}-{layers - 1}"}, ("fp32",)),
        "tp": ("token-prepending", {"exit_layer": half, "tp_stop": min(7, half)}, ("fp32",)),
        "tp-full": ("token-prepending", {"exit_layer": layers, "tp_stop": min(7, half)}, ("fp32",)),
    }
    paths: dict[str, Path] = {}
    for name, (method, options, precisions) in plan.items():
        todo = [p for p in precisions if not (root / f"{name}-{p}" / "kvembed.json").exists()]
        if todo:
            print(f"exporting {name} ({method} {options}) {', '.join(todo)}", flush=True)
            with Exporter(load_embedder(str(model), method, **options)) as exporter:
                for precision in todo:
                    exporter.write(root / f"{name}-{precision}", precision, force=True)
        for precision in precisions:
            paths[f"{name}-{precision}"] = root / f"{name}-{precision}"
    return paths


#: goal -> issue -> (comparison, threshold); a goal is met for an issue when measured <op> threshold
TARGETS: dict[str, dict[str, tuple[str, float]]] = {
    "P1": {"5": ("<=", 1 / 1.5), "14": ("<=", 0.5)},
    "P2": {"5": ("<=", 1.03)},
    "P3": {"5": (">=", 2.5), "14": (">=", 3.0)},
    "P4-va": {"5": ("<=", 1.05)},
    "P4-tp": {"5": ("<=", 1.05)},
    "P5": {"5": (">=", 0.75), "14": (">=", 0.85)},
    "P6": {"5": (">=", 1.5)},
    "P7": {"14": (">=", 0.75)},
    "P8": {"14": ("<=", 1.0)},
}


def verdicts(key: str, measured: float, also: bool = True) -> dict[str, bool]:
    """issue -> met, for ``measured`` against each issue's threshold of goal ``key`` (and ``also``)."""
    compare = {"<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b}
    return {issue: bool(also and compare[op](measured, bound)) for issue, (op, bound) in TARGETS[key].items()}


def runner(embedder: Embedder, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
    return lambda: embedder.run(feeds)


def isolated_peak_rss(backend: str, artifact: Path, threads: int, feeds: dict[str, np.ndarray]) -> float:
    """Peak RSS (MB) of a fresh process that loads ``backend`` and runs ``feeds`` once."""
    spec = WorkerSpec(backend, str(artifact), threads, [CellInput("rss", feeds)],
                      warmup=0, min_repeats=1, min_seconds=0.0)
    return float(run_isolated(spec)["peak_rss_mb"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model folder (default: build a random Qwen3-0.6B-shaped one)")
    parser.add_argument("--layers", type=positive, default=8, help="decoder layers of the built model (28 in Qwen3-0.6B)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/goals"))
    parser.add_argument("--threads", type=positive, default=2)
    parser.add_argument("--rounds", type=positive, default=5, help="rounds of the 16 x 128 comparisons")
    parser.add_argument("--corpus", type=positive, default=96, help="texts in P6's mixed-length corpus")
    args = parser.parse_args()
    if args.model and not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model} has no config.json: give a Hugging Face model folder, or leave "
                     "--model out to build a random Qwen3-0.6B-shaped one")
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or args.out / f"qwen3-0.6b-shaped-{args.layers}l"
    if not (Path(model) / "config.json").exists():
        print(f"building {model}", flush=True)
        build_random_model(model, layers=args.layers)
    layers = json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"]
    paths = artifacts_for(Path(model), args.out / "artifacts", layers)
    load = lambda name: Embedder.load(paths[name], provider="cpu", threads=args.threads, verify=False)  # noqa: E731
    kv, kv_none, kv_int8 = load("kv-fp32"), load("kv-none-fp32"), load("kv-int8")
    torch_kv = TorchSubject(paths["kv-fp32"], args.threads)
    results: dict[str, Any] = {"machine": machine_info(args.threads), "model": str(model), "layers": layers,
                               "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "goals": {}}
    goals = results["goals"]

    def report(key: str, measured: float, what: str, also: bool = True, **detail: Any) -> None:
        met = verdicts(key, measured, also)
        goals[key] = {"measured": measured, "what": what, "met": met, **detail}
        said = ", ".join(f"issue {i}: {TARGETS[key][i][0]} {TARGETS[key][i][1]:.3g} {'met' if ok else 'NOT met'}" for i, ok in met.items())
        print(f"{key}: {measured:.3f} ({what}; {said}) {detail}", flush=True)

    gemm, gemm_flops = gemm_call(args.threads, 2048)
    shape = model_shape(load_manifest(paths["kv-fp32"]), paths["kv-fp32"])

    # P1: batch 1 x 32; with it two floors, each against the same round's PyTorch call: the call
    # as nothing but its FLOPs at the GEMM peak (the 2048^3 MatMul's rate), and the call as nothing
    # but its weight MatMuls at 32 rows with onnxruntime's kernels (small-M GEMMs run below peak)
    small = raw_token_batch(kv.encoder, 1, 32)
    weights_only, _ = weight_gemms_call(paths["kv-fp32"] / "model.onnx", 32, args.threads)
    t = interleaved({"runtime": runner(kv, small), "torch": lambda: torch_kv.run(small), "gemm": gemm,
                     "weight_gemms": weights_only}, rounds=30, warmup=3)
    r = ratio(t, "runtime", "torch")
    flops = shape.flops([32])
    floor = statistics.median((flops / (gemm_flops / g)) / b for g, b in zip(t["gemm"], t["torch"]))
    report("P1", r, "runtime / torch latency, 1 x 32",
           runtime_p50_ms=1e3 * statistics.median(t["runtime"]), torch_p50_ms=1e3 * statistics.median(t["torch"]),
           weight_gemms_p50_ms=1e3 * statistics.median(t["weight_gemms"]),
           ratio_at_gemm_peak=floor, ratio_weight_gemms_only=ratio(t, "weight_gemms", "torch"), flops_per_call=flops)

    big = raw_token_batch(kv.encoder, 16, 128)
    tokens = 16 * 128
    # P2 + P3 + P5 in one interleaved set
    calls = {"kv": runner(kv, big), "kv-none": runner(kv_none, big), "int8": runner(kv_int8, big),
             "torch": lambda: torch_kv.run(big), "gemm": gemm}
    t = interleaved(calls, rounds=args.rounds)
    r = ratio(t, "kv", "kv-none")
    report("P2", r, "kv-embedding / --layers none, 16 x 128",
           kv_tokens_per_s=tokens / statistics.median(t["kv"]), none_tokens_per_s=tokens / statistics.median(t["kv-none"]))
    speed = 1 / ratio(t, "int8", "torch")
    fp32_out, int8_out = kv.run(big)[0], kv_int8.run(big)[0]
    cos_bench = float(cosine_rows(int8_out, fp32_out).min())
    cos_parity = float(read_manifest(paths["kv-int8"])["parity"]["worst_cosine"])
    report("P3", speed, "int8 / torch fp32 throughput, 16 x 128; and cosine >= 0.99",
           min(cos_bench, cos_parity) >= 0.99,
           int8_tokens_per_s=tokens / statistics.median(t["int8"]), torch_tokens_per_s=tokens / statistics.median(t["torch"]),
           cosine_int8_vs_fp32_bench=cos_bench, cosine_int8_vs_torch_parity_texts=cos_parity)
    flops = shape.flops([128] * 16)
    share = statistics.median((flops / a) / (gemm_flops / g) for a, g in zip(t["kv"], t["gemm"]))
    report("P5", share, "achieved GFLOP/s / GEMM peak, fp32 16 x 128",
           model_gflops=flops / statistics.median(t["kv"]) / 1e9, gemm_gflops=gemm_flops / statistics.median(t["gemm"]) / 1e9,
           flops_per_batch=flops, shape=shape.to_dict())

    # P4: early exit
    for method in ("va", "tp"):
        part, full = load(f"{method}-fp32"), load(f"{method}-full-fp32")
        kept = read_manifest(paths[f"{method}-fp32"])["graph"]["decoder_layers"]
        all_layers = read_manifest(paths[f"{method}-full-fp32"])["graph"]["decoder_layers"]
        t = interleaved({"part": runner(part, big), "full": runner(full, big)}, rounds=args.rounds)
        r = ratio(t, "part", "full")
        bound = kept / all_layers
        report(f"P4-{method}", r / bound, f"cost / ({kept}/{all_layers} x full-depth cost)",
               cost_ratio=r, layers_kept=kept, layers_full=all_layers)

    # P6: mixed lengths through the runtime's encode (token-budget batching) vs fixed batches in input order
    corpus = list(mixed_corpus(kv.encoder, args.corpus, 8, 512, seed=1).texts)

    def fixed_batches() -> None:
        for start in range(0, len(corpus), 16):
            encoded = kv.encoder.encode(corpus[start:start + 16], "document")
            kv.run(kv.encoder.pad(encoded))

    t = interleaved({"budget": lambda: kv.encode(corpus, batch_size=16, max_batch_tokens=16 * 128), "fixed": fixed_batches},
                    rounds=2, warmup=0)
    r = 1 / ratio(t, "budget", "fixed")
    report("P6", r, "texts/s, token-budget vs fixed 16-row batches in input order",
           budget_texts_per_s=len(corpus) / statistics.median(t["budget"]), fixed_texts_per_s=len(corpus) / statistics.median(t["fixed"]))

    # P7: long rows keep their rate (the runtime slices long batches into row groups)
    long = raw_token_batch(kv.encoder, 16, 512)
    t = interleaved({"512": runner(kv, long), "128": runner(kv, big)}, rounds=args.rounds)
    r = statistics.median((4 * b) / a for a, b in zip(t["512"], t["128"]))
    report("P7", r, "runtime fp32 tokens/s at 16 x 512 / at 16 x 128",
           tokens_per_s_512=16 * 512 / statistics.median(t["512"]), tokens_per_s_128=tokens / statistics.median(t["128"]))
    torch_kv.close()

    # P8: memory of one 16 x 512 batch, each backend in a fresh process (its peak is its own)
    rss = {backend: isolated_peak_rss(backend, paths["kv-fp32"], args.threads, long) for backend in ("runtime", "torch")}
    report("P8", rss["runtime"] / rss["torch"], "runtime fp32 / PyTorch peak RSS, 16 x 512, fresh processes",
           runtime_peak_rss_mb=rss["runtime"], torch_peak_rss_mb=rss["torch"])

    results["peak_rss_mb"] = peak_rss_mb()
    results["targets"] = TARGETS
    (args.out / "goals.json").write_text(json.dumps(results, indent=2, default=str))
    issues = sorted({i for t in TARGETS.values() for i in t}, key=int)
    lines = ["| goal | measured | what | " + " | ".join(f"issue {i}" for i in issues) + " |",
             "|---|---|---|" + "---|" * len(issues)]
    for key, goal in goals.items():
        cells = []
        for issue in issues:
            if issue in TARGETS[key]:
                op, bound = TARGETS[key][issue]
                cells.append(f"{op} {bound:.3g}: {'met' if goal['met'][issue] else '**no**'}")
            else:
                cells.append("-")
        lines.append(f"| {key} | {goal['measured']:.3f} | {goal['what']} | " + " | ".join(cells) + " |")
    (args.out / "goals.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    write_record("goals", {f"{key} {goal['what']}": figure(goal["measured"], "x") for key, goal in goals.items()},
                 layers=layers, output=str(args.out))
    sys.exit(0)


if __name__ == "__main__":
    main()
