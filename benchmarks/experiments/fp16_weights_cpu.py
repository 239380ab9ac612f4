"""fp16 weights on a CPU without FP16 arithmetic: what onnxruntime holds and how fast it runs.

An fp16 artifact loads on onnxruntime's CPU provider at twice its bytes on x86 without FP16 (issue
30, item 4; benchmarks/log/fp16-on-cpu.md): its fp16 MatMuls have no CPU kernel, so their weights become
fp32 initializers at load. The alternative asked about: a graph of fp32 MatMuls reading fp16
weights through an explicit ``Cast`` per weight, with onnxruntime's folding of that Cast turned off,
so the weights stay fp16 and are widened during each call.

``--openvino`` adds OpenVINO under the bf16 hint on a CPU with BF16: the fp16 graph as written (fp16
MatMuls, what an fp16 artifact holds) compiled as OpenVINO compiles it, and as kvembed's
``OpenVINOSession`` compiles it (retyped to bf16, :func:`kvembed.backends.openvino.write_bf16_graph`).

This script writes such graphs (``--matmuls`` fp16 weights of ``--dim`` x ``--dim``, external data)
and opens them in one fresh process per configuration, printing anonymous / resident memory after
load and after the calls, and the mean time of a call of ``--rows`` rows:

    python benchmarks/experiments/fp16_weights_cpu.py --work /tmp/fp16w --rows 16,512 [--openvino]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for its harnesses
from load_memory import rollup  # noqa: E402

#: configuration -> (graph optimisation level, optimizers disabled, CPU arena and memory pattern on)
CONFIGS = {
    "default (Cast folded: fp32 weights)": ("all", "", True),
    "Cast kept (folding off)": ("extended", "ConstantFolding", True),
    "Cast kept, no arena / memory pattern": ("extended", "ConstantFolding", False),
}


#: OpenVINO configurations (``--openvino``): label -> (graph, compiled through kvembed's session)
OV_CONFIGS = {
    "OpenVINO bf16 hint, fp16 graph as OpenVINO compiles it": ("fp16", False),
    "OpenVINO bf16 hint, fp16 graph retyped to bf16 (kvembed)": ("fp16", True),
}


def write_graph(folder: Path, matmuls: int, dim: int, form: str = "cast") -> Path:
    """``cast``: fp32 MatMuls reading fp16 weights through a Cast each; ``fp16``: fp16 MatMuls
    (the input cast to fp16 and the output back), as an fp16 artifact's graph."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path = folder / form / f"fp16-weights-{matmuls}x{dim}.onnx"  # one file per shape: --work may be reused
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    if form == "fp16":
        nodes.append(helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16))
        x = "x16"
    for i in range(matmuls):
        weights.append(numpy_helper.from_array((rng.standard_normal((dim, dim)) * 0.01).astype(np.float16), f"w{i}"))
        if form == "cast":
            nodes.append(helper.make_node("Cast", [f"w{i}"], [f"w{i}_fp32"], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}_fp32" if form == "cast" else f"w{i}"], [f"h{i}"]))
        x = f"h{i}"
    if form == "fp16":
        nodes.append(helper.make_node("Cast", [x], ["y"], to=TensorProto.FLOAT))
        x = "y"
    graph = helper.make_graph(nodes, "fp16_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", dim])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["rows", dim])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path),
              save_as_external_data=True, location=path.name + ".data")
    return path


def memory_mb() -> dict[str, int]:
    """Anonymous and resident MB of this process (:func:`load_memory.rollup`)."""
    fields = rollup()
    return {key: fields[key] // 2**20 for key in ("Anonymous", "Rss")}


def timed_calls(run: Any, dim: int, rows: list[int], calls: int) -> dict[int, float]:
    """Mean ms of ``run(x)`` per row count, after one untimed call each."""
    import numpy as np

    means = {}
    for count in rows:
        x = np.random.default_rng(1).standard_normal((count, dim)).astype(np.float32)
        run(x)
        start = time.perf_counter()
        for _ in range(calls):
            run(x)
        means[count] = round((time.perf_counter() - start) / calls * 1000, 1)
    return means


def run_one(path: str, level: str, disabled: str, arena: bool, rows: list[int], calls: int) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    if disabled:
        options.add_session_config_entry("optimization.disable_specified_optimizers", disabled)
    options.enable_cpu_mem_arena = options.enable_mem_pattern = arena
    start = time.perf_counter()
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    result = {"load_s": round(time.perf_counter() - start, 2), "after_load_mb": memory_mb()}
    dim = session.get_inputs()[0].shape[1]
    result["ms_per_call"] = timed_calls(lambda x: session.run(None, {"x": x}), dim, rows, calls)
    result["after_calls_mb"] = memory_mb()
    return result


def run_openvino(path: str, through_kvembed: bool, dim: int, rows: list[int], calls: int) -> dict:
    """The graph at ``path`` under the bf16 hint, uncached: compiled by OpenVINO as it is, or by
    kvembed's session (which compiles an fp16 graph retyped to bf16)."""
    import openvino as ov

    start = time.perf_counter()
    if through_kvembed:
        from kvembed.backends.openvino import OpenVINOSession

        session = OpenVINOSession(path, precision="bf16", cache_dir=False)
        run, ran = (lambda x: session.run({"x": x}, [session.compiled.outputs[0].get_any_name()])), session.precision
    else:
        compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"})
        request = compiled.create_infer_request()
        run, ran = (lambda x: request.infer({0: x})), compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    result = {"load_s": round(time.perf_counter() - start, 2), "ran": ran, "after_load_mb": memory_mb()}
    result["ms_per_call"] = timed_calls(run, dim, rows, calls)
    result["after_calls_mb"] = memory_mb()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--matmuls", type=int, default=16)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--rows", default="16,512")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2, help="Each configuration this many times, interleaved.")
    parser.add_argument("--openvino", action="store_true", help="Also OpenVINO under the bf16 hint (a CPU with BF16).")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows: comma-separated row counts, e.g. 1,16,512 (got {args.rows!r})")
    if min(rows) < 1 or args.matmuls < 1 or args.dim < 1 or args.calls < 1:
        parser.error("--rows, --matmuls, --dim and --calls must be positive")
    if args.child:
        job = json.loads(args.child)
        if job["backend"] == "openvino":
            print(json.dumps(run_openvino(job["path"], job["kvembed"], args.dim, rows, args.calls)))
        else:
            print(json.dumps(run_one(job["path"], job["level"], job["disabled"], job["arena"], rows, args.calls)))
        return
    path = write_graph(args.work, args.matmuls, args.dim)
    print(f"{args.matmuls} fp16 weights of {args.dim} x {args.dim} ({path.with_name(path.name + '.data').stat().st_size / 1e6:.0f} MB)")
    jobs = {label: {"backend": "onnxruntime", "path": str(path), "level": level, "disabled": disabled, "arena": arena}
            for label, (level, disabled, arena) in CONFIGS.items()}
    if args.openvino:
        jobs.update({label: {"backend": "openvino", "path": str(write_graph(args.work, args.matmuls, args.dim, form)), "kvembed": kvembed}
                     for label, (form, kvembed) in OV_CONFIGS.items()})
    for round_ in range(args.rounds):
        for label, job in jobs.items():
            out = subprocess.run([sys.executable, __file__, "--work", str(args.work), "--rows", args.rows, "--dim", str(args.dim),
                                  "--calls", str(args.calls), "--child", json.dumps(job)],
                                 check=True, capture_output=True, text=True).stdout
            print(f"round {round_ + 1} | {label} | {out.strip().splitlines()[-1]}", flush=True)


if __name__ == "__main__":
    main()
