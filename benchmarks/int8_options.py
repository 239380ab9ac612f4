"""Which int8 (and 4-bit) recipe survives real weights? Issue 11's measurement.

Takes an fp32 artifact (e.g. SmolLM2-135M kv-embedding), writes one quantized graph per recipe
with onnxruntime's own quantizers, and measures against the fp32 graph on the parity gate's rows
(12 texts x query/document, one padded batch each, right padding): worst-row cosine, plus
throughput at batch x tokens, interleaved over rounds (this VM drifts 10-30% minute to minute).

    python benchmarks/int8_options.py ARTIFACT_DIR --out benchmarks/results/int8-options [--rounds 5]

Recipes (see kvembed.export.precision for what the exporter uses):
- dyn-u8s8: quantize_dynamic, int8 weights per channel (U8S8; saturates in int16 on CPUs without VNNI)
- dyn-u8u8: quantize_dynamic, uint8 weights per channel (U8U8)
- dyn-u8u8-keep-down: as dyn-u8u8, down_proj MatMuls left in fp32 (they see the largest outliers)
- dyn-u8u8-keep-ends: as dyn-u8u8, first and last decoder layer left in fp32
- nbits8 / nbits4: MatMulNBits block-wise weights (block 32), accuracy_level 4 (int8 compute on
  per-block quantized activations) -- a com.microsoft op: onnxruntime only
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
import onnxruntime as ort

from kvembed.export.parity import KINDS, PARITY_TEXTS, cosine_rows
from kvembed.runtime.artifact import encoder_from_manifest, read_manifest


#: weight matmuls per decoder layer in the graph: q, k, v, o, gate, up, down (in this order)
PER_LAYER = 7


def matmul_nodes(model: onnx.ModelProto) -> list[tuple[str, int | None, tuple[int, ...]]]:
    """(node name, decoder layer, weight shape) of every MatMul with a constant B, in graph order.

    The exported graph keeps no module names, so layers come from the order (PER_LAYER weight
    matmuls per layer) and down_proj from its [intermediate, hidden] shape."""
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
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(args.artifact)
    encoder = encoder_from_manifest(args.artifact, manifest)
    source = args.artifact / "model.onnx"
    nodes = matmul_nodes(onnx.load(str(source), load_external_data=False))
    layers = sorted({layer for _, layer, _ in nodes if layer is not None})
    if not layers:
        raise SystemExit(f"cannot tell decoder layers apart in {source} ({len(nodes)} weight matmuls)")
    first, last = layers[0], layers[-1]
    hidden = nodes[0][2][0]  # q_proj's input width
    recipes: dict[str, Callable[[Path], None]] = {
        "dyn-u8s8": lambda t: dynamic(source, t, "s8"),
        "dyn-u8u8": lambda t: dynamic(source, t, "u8"),
        "dyn-u8u8-keep-down": lambda t: dynamic(source, t, "u8", lambda layer, shape: shape[1] == hidden and shape[0] > hidden),
        "dyn-u8u8-keep-ends": lambda t: dynamic(source, t, "u8", lambda layer, shape: layer in (first, last)),
        "nbits8": lambda t: nbits(source, t, 8),
        "nbits4": lambda t: nbits(source, t, 4),
    }
    texts = list(PARITY_TEXTS.values())
    names = None
    sessions = {"fp32": session(source, args.threads)}
    for name, build in recipes.items():
        target = args.out / f"{name}.onnx"
        started = time.perf_counter()
        build(target)
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
    # throughput: batch x tokens of real text, interleaved rounds, median per recipe
    long_text = " ".join(texts) * 20
    ids = encoder.tokenizer.encode(long_text).ids
    row = np.array(ids[: args.tokens], dtype=np.int64)
    feeds = {"input_ids": np.tile(row, (args.batch, 1)), "attention_mask": np.ones((args.batch, args.tokens), np.int64)}
    feeds = {k: v for k, v in feeds.items() if k in names}
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for s in sessions.values():
        s.run(["embedding"], feeds)
    for _ in range(args.rounds):
        for name, s in sessions.items():
            started = time.perf_counter()
            s.run(["embedding"], feeds)
            times[name].append(time.perf_counter() - started)
    tokens = args.batch * args.tokens
    results: dict[str, Any] = {
        "artifact": str(args.artifact), "model": manifest["source"].get("model"), "method": manifest["method"],
        "batch": args.batch, "tokens": args.tokens, "threads": args.threads, "rounds": args.rounds,
        "onnxruntime": ort.__version__, "recipes": {},
    }
    fp32_tps = tokens / float(np.median(times["fp32"]))
    for name in sessions:
        tps = tokens / float(np.median(times[name]))
        results["recipes"][name] = {
            "worst_cosine_vs_fp32": None if name == "fp32" else worst[name],
            "tokens_per_s": tps, "speed_vs_fp32": tps / fp32_tps,
            "bytes": (args.out / f"{name}.onnx").stat().st_size if name != "fp32" else source.stat().st_size,
        }
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"| recipe | worst cosine vs fp32 (24 rows) | tokens/s at {args.batch} x {args.tokens} | vs fp32 | MB |")
    print("|---|---|---|---|---|")
    for name, r in results["recipes"].items():
        cos = "-" if r["worst_cosine_vs_fp32"] is None else f"{r['worst_cosine_vs_fp32']:.5f}"
        print(f"| {name} | {cos} | {r['tokens_per_s']:.0f} | {r['speed_vs_fp32']:.2f}x | {r['bytes'] / 1e6:.0f} |")


if __name__ == "__main__":
    main()
