"""Which int8 (and 4-bit) recipe survives real weights? Issue 11's measurement.

Takes an fp32 artifact (e.g. SmolLM2-135M kv-embedding), writes one quantized graph per recipe
with onnxruntime's own quantizers, and measures against the fp32 graph on the parity gate's rows
(12 texts x query/document, one padded batch each, right padding): worst-row cosine, plus
throughput at batch x tokens, interleaved over rounds (this VM drifts 10-30% minute to minute).

    python benchmarks/experiments/int8_options.py ARTIFACT_DIR --out benchmarks/results/int8-options [--rounds 5]

Recipes (the exporter's are kvembed.export.precision.convert.INT8_RECIPES, run through its own to_int8):
- smooth, smooth-keep-down, plain: the exporter's (plain = quantize_dynamic, uint8 weights per channel)
- smooth-a<alpha>: smooth with another SmoothQuant strength
- plain-keep-down: plain with every SwiGLU down_proj left fp32, no smoothing
- plain-keep-ends: plain with the first and last decoder layer left fp32
- dyn-u8s8: quantize_dynamic with int8 weights (U8S8; saturates in int16 on CPUs without VNNI)
- smooth-keep-down<X>-<u8|s7>: smooth-keep-down keeping only the down_projs whose input's top
  channel exceeds X x its median (--down-spreads)
- <exporter recipe>-<u8|s8|s7>: the exporter's recipe with other weights: uint8 (U8U8), int8 (U8S8),
  int8 in a 7-bit range (U8S8 with reduce_range: no int16 saturation on any CPU)
- nbits8 / nbits4: MatMulNBits block-wise weights (block 32), accuracy_level 4 (int8 compute on
  per-block quantized activations) -- a com.microsoft op: onnxruntime only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime as ort

from kvembed.bench.measure import TorchSubject, interleaved
from kvembed.bench.report import machine_info
from kvembed.bench.workload import raw_token_batch
from kvembed.export.gate.parity import KINDS, PARITY_TEXTS, cosine_rows
from kvembed.export.precision.convert import INT8_RECIPES, to_int8
from kvembed.export.precision.smoothing import calibration_feeds
from kvembed.artifact import load_manifest
from kvembed.runtime.artifact import encoder_from_manifest


#: weight matmuls per decoder layer in the graph: q, k, v, o, gate, up, down (in this order)
PER_LAYER = 7


def matmul_nodes(model: onnx.ModelProto) -> list[tuple[str, int | None, tuple[int, ...]]]:
    """(node name, decoder layer, weight shape) of every MatMul with a constant B, in graph order.

    The exported graph keeps no module names, so layers come from the order (PER_LAYER weight
    matmuls per layer)."""
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    found = [(n.name, shapes[n.input[1]]) for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in shapes]
    whole = len(found) % PER_LAYER == 0
    return [(name, i // PER_LAYER if whole else None, shape) for i, (name, shape) in enumerate(found)]


def dynamic(source: Path, target: Path, weight: str, exclude: Callable[[int | None, tuple[int, ...]], bool] | None = None) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(source), load_external_data=False)
    excluded = [name for name, layer, shape in matmul_nodes(model) if exclude is not None and exclude(layer, shape)]
    quantize_dynamic(
        str(source), str(target), op_types_to_quantize=["MatMul"], per_channel=True,
        weight_type=QuantType.QUInt8 if weight == "u8" else QuantType.QInt8,
        nodes_to_exclude=excluded, extra_options={"MatMulConstBOnly": True},
    )


def nbits(source: Path, target: Path, bits: int) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    model = onnx.load(str(source))
    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, accuracy_level=4, bits=bits)
    quantizer = MatMulNBitsQuantizer(model, algo_config=config)
    quantizer.process()
    onnx.save(quantizer.model.model, str(target))


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--alphas", type=float, nargs="*", default=[0.5, 0.8], help="other SmoothQuant strengths to try")
    parser.add_argument("--down-spreads", type=float, nargs="*", default=[10.0, 20.0],
                        help="smooth-keep-down variants keeping only the down_projs whose input spread exceeds these")
    parser.add_argument("--only", nargs="*", help="run only these recipes (names as printed)")
    parser.add_argument("--torch", action="store_true", help="also time the PyTorch fp32 reference (loads the source model)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(args.artifact)
    encoder = encoder_from_manifest(args.artifact, manifest)
    source = args.artifact / "model.onnx"
    nodes = matmul_nodes(onnx.load(str(source), load_external_data=False))
    layers = sorted({layer for _, layer, _ in nodes if layer is not None})
    if not layers:
        raise SystemExit(f"cannot tell decoder layers apart in {source} ({len(nodes)} weight matmuls)")
    first, last = layers[0], layers[-1]
    calibration = calibration_feeds(encoder)
    smooth = INT8_RECIPES["smooth"]
    recipes: dict[str, Callable[[Path], Any]] = {
        **{name: (lambda t, r=recipe: to_int8(source, t, r, calibration)) for name, recipe in INT8_RECIPES.items()},
        **{f"smooth-a{alpha:g}": (lambda t, a=alpha: to_int8(source, t, dataclasses.replace(smooth, smooth_alpha=a), calibration))
           for alpha in args.alphas},
        **{f"{name}-{w}": (lambda t, r=recipe, w=w: to_int8(source, t, dataclasses.replace(r, name=f"{r.name}-{w}", weights=w), calibration))
           for name, recipe in INT8_RECIPES.items() for w in ("u8", "s8", "s7") if w != recipe.weights},
        **{f"smooth-keep-down{spread:g}-{w}": (lambda t, x=spread, w=w: to_int8(source, t, dataclasses.replace(
            INT8_RECIPES["smooth-keep-down"], name=f"smooth-keep-down{x:g}-{w}", down_spread=x, weights=w), calibration))
           for spread in args.down_spreads for w in ("u8", "s7")},
        "plain-keep-down": lambda t: to_int8(source, t, dataclasses.replace(INT8_RECIPES["plain"], name="plain-keep-down", keep_down=True)),
        "plain-keep-ends": lambda t: dynamic(source, t, "u8", lambda layer, shape: layer in (first, last)),
        "dyn-u8s8": lambda t: dynamic(source, t, "s8"),
        "nbits8": lambda t: nbits(source, t, 8),
        "nbits4": lambda t: nbits(source, t, 4),
    }
    if args.only:
        unknown = set(args.only) - set(recipes)
        if unknown:
            raise SystemExit(f"unknown recipes {sorted(unknown)}; known: {', '.join(recipes)}")
        recipes = {k: v for k, v in recipes.items() if k in args.only}
    texts = list(PARITY_TEXTS.values())
    sessions = {"fp32": session(source, args.threads)}
    for name, build in recipes.items():
        target = args.out / f"{name}.onnx"
        started = time.perf_counter()
        facts = build(target)
        if facts:
            print(f"  {name}: {facts.get('fp32_matmuls')} MatMuls kept fp32", flush=True)
        print(f"built {name} in {time.perf_counter() - started:.1f}s ({target.stat().st_size / 1e6:.1f} MB)", flush=True)
        sessions[name] = session(target, args.threads)
    names = [i.name for i in sessions["fp32"].get_inputs()]
    worst: dict[str, float] = {}
    for kind in KINDS:
        batch = encoder.pad(encoder.encode(texts, kind), "right")
        feeds = {k: batch[k] for k in names}
        reference = sessions["fp32"].run(["embedding"], feeds)[0]
        for name, s in sessions.items():
            if name == "fp32":
                continue
            cosine = float(cosine_rows(s.run(["embedding"], feeds)[0], reference).min())
            worst[name] = min(worst.get(name, 1.0), cosine)
    # throughput: batch x tokens of real text (no prompt, no padding), interleaved rounds, median per recipe
    feeds = {k: v for k, v in raw_token_batch(encoder, args.batch, args.tokens).items() if k in names}
    calls: dict[str, Callable[[], Any]] = {name: (lambda s=s: s.run(["embedding"], feeds)) for name, s in sessions.items()}
    if args.torch:
        torch_backend = TorchSubject(args.artifact, args.threads)
        calls["torch fp32"] = lambda: torch_backend.run(feeds)
    times = interleaved(calls, args.rounds)
    if args.torch:
        torch_backend.close()
    tokens = args.batch * args.tokens
    results: dict[str, Any] = {
        "artifact": str(args.artifact), "model": manifest["source"].get("model"), "method": manifest["method"],
        "batch": args.batch, "tokens": args.tokens, "threads": args.threads, "rounds": args.rounds,
        "onnxruntime": ort.__version__, "machine": machine_info(args.threads), "recipes": {},
    }
    fp32_tps = tokens / float(np.median(times["fp32"]))
    torch_tps = tokens / float(np.median(times["torch fp32"])) if args.torch else None
    for name in calls:
        tps = tokens / float(np.median(times[name]))
        results["recipes"][name] = {
            "worst_cosine_vs_fp32": worst.get(name),
            "tokens_per_s": tps, "speed_vs_fp32": tps / fp32_tps,
            "speed_vs_torch_fp32": None if torch_tps is None else tps / torch_tps,
            "bytes": None if name == "torch fp32" else (args.out / f"{name}.onnx").stat().st_size if name != "fp32" else source.stat().st_size,
        }
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"| recipe | worst cosine vs fp32 (24 rows) | tokens/s at {args.batch} x {args.tokens} | vs onnxruntime fp32 | vs PyTorch fp32 | MB |")
    print("|---|---|---|---|---|---|")
    for name, r in results["recipes"].items():
        cos = "-" if r["worst_cosine_vs_fp32"] is None else f"{r['worst_cosine_vs_fp32']:.5f}"
        vs_torch = "-" if r["speed_vs_torch_fp32"] is None else f"{r['speed_vs_torch_fp32']:.2f}x"
        size = "-" if r["bytes"] is None else f"{r['bytes'] / 1e6:.0f}"
        print(f"| {name} | {cos} | {r['tokens_per_s']:.0f} | {r['speed_vs_fp32']:.2f}x | {vs_torch} | {size} |")


if __name__ == "__main__":
    main()
