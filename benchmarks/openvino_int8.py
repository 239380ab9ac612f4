"""OpenVINO's own int8 path (NNCF weight compression) against onnxruntime int8 and OpenVINO bf16.

    pip install nncf     # not a kvembed dependency: this script only
    python benchmarks/openvino_int8.py --fp32 ART_FP32 [--int8 ART_INT8] --out DIR            # quality
    python benchmarks/openvino_int8.py --fp32 ART_FP32 --int8 ART_INT8 --out DIR --time       # + speed

The fp32 artifact's ``model.onnx`` is read by OpenVINO (attention mended as the runtime mends it:
:func:`kvembed.backends.openvino.repeat_kv_heads`), its weights compressed by
``nncf.compress_weights`` (``INT8_ASYM`` / ``INT8_SYM``, per output channel; every MatMul and the
embedding table) and compiled for the CPU under each ``--ov`` precision hint. OpenVINO's CPU
plugin runs int8-compressed MatMuls either by decompressing the weights (bf16/f32 arithmetic) or
by quantising the activations on the fly (``DYNAMIC_QUANTIZATION_GROUP_SIZE``, int8 AMX/VNNI
arithmetic); ``--dq`` sets the group size (0: off; unset: OpenVINO's default).

Quality (what decides whether the path is worth building; the bar is int8's cosine >= 0.99):

- worst row cosine against the fp32 artifact on onnxruntime (itself within 0.99999 of PyTorch) on
  the parity gate's texts and batches (:data:`kvembed.export.parity.GATE_TEXTS`) and on the
  held-out texts (:data:`kvembed.export.parity.HELD_OUT_TEXTS`);
- Spearman of the sample STS task (``kvembed/data/tasks/sample-sts.tsv``): gold scores against the
  cosine of the two sentences' document vectors, as mteb's ``cosine_spearman`` computes it.

Every variant is scored: onnxruntime fp32 (the reference), onnxruntime int8 (``--int8``, kvembed's
int8 artifact), OpenVINO f32/bf16 on the fp32 graph, and each NNCF mode under each hint.

``--time``: the variants interleaved call by call (:func:`kvembed.bench.measure.interleaved`, as
``benchmarks/cpu_backends.py``) on ``--shapes`` (``BxS``: B rows of S real tokens); each speed is
the median of per-round ratios against onnxruntime fp32. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from kvembed.artifact import read_manifest
from kvembed.bench.measure import cosine_rows, interleaved
from kvembed.bench.report import machine_info
from kvembed.bench.workload import exact_rows, make_batch
from kvembed.eval.tasks import SAMPLES, load_task
from kvembed.export.parity import GATE_TEXTS, HELD_OUT_TEXTS, gate_batches
from kvembed.runtime import Embedder

BASE = "onnxruntime fp32"
Run = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def compressed_model(fp32: Path, mode: str) -> Any:
    """The fp32 artifact's graph as OpenVINO reads it, its weights compressed by NNCF in ``mode``."""
    import nncf
    import openvino as ov

    from kvembed.backends.openvino import repeat_kv_heads

    model = ov.Core().read_model(str(fp32 / "model.onnx"))
    repeat_kv_heads(model)
    return nncf.compress_weights(model, mode=getattr(nncf.CompressWeightsMode, mode))


def compiled_run(model: Any, hint: str, threads: int, dq: int | None) -> tuple[Run, str]:
    """``model`` compiled for the CPU under ``hint``: ``feeds -> embedding``, and the precision it runs."""
    import openvino as ov

    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": threads}
    if dq is not None:
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = dq
    compiled = ov.Core().compile_model(model, "CPU", config)
    inputs = {port.get_any_name() for port in compiled.inputs}

    def run(feeds: Mapping[str, np.ndarray]) -> np.ndarray:
        request = compiled.create_infer_request()
        request.infer({k: np.ascontiguousarray(v) for k, v in feeds.items() if k in inputs})
        return np.array(request.get_tensor("embedding").data, copy=True)

    return run, str(compiled.get_property("INFERENCE_PRECISION_HINT"))


def variants(args: argparse.Namespace) -> dict[str, Run]:
    """name -> run: the reference, kvembed's int8 artifact, OpenVINO on the fp32 graph, NNCF's modes."""
    load = lambda path, **kw: Embedder.load(path, threads=args.threads, verify=False, **kw)  # noqa: E731
    runs: dict[str, Run] = {BASE: lambda feeds, e=load(args.fp32, provider="cpu"): e.run(feeds)[0]}
    if args.int8:
        runs["onnxruntime int8"] = lambda feeds, e=load(args.int8, provider="cpu"): e.run(feeds)[0]
    for hint in args.ov:
        runs[f"OpenVINO {hint}"] = lambda feeds, e=load(args.fp32, provider="openvino", ov_precision=hint): e.run(feeds)[0]
    for mode in args.modes:
        model = compressed_model(args.fp32, mode)
        for hint in args.ov:
            run, ran = compiled_run(model, hint, args.threads, args.dq)
            runs[f"NNCF {mode} ({ran})"] = run
    return runs


