"""Issue 5's performance goals P1-P6 on a Qwen3-0.6B-shaped random model, each a ratio in one run.

    python benchmarks/goals.py --layers 8 --out benchmarks/results/goals

This machine's speed drifts by 10-30% from minute to minute (a shared 2-core VM), so every ratio
is measured *interleaved*: the calls being compared take turns, round after round, and each goal
reports the median over rounds of the per-round ratio. Inputs are real token ids of exact
lengths (a byte-level tokenizer on English text), identical for every backend.

P1 batch 1 x 32: runtime fp32 latency <= PyTorch eager fp32 / 1.5
P2 kv-embedding (layer set) vs the same model exported with --layers none: <= +3%
P3 int8 throughput at 16 x 128 >= 2.5 x PyTorch fp32; cosine int8 vs fp32 >= 0.99
P4 early exit: va / token-prepending graph cost <= 1.05 x (layers kept / all) x full-depth graph
P5 fp32 throughput at 16 x 128 >= 75% of the fp32 GEMM peak (a 2048^3 onnxruntime MatMul)
P6 mixed lengths 8..512: token-budget batching >= 1.5 x texts/s of fixed batches in input order
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

from kvembed.bench.measure import TorchBackend, cosine_rows, interleaved, peak_rss_mb, ratio
from kvembed.bench.peak import gemm_call, model_shape
from kvembed.bench.report import machine_info
from kvembed.bench.synthetic import build_random_model
from kvembed.bench.workload import mixed_corpus, raw_token_batch
from kvembed.runtime import Embedder
from kvembed.runtime.artifact import read_manifest


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


def runner(embedder: Embedder, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
    names = {i.name for i in embedder.session.get_inputs()}
    feeds = {k: v for k, v in feeds.items() if k in names}
    return lambda: embedder.session.run(["embedding"], feeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model folder (default: build a random Qwen3-0.6B-shaped one)")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the built model (28 in Qwen3-0.6B)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/goals"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the 16 x 128 comparisons")
    parser.add_argument("--corpus", type=int, default=96, help="texts in P6's mixed-length corpus")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or args.out / f"qwen3-0.6b-shaped-{args.layers}l"
    if not (Path(model) / "config.json").exists():
        print(f"building {model}", flush=True)
        build_random_model(model, layers=args.layers)
    layers = json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"]
    paths = artifacts_for(Path(model), args.out / "artifacts", layers)
    load = lambda name: Embedder.load(paths[name], provider="cpu", threads=args.threads, verify=False)  # noqa: E731
    kv, kv_none, kv_int8 = load("kv-fp32"), load("kv-none-fp32"), load("kv-int8")
    torch_kv = TorchBackend(read_manifest(paths["kv-fp32"]), args.threads)
    results: dict[str, Any] = {"machine": machine_info(args.threads), "model": str(model), "layers": layers,
                               "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "goals": {}}
    goals = results["goals"]

    def report(key: str, measured: float, target: str, met: bool, **detail: Any) -> None:
        goals[key] = {"measured": measured, "target": target, "met": bool(met), **detail}
        print(f"{key}: {measured:.3f} (target {target}) {'met' if met else 'NOT met'} {detail}", flush=True)

    # P1: batch 1 x 32
    small = raw_token_batch(kv.encoder, 1, 32)
    t = interleaved({"runtime": runner(kv, small), "torch": lambda: torch_kv.run(small)}, rounds=30, warmup=3)
    r = ratio(t, "runtime", "torch")
    report("P1", r, "<= 0.667 (runtime / torch latency, 1 x 32)", r <= 1 / 1.5,
           runtime_p50_ms=1e3 * statistics.median(t["runtime"]), torch_p50_ms=1e3 * statistics.median(t["torch"]))

    big = raw_token_batch(kv.encoder, 16, 128)
    tokens = 16 * 128
    # P2 + P3 + P5 in one interleaved set
    gemm, gemm_flops = gemm_call(args.threads, 2048)
    calls = {"kv": runner(kv, big), "kv-none": runner(kv_none, big), "int8": runner(kv_int8, big),
             "torch": lambda: torch_kv.run(big), "gemm": gemm}
    t = interleaved(calls, rounds=args.rounds)
    r = ratio(t, "kv", "kv-none")
    report("P2", r, "<= 1.03 (kv-embedding / --layers none, 16 x 128)", r <= 1.03,
           kv_tokens_per_s=tokens / statistics.median(t["kv"]), none_tokens_per_s=tokens / statistics.median(t["kv-none"]))
    speed = 1 / ratio(t, "int8", "torch")
    fp32_out, int8_out = kv.session.run(["embedding"], big)[0], kv_int8.session.run(["embedding"], big)[0]
    cos_bench = float(cosine_rows(int8_out, fp32_out).min())
    cos_parity = float(read_manifest(paths["kv-int8"])["parity"]["worst_cosine"])
    report("P3", speed, ">= 2.5 (int8 / torch fp32 throughput, 16 x 128); cosine >= 0.99",
           speed >= 2.5 and min(cos_bench, cos_parity) >= 0.99,
           int8_tokens_per_s=tokens / statistics.median(t["int8"]), torch_tokens_per_s=tokens / statistics.median(t["torch"]),
           cosine_int8_vs_fp32_bench=cos_bench, cosine_int8_vs_torch_parity_texts=cos_parity)
    shape = model_shape(read_manifest(paths["kv-fp32"]), paths["kv-fp32"])
    flops = shape.flops([128] * 16)
    share = statistics.median((flops / a) / (gemm_flops / g) for a, g in zip(t["kv"], t["gemm"]))
    report("P5", share, ">= 0.75 (achieved GFLOP/s / GEMM peak, fp32 16 x 128)", share >= 0.75,
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
        report(f"P4-{method}", r / bound, f"<= 1.05 (cost / ({kept}/{all_layers} x full-depth cost))", r / bound <= 1.05,
               cost_ratio=r, layers_kept=kept, layers_full=all_layers)

    # P6: mixed lengths through the runtime's encode (token-budget batching) vs fixed batches in input order
    corpus = list(mixed_corpus(kv.encoder, args.corpus, 8, 512, seed=1).texts)

    def fixed_batches() -> None:
        for start in range(0, len(corpus), 16):
            encoded = kv.encoder.encode(corpus[start:start + 16], "document")
            kv.run(kv.encoder.pad(encoded, kv.padding_side))

    t = interleaved({"budget": lambda: kv.encode(corpus, batch_size=16, max_tokens=16 * 128), "fixed": fixed_batches},
                    rounds=2, warmup=0)
    r = 1 / ratio(t, "budget", "fixed")
    report("P6", r, ">= 1.5 (texts/s, token-budget vs fixed 16-row batches in input order)", r >= 1.5,
           budget_texts_per_s=len(corpus) / statistics.median(t["budget"]), fixed_texts_per_s=len(corpus) / statistics.median(t["fixed"]))

    results["peak_rss_mb"] = peak_rss_mb()
    (args.out / "goals.json").write_text(json.dumps(results, indent=2, default=str))
    lines = ["| goal | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['measured']:.3f} | {v['target']} | {'yes' if v['met'] else 'no'} |" for k, v in goals.items()]
    (args.out / "goals.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(0)


if __name__ == "__main__":
    main()
