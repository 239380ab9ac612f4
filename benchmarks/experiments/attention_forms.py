"""Attention alone, fused (one opset-23 ``Attention`` node) vs decomposed (opset 18) vs onnxruntime's
own ``com.microsoft`` MultiHeadAttention, on onnxruntime CPU.

    python benchmarks/experiments/attention_forms.py --batch 16 --seq 512 --rounds 3 --threads 2

One grouped-query attention at Qwen3-0.6B's head shape (16 query heads, 8 key/value heads,
head_dim 128), ``seq`` queries against ``seq + 1`` keys/values (kv-embedding's re-routed prefix
column) with an additive fp32 mask, traced by torch.onnx from ``scaled_dot_product_attention``
the way the exporter's two forms are: opset 23 with ``enable_gqa=True`` (-> ``Attention``) and
opset 18 with K/V repeated first (-> Expand, MatMul, Softmax, MatMul). Each run is a fresh process
(load, one warm-up call, one timed call, its own peak RSS: ``VmHWM``), the forms interleaved per
round; prints the median time and peak RSS per form and the largest difference of the outputs.

``ms-mha`` is what a load-time rewrite to onnxruntime's contrib kernel would run: the same inputs
through com.microsoft ``MultiHeadAttention`` (query as [B, S, Hq*D], K/V in BNSH with their heads
repeated to Hq by Expand, since the op has no grouped-query mode, and the mask as its
``attention_bias``). (``GroupQueryAttention`` is left out: its CPU kernel applies its own causal
mask from sequence lengths and has no place for kv-embedding's extra prefix column and bias.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HQ, HKV, HEAD_DIM = 16, 8, 128
FORMS = {"decomposed": 18, "fused": 23, "ms-mha": 18}


def inputs(batch: int, seq: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    mask = np.zeros((batch, 1, seq, seq + 1), np.float32)
    mask[:, :, :, 0] = 0.5  # a bias on the prefix column, as kv-embedding's logit bias
    mask[batch // 2:, :, :, seq - seq // 4 + 1:] = -np.inf  # right padding in half the rows
    return {
        "q": rng.standard_normal((batch, HQ, seq, HEAD_DIM), np.float32),
        "k": rng.standard_normal((batch, HKV, seq + 1, HEAD_DIM), np.float32),
        "v": rng.standard_normal((batch, HKV, seq + 1, HEAD_DIM), np.float32),
        "mask": mask,
    }


def contrib_mha(path: Path) -> dict:
    """The ``ms-mha`` graph: Transpose/Reshape Q to [B, S, Hq*D], Expand K/V to Hq heads, one
    com.microsoft MultiHeadAttention with the mask as attention_bias (built with onnx.helper: a
    five-op benchmark graph, no rewrite of an exported model)."""
    import onnx
    from onnx import TensorProto, helper

    def ints(name: str, values: list[int]):
        return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)

    nodes = [
        helper.make_node("Transpose", ["q"], ["q_bshd"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["q_bshd", "q_shape"], ["q3"]),
        *(helper.make_node("Unsqueeze", [t, "axis2"], [f"{t}5"]) for t in ("k", "v")),
        *(helper.make_node("Expand", [f"{t}5", "groups"], [f"{t}5e"]) for t in ("k", "v")),
        *(helper.make_node("Reshape", [f"{t}5e", "heads"], [f"{t}r"]) for t in ("k", "v")),
        helper.make_node("MultiHeadAttention", ["q3", "kr", "vr", "", "", "mask"], ["y"], domain="com.microsoft", num_heads=HQ),
    ]
    graph = helper.make_graph(
        nodes, "ms-mha",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["batch", HQ, "seq", HEAD_DIM]),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, ["batch", HKV, "keys", HEAD_DIM]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, ["batch", HKV, "keys", HEAD_DIM]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 1, "seq", "keys"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [ints("q_shape", [0, 0, HQ * HEAD_DIM]), ints("axis2", [2]), ints("groups", [1, 1, HQ // HKV, 1, 1]),
         ints("heads", [0, HQ, -1, HEAD_DIM])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(model, str(path))
    return {"form": "ms-mha", "opset": 18, "ops": sorted({node.op_type for node in nodes})}


def trace(form: str, path: Path) -> dict:
    import onnx
    import torch

    if form == "ms-mha":
        return contrib_mha(path)

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, mask):
            if form == "fused":
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            k, v = (t.repeat_interleave(HQ // HKV, dim=1) for t in (k, v))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    small = {name: torch.from_numpy(a) for name, a in inputs(2, 8).items()}
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    dynamic = {"q": {0: batch, 2: seq}, "k": {0: batch, 2: seq + 1}, "v": {0: batch, 2: seq + 1},
               "mask": {0: batch, 2: seq, 3: seq + 1}}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(Attention(), tuple(small.values()), str(path), input_names=list(small), output_names=["y"],
                          dynamic_shapes=dynamic, opset_version=FORMS[form], dynamo=True, verbose=False)
    ops = sorted({node.op_type for node in onnx.load(str(path)).graph.node})
    expected = "Attention" if form == "fused" else "Softmax"
    if expected not in ops:
        raise SystemExit(f"the {form} trace has no {expected} node ({ops}): this torch.onnx differs")
    return {"form": form, "opset": FORMS[form], "ops": ops}


def run_once(path: str, batch: int, seq: int, threads: int, out: str | None) -> dict:
    """In a fresh process: one warm-up call, one timed call, peak RSS."""
    import numpy as np
    import onnxruntime as ort

    from kvembed.bench.measure import peak_rss_mb

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = inputs(batch, seq)
    session.run(None, feeds)
    start = time.perf_counter()
    (y,) = session.run(None, feeds)
    seconds = time.perf_counter() - start
    if out:
        np.save(out, y if y.ndim == 3 else y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1))  # [B, S, Hq*D]
    return {"seconds": seconds, "peak_mb": peak_rss_mb(), "onnxruntime": ort.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--save", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_once(args.run, args.batch, args.seq, args.threads, args.save)))
        return

    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for form in FORMS:
            facts = trace(form, root / f"{form}.onnx")
            print(f"{form}: opset {facts['opset']}, ops {', '.join(facts['ops'])}")
        results: dict[str, list[dict]] = {form: [] for form in FORMS}
        for r in range(args.rounds):
            for form in FORMS:
                save = [f"--save={root / form}.npy"] if r == 0 else []
                proc = subprocess.run(
                    [sys.executable, __file__, f"--run={root / form}.onnx", f"--batch={args.batch}",
                     f"--seq={args.seq}", f"--threads={args.threads}", *save],
                    capture_output=True, text=True, check=True,
                )
                results[form].append(json.loads(proc.stdout))
        outputs = {form: np.load(root / f"{form}.npy") for form in FORMS}
        diffs = {form: float(np.abs(outputs[form] - outputs["decomposed"]).max()) for form in FORMS if form != "decomposed"}

    version = results["fused"][0]["onnxruntime"]
    print(f"\nonnxruntime {version} CPU, {args.threads} threads, {args.batch} x {args.seq} queries, "
          f"{args.seq + 1} keys/values, Hq={HQ} Hkv={HKV} head_dim={HEAD_DIM}; median of {args.rounds} "
          "interleaved fresh-process runs")
    base = statistics.median(x["seconds"] for x in results["decomposed"])
    print("| form | time | process peak RSS |\n|---|---|---|")
    for form in FORMS:
        seconds = statistics.median(x["seconds"] for x in results[form])
        peak = statistics.median(x["peak_mb"] for x in results[form])
        print(f"| {form} | {seconds:.2f} s ({seconds / base:.2f}x) | {peak / 1024:.2f} GB |")
    for form, diff in diffs.items():
        print(f"largest |{form} - decomposed| of the outputs: {diff:.1e}")


if __name__ == "__main__":
    main()