def gate_cosines(encoder: Any, runs: Mapping[str, Run], texts: Mapping[str, str]) -> dict[str, float]:
    """Worst row cosine of each variant against onnxruntime fp32 over the gate's batches of ``texts``."""
    worst = dict.fromkeys(runs, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation warnings
        for kind, side, names in gate_batches(texts):
            batch = encoder.pad(encoder.encode([texts[n] for n in names], kind), side)
            want = runs[BASE](batch)
            for name, run in runs.items():
                worst[name] = min(worst[name], float(cosine_rows(run(batch), want).min()))
    return worst


def sts_spearman(encoder: Any, run: Run, padding_side: str, batch_size: int = 32) -> float:
    """The sample STS task's Spearman: gold scores against the pairs' cosines (document vectors)."""
    from scipy.stats import spearmanr
    from sklearn.metrics.pairwise import paired_cosine_distances

    task = load_task(SAMPLES["sample-sts"])

    def embed(texts: list[str]) -> np.ndarray:
        parts = [run(encoder.pad(encoder.encode(texts[i:i + batch_size], "document"), padding_side))
                 for i in range(0, len(texts), batch_size)]
        return np.concatenate(parts).astype(np.float32)

    first, second = embed(list(task.data["sentence1"])), embed(list(task.data["sentence2"]))
    return float(spearmanr(task.data["score"], 1 - paired_cosine_distances(first, second)).statistic)


def quality(args: argparse.Namespace, runs: Mapping[str, Run]) -> list[dict[str, Any]]:
    encoder = Embedder.load(args.fp32, provider="cpu", threads=1, verify=False).encoder
    side = read_manifest(args.fp32)["padding_side"]
    gate, held = gate_cosines(encoder, runs, GATE_TEXTS), gate_cosines(encoder, runs, HELD_OUT_TEXTS)
    rows = []
    for name, run in runs.items():
        row = {"variant": name, "gate_worst_cos_vs_fp32": gate[name], "held_out_worst_cos_vs_fp32": held[name],
               "sts_spearman": sts_spearman(encoder, run, side)}
        rows.append(row)
        print(f"{name:<32} gate {row['gate_worst_cos_vs_fp32']:.6f}  held-out {row['held_out_worst_cos_vs_fp32']:.6f}  "
              f"STS Spearman {row['sts_spearman']:.4f}", flush=True)
    return rows


def timing(args: argparse.Namespace, runs: Mapping[str, Run]) -> list[dict[str, Any]]:
    """The variants interleaved on each shape; speed against onnxruntime fp32 (median of rounds)."""
    encoder = Embedder.load(args.fp32, provider="cpu", threads=1, verify=False).encoder
    cells = []
    for shape in args.shapes.split(","):
        batch, _, seq = shape.lower().partition("x")
        feeds = make_batch(encoder, exact_rows(encoder, int(seq), int(batch)), int(batch)).inputs
        real = int(feeds["attention_mask"].sum())
        rounds = args.rounds * (6 if int(batch) * int(seq) <= 512 else 1)
        times = interleaved({name: (lambda r=run: r(feeds)) for name, run in runs.items()}, rounds=rounds)
        for name in runs:
            cell = {"shape": shape, "variant": name, "p50_ms": 1e3 * statistics.median(times[name]),
                    "tokens_per_s": real / statistics.median(times[name]),
                    "speed_vs_ort_fp32": statistics.median(b / t for t, b in zip(times[name], times[BASE])),
                    "seconds": times[name]}
            cells.append(cell)
            print(f"{shape:>7} {name:<32} p50 {cell['p50_ms']:8.1f} ms  x{cell['speed_vs_ort_fp32']:.2f} vs ort fp32", flush=True)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp32", type=Path, required=True, help="fp32 artifact (the reference; OpenVINO and NNCF read its graph)")
    parser.add_argument("--int8", type=Path, help="kvembed's int8 artifact of the same model and method (onnxruntime)")
    parser.add_argument("--modes", nargs="*", default=["INT8_ASYM", "INT8_SYM"], help="nncf.CompressWeightsMode names")
    parser.add_argument("--ov", nargs="*", default=["bf16", "f32"], help="OpenVINO precision hints")
    parser.add_argument("--dq", type=int, help="DYNAMIC_QUANTIZATION_GROUP_SIZE for the NNCF models (0: off; unset: OpenVINO's default)")
    parser.add_argument("--time", action="store_true", help="also time the variants, interleaved (on a quiet machine)")
    parser.add_argument("--shapes", default="1x32,16x128,16x512")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import nncf
    import openvino as ov

    runs = variants(args)
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(args.threads),
        "fp32": str(args.fp32), "int8": str(args.int8 or ""), "dq_group_size": args.dq,
        "versions": {"nncf": nncf.__version__, "openvino": ov.get_version()},
        "quality": quality(args, runs),
    }
    if args.time:
        results["timing"] = timing(args, runs)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
