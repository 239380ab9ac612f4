"""Peak memory and wall time of ``kvembed-export`` per stage, at Qwen3-4B's width (issue 30).

Builds a random Qwen3-4B-shaped checkpoint as real ones ship (bf16 safetensors shards with
``model.safetensors.index.json``, written shard by shard: benchmarks/make_qwen3_06b_shaped.py),
then runs ``kvembed-export`` once per precision, each in a fresh process under ``/usr/bin/time -v``
(its "Maximum resident set size" is the peak the OS saw). While it runs, the child's RSS is polled
and attributed to the stage the exporter is in (its "done <stage>" lines close a stage), so the
table says which stage reaches the peak. W is the model's fp32 weight bytes (4 per parameter).

    python benchmarks/export_memory.py --layers 8 --work /tmp/export-memory --out benchmarks/results/export-memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_qwen3_06b_shaped import build_sharded  # noqa: E402
from record import figure, write_record  # noqa: E402

GIB = 1024**3
#: ``  done trace: tracing ... (12.3s)`` (StageDisplay's line when a stage ends)
STAGE_LINE = re.compile(r"^\s*(done|stopped) (\w+): .*\((\d+(?:\.\d+)?)s\)\s*$")
POLL_SECONDS = 0.1


def cpu_name() -> str:
    """The CPU's model name as ``lscpu`` prints it."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def fp32_weight_bytes(model: Path) -> int:
    """W: 4 bytes per parameter of the checkpoint (bf16 shards: twice their stored size)."""
    from safetensors import safe_open

    index = model / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    count = 0
    for name in files:
        with safe_open(str(model / name), framework="np") as handle:
            for key in handle.keys():
                shape = handle.get_slice(key).get_shape()
                size = 1
                for dim in shape:
                    size *= int(dim)
                count += size
    return 4 * count


