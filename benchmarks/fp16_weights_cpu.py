"""fp16 weights on a CPU without FP16 arithmetic: what onnxruntime holds and how fast it runs.

An fp16 artifact loads on onnxruntime's CPU provider at twice its bytes on x86 without FP16 (issue
30, item 4; benchmarks/RESULTS.md): its fp16 MatMuls have no CPU kernel, so their weights become
fp32 initializers at load. The alternative asked about: a graph of fp32 MatMuls reading fp16
weights through an explicit ``Cast`` per weight, with onnxruntime's folding of that Cast turned off,
so the weights stay fp16 and are widened during each call.

This script writes such a graph (``--matmuls`` fp16 weights of ``--dim`` x ``--dim``, external data)
and opens it in one fresh process per configuration, printing anonymous / resident memory after
load and after the calls, and the mean time of a call of ``--rows`` rows:

    python benchmarks/fp16_weights_cpu.py --work /tmp/fp16w --rows 16,512
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_memory import rollup  # noqa: E402

#: configuration -> (graph optimisation level, optimizers disabled, CPU arena and memory pattern on)
CONFIGS = {
    "default (Cast folded: fp32 weights)": ("all", "", True),
    "Cast kept (folding off)": ("extended", "ConstantFolding", True),
    "Cast kept, no arena / memory pattern": ("extended", "ConstantFolding", False),
}


def write_graph(folder: Path, matmuls: int, dim: int) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    path = folder / f"fp16-weights-{matmuls}x{dim}.onnx"  # one file per shape: --work may be reused
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i in range(matmuls):
        weights.append(numpy_helper.from_array((rng.standard_normal((dim, dim)) * 0.01).astype(np.float16), f"w{i}"))
        nodes += [helper.make_node("Cast", [f"w{i}"], [f"w{i}_fp32"], to=TensorProto.FLOAT),
                  helper.make_node("MatMul", [x, f"w{i}_fp32"], [f"h{i}"])]
        x = f"h{i}"
    graph = helper.make_graph(nodes, "fp16_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", dim])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["rows", dim])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path),
              save_as_external_data=True, location=path.name + ".data")
    return path


def memory_mb() -> dict[str, int]:
    """Anonymous and resident MB of this process (:func:`load_memory.rollup`)."""
    fields = rollup()
    return {key: fields[key] // 2**20 for key in ("Anonymous", "Rss")}


def run_one(path: str, level: str, disabled: str, arena: bool, rows: list[int], calls: int) -> dict:
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    if disabled:
        options.add_session_config_entry("optimization.disable_specified_optimizers", disabled)
    options.enable_cpu_mem_arena = options.enable_mem_pattern = arena
    start = time.perf_counter()
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    result = {"load_s": round(time.perf_counter() - start, 2), "after_load_mb": memory_mb(), "ms_per_call": {}}
    dim = session.get_inputs()[0].shape[1]
    for count in rows:
        x = np.random.default_rng(1).standard_normal((count, dim)).astype(np.float32)
        session.run(None, {"x": x})
        start = time.perf_counter()
        for _ in range(calls):
            session.run(None, {"x": x})
        result["ms_per_call"][count] = round((time.perf_counter() - start) / calls * 1000, 1)
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
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows: comma-separated row counts, e.g. 1,16,512 (got {args.rows!r})")
    if min(rows) < 1 or args.matmuls < 1 or args.dim < 1 or args.calls < 1:
        parser.error("--rows, --matmuls, --dim and --calls must be positive")
    if args.child:
        path, level, disabled, arena = args.child
        print(json.dumps(run_one(path, level, disabled, arena == "1", rows, args.calls)))
        return
    path = write_graph(args.work, args.matmuls, args.dim)
    print(f"{args.matmuls} fp16 weights of {args.dim} x {args.dim} ({path.with_name(path.name + '.data').stat().st_size / 1e6:.0f} MB)")
    for round_ in range(args.rounds):
        for label, (level, disabled, arena) in CONFIGS.items():
            out = subprocess.run([sys.executable, __file__, "--work", str(args.work), "--rows", args.rows,
                                  "--calls", str(args.calls), "--child", str(path), level, disabled, "1" if arena else "0"],
                                 check=True, capture_output=True, text=True).stdout
            print(f"round {round_ + 1} | {label} | {out.strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
