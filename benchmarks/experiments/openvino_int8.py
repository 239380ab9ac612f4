"""OpenVINO's own int8 path (NNCF weight compression) against onnxruntime int8 and OpenVINO bf16.

    pip install nncf     # not a kvembed dependency: this script only
    python benchmarks/experiments/openvino_int8.py --fp32 ART_FP32 [--int8 ART_INT8] --out DIR            # quality
    python benchmarks/experiments/openvino_int8.py --fp32 ART_FP32 --int8 ART_INT8 --out DIR --time       # + speed

The fp32 artifact's ``model.onnx`` is read by OpenVINO (attention mended as the runtime mends it:
:func:`kvembed.backends.openvino.repeat_kv_heads`), its weights compressed by
``nncf.compress_weights`` (``INT8_ASYM`` / ``INT8_SYM``, per output channel; every MatMul and the
embedding table) and compiled for the CPU under each ``--ov`` precision hint. OpenVINO's CPU
plugin runs int8-compressed MatMuls either by decompressing the weights (bf16/f32 arithmetic) or
by quantising the activations on the fly (``DYNAMIC_QUANTIZATION_GROUP_SIZE``, int8 AMX/VNNI
arithmetic); ``--dq`` sets the group size (0: off; unset: OpenVINO's default).

Quality (what decides whether the path is worth building; the bar is int8's cosine >= 0.99):

- worst row cosine against the fp32 artifact on onnxruntime (itself within 0.99999 of PyTorch) on
  the parity gate's texts and batches (:data:`kvembed.export.gate.parity.GATE_TEXTS`) and on the
  held-out texts (:data:`kvembed.export.gate.parity.HELD_OUT_TEXTS`);
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

from kvembed.bench.measure import cosine_rows, interleaved
from kvembed.bench.report import machine_info
from kvembed.bench.workload import exact_rows, make_batch
from kvembed.eval.tasks import SAMPLES, load_task
from kvembed.export.gate.parity import GATE_TEXTS, HELD_OUT_TEXTS, gate_batches
from kvembed import OpenVINOOptions
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


def nncf_embedder(args: argparse.Namespace, model: Any, hint: str) -> tuple[Embedder, str]:
    """An Embedder of the fp32 artifact on OpenVINO whose compiled model is ``model`` (NNCF's)
    compiled under ``hint``: the runtime's own encoder and batching, so the STS score is computed
    as ``kvembed eval`` computes it. Returns it and the precision OpenVINO reports it runs."""
    import openvino as ov

    config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": args.threads}
    if args.dq is not None:
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = args.dq
    compiled = ov.Core().compile_model(model, "CPU", config)
    embedder = Embedder.load(args.fp32, provider="openvino", options=OpenVINOOptions(precision=hint), threads=args.threads, verify=False)
    embedder.session.compiled = compiled  # OpenVINOSession.run makes its infer requests from it
    ran = compiled.get_property("INFERENCE_PRECISION_HINT")
    return embedder, getattr(ran, "to_string", lambda: str(ran))()


def variants(args: argparse.Namespace) -> dict[str, Embedder]:
    """name -> Embedder: the reference, kvembed's int8 artifact, OpenVINO on the fp32 graph, NNCF's modes."""
    load = lambda path, **kw: Embedder.load(path, threads=args.threads, verify=False, **kw)  # noqa: E731
    embedders: dict[str, Embedder] = {BASE: load(args.fp32, provider="cpu")}
    if args.int8:
        embedders["onnxruntime int8"] = load(args.int8, provider="cpu")
    for hint in args.ov:
        embedders[f"OpenVINO {hint}"] = load(args.fp32, provider="openvino", options=OpenVINOOptions(precision=hint))
    for mode in args.modes:
        model = compressed_model(args.fp32, mode)
        for hint in args.ov:
            embedder, ran = nncf_embedder(args, model, hint)
            embedders[f"NNCF {mode} ({ran})"] = embedder
    return embedders


def gate_cosines(encoder: Any, runs: Mapping[str, Run], texts: Mapping[str, str]) -> dict[str, float]:
    """Worst row cosine of each variant against onnxruntime fp32 over the gate's batches of ``texts``."""
    worst = dict.fromkeys(runs, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation warnings
        for gate_batch in gate_batches(texts):
            batch = gate_batch.pad(encoder, texts)
            want = runs[BASE](batch)
            for name, run in runs.items():
                worst[name] = min(worst[name], float(cosine_rows(run(batch), want).min()))
    return worst


def sts_spearman(embedder: Embedder, batch_size: int = 32) -> float:
    """The sample STS task's Spearman as ``kvembed eval`` scores it (mteb's ``cosine_spearman``):
    gold scores against ``1 - paired_cosine_distances`` of the document vectors, encoded by the
    runtime's batching. int8's dynamic activation scales depend on what shares a batch, so the
    batching is part of the score."""
    from scipy.stats import spearmanr
    from sklearn.metrics.pairwise import paired_cosine_distances

    task = load_task(SAMPLES["sample-sts"])
    first = embedder.encode(list(task.data["sentence1"]), kind="document", batch_size=batch_size)
    second = embedder.encode(list(task.data["sentence2"]), kind="document", batch_size=batch_size)
    return float(spearmanr(task.data["score"], 1 - paired_cosine_distances(first, second)).statistic)


def quality(args: argparse.Namespace, embedders: Mapping[str, Embedder]) -> list[dict[str, Any]]:
    encoder = embedders[BASE].encoder
    runs = {name: (lambda feeds, e=e: e.run(feeds)[0]) for name, e in embedders.items()}
    gate, held = gate_cosines(encoder, runs, GATE_TEXTS), gate_cosines(encoder, runs, HELD_OUT_TEXTS)
    rows = []
    for name, embedder in embedders.items():
        row = {"variant": name, "gate_worst_cos_vs_fp32": gate[name], "held_out_worst_cos_vs_fp32": held[name],
               "sts_spearman": sts_spearman(embedder)}
        rows.append(row)
        print(f"{name:<28} gate {row['gate_worst_cos_vs_fp32']:.6f}  held-out {row['held_out_worst_cos_vs_fp32']:.6f}  "
              f"STS Spearman {row['sts_spearman']:.4f}", flush=True)
    return rows


def timing(args: argparse.Namespace, embedders: Mapping[str, Embedder]) -> list[dict[str, Any]]:
    """The variants interleaved on each shape; speed against onnxruntime fp32 (median of rounds)."""
    encoder = embedders[BASE].encoder
    runs = {name: (lambda feeds, e=e: e.run(feeds)[0]) for name, e in embedders.items()}
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
            print(f"{shape:>7} {name:<28} p50 {cell['p50_ms']:8.1f} ms  x{cell['speed_vs_ort_fp32']:.2f} vs ort fp32", flush=True)
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

    embedders = variants(args)
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine_info(args.threads),
        "fp32": str(args.fp32), "int8": str(args.int8 or ""), "dq_group_size": args.dq,
        "versions": {"nncf": nncf.__version__, "openvino": ov.get_version()},
        "quality": quality(args, embedders),
    }
    if args.time:
        results["timing"] = timing(args, embedders)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