def tree_rss(process: psutil.Process) -> int:
    """RSS of ``process`` and its descendants (``/usr/bin/time`` runs the exporter as its child)."""
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class StageMeter:
    """Polls a process tree's RSS and attributes each sample to the stage then running."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.peaks: dict[str, int] = {}
        self.walls: dict[str, float] = {}
        self.order: list[str] = []
        self.current = "start"
        self.done = threading.Event()

    def close_stage(self, stage: str, seconds: float) -> None:
        """A ``done <stage>`` line: samples so far belong to ``stage``; the next ones to the next stage."""
        self.peaks[stage] = max(self.peaks.get(stage, 0), self.peaks.pop(self.current, 0))
        self.walls[stage] = self.walls.get(stage, 0.0) + seconds
        if stage not in self.order:
            self.order.append(stage)
        self.current = "next"

    def poll(self) -> None:
        while not self.done.is_set():
            rss = tree_rss(self.process)
            self.peaks[self.current] = max(self.peaks.get(self.current, 0), rss)
            time.sleep(POLL_SECONDS)


def run_export(model: Path, out: Path, precision: str, method: str, layers: str | None, log: Path,
               int8_recipe: str | None = None) -> dict[str, Any]:
    """One ``kvembed-export`` in a fresh process: peak RSS (time -v), wall, per-stage RSS and wall."""
    exe = Path(sys.executable).with_name("kvembed-export")
    command = ["/usr/bin/time", "-v", str(exe), "--model", str(model), "--method", method, "--precision", precision,
               "--out", str(out), "--force"]
    if layers:
        command += ["--layers", layers]
    if int8_recipe and precision == "int8":
        command += ["--int8-recipe", int8_recipe]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    start = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    meter = StageMeter(psutil.Process(child.pid))
    poller = threading.Thread(target=meter.poll, daemon=True)
    poller.start()
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(child.stderr), daemon=True)
    reader.start()
    lines = []
    for line in child.stdout:
        lines.append(line)
        match = STAGE_LINE.match(line)
        if match:
            meter.close_stage(match.group(2), float(match.group(3)))
    code = child.wait()
    wall = time.monotonic() - start
    meter.done.set()
    poller.join()
    reader.join()
    log.write_text("".join(lines) + "".join(stderr), encoding="utf-8")
    peak_kb = next((int(line.split(":")[1]) for line in stderr if "Maximum resident set size" in line), 0)
    return {
        "precision": precision, "exit_code": code, "wall_s": round(wall, 1), "peak_rss_bytes": peak_kb * 1024,
        "stages": [{"stage": s, "wall_s": round(meter.walls[s], 1), "peak_rss_bytes": meter.peaks.get(s, 0)}
                   for s in meter.order],
    }


def machine_rates(seconds: float = 3.0) -> dict[str, float]:
    """This machine's fp32 GEMM rate (torch, all cores, 2048^3 products) and buffered file write
    rate (256 MiB blocks to a scratch file in the work folder's filesystem), best of a few tries:
    the denominators of each stage's floor."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.matmul(a, b)
    best, end = float("inf"), time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return {"gemm_flops": 2 * 2048**3 / best, "cores": os.cpu_count() or 1}


def write_rate(folder: Path, total: int = 2 * GIB, block: int = 256 * 1024**2) -> float:
    """Bytes per second written to a file in ``folder`` (buffered, as the exporter writes)."""
    data, path = os.urandom(block), folder / ".write-rate.tmp"
    start = time.perf_counter()
    with path.open("wb") as handle:
        for _ in range(total // block):
            handle.write(data)
    rate = total / (time.perf_counter() - start)
    path.unlink()
    return rate


def gate_work(artifact: Path) -> dict[str, int]:
    """The padded tokens the parity gate runs per side (its batches, the held-out texts' and a
    sliding-window model's window text included, through the artifact's own tokenizer) and the
    calibration's (int8), from the artifact's files."""
    from kvembed.export.gate.parity import HELD_OUT_TEXTS, gate_tokens, gated_texts
    from kvembed.export.precision.smoothing import calibration_feeds
    from kvembed.artifact import load_manifest
    from kvembed.runtime.artifact import encoder_from_manifest

    manifest = load_manifest(artifact)
    encoder = encoder_from_manifest(artifact, manifest)
    texts = gated_texts(encoder, manifest.source.raw.get("sliding_window"))
    gate = gate_tokens(encoder, texts) + gate_tokens(encoder, HELD_OUT_TEXTS)
    calibration = sum(batch["input_ids"].size for batch in calibration_feeds(encoder))
    return {"gate_tokens_per_side": int(gate), "calibration_tokens": int(calibration)}


def stage_floors(model: Path, work: dict[str, int], rates: dict[str, float], layers_run: int) -> dict[str, float]:
    """Seconds each long stage needs at least on this machine: the gate (PyTorch and onnxruntime
    each run its padded tokens through every layer, 2 FLOPs per weight per token) and int8's
    calibration at the GEMM rate; the stages that read and write the weights at the file write
    rate (the trace writes W, fp16 reads W and writes W/2, int8 writes W twice: smoothed, then a
    quarter of it quantised)."""
    config = json.loads((model / "config.json").read_text())
    hidden, ffn = config["hidden_size"], config["intermediate_size"]
    heads, kv, head = config["num_attention_heads"], config["num_key_value_heads"], config.get("head_dim") or hidden // config["num_attention_heads"]
    per_layer = hidden * head * (2 * heads + 2 * kv) + 3 * hidden * ffn
    flops_per_token = 2 * per_layer * layers_run
    weight_bytes = 4 * (per_layer * layers_run + config["vocab_size"] * hidden)
    gemm, write = rates["gemm_flops"], rates["write_bytes_per_s"]
    return {
        "reference": work["gate_tokens_per_side"] * flops_per_token / gemm,
        "parity": work["gate_tokens_per_side"] * flops_per_token / gemm,
        "calibrate": work["calibration_tokens"] * flops_per_token / gemm,
        "trace": weight_bytes / write,
        "convert_fp16": weight_bytes / 2 / write,
        "convert_int8": 1.25 * weight_bytes / write,
    }


def markdown(results: dict[str, Any]) -> str:
    """The table of benchmarks/log/export-memory-4b.md: peak RSS (GiB and x W), wall, then per stage 'wall s / peak GiB'."""
    weight = results["fp32_weight_bytes"]
    stages = [s for r in results["runs"] for s in (x["stage"] for x in r["stages"])]
    order = list(dict.fromkeys(stages))
    head = "| precision | peak RSS | x W | wall | " + " | ".join(order) + " |"
    rows = [head, "|" + "---|" * (4 + len(order))]
    for run in results["runs"]:
        by = {s["stage"]: s for s in run["stages"]}
        cells = [f"{by[s]['wall_s']:.0f} s / {by[s]['peak_rss_bytes'] / GIB:.1f}" if s in by else "" for s in order]
        state = "" if run["exit_code"] == 0 else f" (exit {run['exit_code']})"
        rows.append(f"| {run['precision']}{state} | {run['peak_rss_bytes'] / GIB:.2f} GiB | "
                    f"{run['peak_rss_bytes'] / weight:.2f} | {run['wall_s']:.0f} s | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, type=Path, help="Folder for the checkpoint and artifacts.")
    parser.add_argument("--layers", type=int, default=8, help="Decoder layers of the Qwen3-4B-shaped model (36 in the real one).")
    parser.add_argument("--vocab", type=int, default=None, help="Vocabulary (default: the tokenizer's; Qwen3-4B: 151936).")
    parser.add_argument("--tokenizer", default=None,
                        help="A model whose tokenizer the checkpoint gets (e.g. smollm2-135m, a real BPE); default: the "
                             "demo's byte-level one, which gives several times more tokens per text.")
    parser.add_argument("--precisions", default="fp32,fp16,int8")
    parser.add_argument("--method", default="kv-embedding")
    parser.add_argument("--method-layers", default=None, help="--layers passed to kvembed-export (default: the method's).")
    parser.add_argument("--int8-recipe", default=None, help="--int8-recipe passed to kvembed-export for int8 (default: its auto).")
    parser.add_argument("--keep-artifacts", action="store_true", help="Keep each artifact (default: removed after its run).")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file.")
    parser.add_argument("--floors", action="store_true",
                        help="Also measure this machine's GEMM and write rates and report each long stage's floor "
                             "(read from the first artifact before it is removed; --keep-artifacts keeps them all).")
    args = parser.parse_args()
    if args.int8_recipe is not None:  # before the checkpoint is built: a wrong name is one line
        from kvembed.export.precision.convert import int8_plan

        try:
            int8_plan(args.int8_recipe)
        except ValueError as err:
            parser.error(f"--int8-recipe: {err}")
    if args.tokenizer is not None:  # before any weight is written
        from kvembed.bench.synthetic import tokenizer_folder

        try:
            tokenizer_folder(args.tokenizer)
        except FileNotFoundError as err:
            parser.error(str(err))
    suffix = "" if args.tokenizer is None else "-" + Path(args.tokenizer).name.replace(".", "_")
    model = args.work / f"qwen3-4b-shaped-{args.layers}l-bf16{suffix}"
    if not (model / "model.safetensors.index.json").exists():
        start = time.monotonic()
        build_sharded(model, "4b", args.layers, args.vocab, tokenizer=args.tokenizer)
        print(f"built {model} in {time.monotonic() - start:.0f}s", flush=True)
    results: dict[str, Any] = {
        "cpu": cpu_name(), "cores": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
        "model": str(model), "layers": args.layers, "method": args.method, "tokenizer": args.tokenizer or "demo (byte-level)",
        "fp32_weight_bytes": fp32_weight_bytes(model), "runs": [],
    }
    if args.floors:
        rates = machine_rates()
        rates["write_bytes_per_s"] = write_rate(args.work)
        results["rates"] = rates
    for precision in args.precisions.split(","):
        out = args.work / f"artifact-{precision}"
        run = run_export(model, out, precision, args.method, args.method_layers, args.work / f"export-{precision}.log",
                         args.int8_recipe)
        if out.exists():
            run["artifact_bytes"] = sum(p.stat().st_size for p in out.iterdir())
            if args.floors and "floors" not in results:
                manifest = json.loads((out / "kvembed.json").read_text())
                work = gate_work(out)
                results["gate_work"] = work
                results["floors_s"] = stage_floors(model, work, rates, int(manifest["graph"]["decoder_layers"]))
                print(json.dumps({"gate_work": work, "rates": results["rates"], "floors_s": results["floors_s"]}), flush=True)
        if not args.keep_artifacts:
            import shutil

            shutil.rmtree(out, ignore_errors=True)
        results["runs"].append(run)
        print(json.dumps(run), flush=True)
    print(f"\n{results['cpu']}, {results['cores']} cores; W = {results['fp32_weight_bytes'] / 1e9:.2f} GB\n")
    print(markdown(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    figures = {}
    for run in results["runs"]:
        figures[f"{run['precision']} export wall"] = figure(run["wall_s"], "s")
        figures[f"{run['precision']} export peak RSS"] = figure(round(run["peak_rss_bytes"] / 2**30, 2), "GiB")
    write_record("export_memory", figures, layers=results["layers"], fp32_weight_bytes=results["fp32_weight_bytes"])


if __name__ == "__main__":
    main()
