"""kvembed's export against Optimum's (``optimum-cli export onnx``) on one checkpoint: peak
memory as the OS saw it, and wall time (issue 49, item 1).

    python benchmarks/peers/optimum.py WORK [--layers 8] [--rounds 2] [--method last-token]

The checkpoint is the one ``benchmarks/export_memory.py`` builds: a random Qwen3-4B-shaped model
of ``--layers`` decoder layers, stored as real ones ship (bf16 safetensors shards and an index),
with SmolLM2's real BPE tokenizer by default. Each side exports it to fp32 ONNX in a fresh
process under ``/usr/bin/time -v``, one export at a time, interleaved (kvembed, Optimum, kvembed,
Optimum, ...), so a drift of the machine's speed hits both sides alike:

- kvembed: ``kvembed-export --method last-token --precision fp32`` (the full depth and the final
  hidden state, like Optimum's graph), through export_memory's own runner (stages included);
- Optimum: ``optimum-cli export onnx --task feature-extraction`` (a graph that returns the last
  hidden state, the task an embedder is exported with), from its own venv
  (``peer_venv.py``). Both check their graph against PyTorch before they finish, as shipped:
  Optimum's validation and kvembed's parity gate.

Peak RSS is ``/usr/bin/time -v``'s "Maximum resident set size" (the largest process), and the
process tree's summed RSS, polled. The record (benchmarks/record.py, into
benchmarks/results/peers/) carries both sides' figures, their ratios against the targets
(kvembed's peak at most :data:`PEAK_TARGET` of Optimum's, its wall at most Optimum's), the peer
venv's versions, and the load average at the start and end of every run. Walls measured while
the load average was :data:`QUIET_LOAD` or more are marked ``loaded``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import peer_venv  # noqa: E402
from export_memory import cpu_name, fp32_weight_bytes, run_export, tree_rss  # noqa: E402
from make_qwen3_06b_shaped import build_sharded  # noqa: E402
from record import RESULTS, figure, write_record  # noqa: E402

#: kvembed's peak export RSS may be at most this share of Optimum's (the issue's target)
PEAK_TARGET = 0.75
#: a 1-minute load average at or above this marks a run's wall time as taken on a loaded machine
QUIET_LOAD = 1.5
GIB = 1024**3
POLL_SECONDS = 0.1


def load() -> float:
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)


def peak_of(command: list[str], log: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``command`` under ``/usr/bin/time -v``: exit code, wall, time's peak RSS and the polled
    peak of the whole process tree (a tool that forks workers has a larger sum than its largest)."""
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as out:
        child = subprocess.Popen(["/usr/bin/time", "-v", *command], stdout=out, stderr=subprocess.STDOUT, env=env)
        process, peak, done = psutil.Process(child.pid), [0], threading.Event()

        def poll() -> None:
            while not done.is_set():
                try:
                    peak[0] = max(peak[0], tree_rss(process))
                except psutil.NoSuchProcess:  # the tree ended between two looks at it
                    return
                time.sleep(POLL_SECONDS)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        code = child.wait()
        done.set()
        poller.join()
    wall = time.monotonic() - start
    text = log.read_text(encoding="utf-8", errors="replace")
    max_kb = next((int(line.split(":")[1]) for line in text.splitlines() if "Maximum resident set size" in line), 0)
    return {"exit_code": code, "wall_s": round(wall, 1), "peak_rss_bytes": max_kb * 1024, "tree_peak_rss_bytes": peak[0]}


def optimum_export(work: Path, model: Path, out: Path, log: Path) -> dict[str, Any]:
    """One ``optimum-cli export onnx --task feature-extraction`` (fp32, CPU) in a fresh process."""
    cli = peer_venv.python(work).with_name("optimum-cli")
    command = [str(cli), "export", "onnx", "--model", str(model), "--task", "feature-extraction",
               "--device", "cpu", "--dtype", "fp32", str(out)]
    shutil.rmtree(out, ignore_errors=True)
    run = peak_of(command, log, env={**os.environ, "PYTHONPATH": ""})
    return {"side": "optimum", "command": command, **run}


def kvembed_export(model: Path, out: Path, method: str, log: Path) -> dict[str, Any]:
    """One ``kvembed-export --precision fp32`` in a fresh process (export_memory's runner)."""
    run = run_export(model, out, "fp32", method, None, log)
    tree_peak = max((stage["peak_rss_bytes"] for stage in run["stages"]), default=0)  # its polled samples, by stage
    return {"side": "kvembed", "method": method, "tree_peak_rss_bytes": tree_peak, **run}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def measured(side: str, work: Path, model: Path, method: str, round_: int) -> dict[str, Any]:
    """One export of ``side`` with the load average around it; its output is removed after."""
    out = work / f"optimum-bench-{side}"
    log = work / f"optimum-bench-{side}-{round_}.log"
    before = load()
    run = kvembed_export(model, out, method, log) if side == "kvembed" else optimum_export(work, model, out, log)
    after = load()
    run.update(round=round_, load_start=before, load_end=after, loaded=max(before, after) >= QUIET_LOAD,
               output_bytes=folder_bytes(out), log=str(log))
    shutil.rmtree(out, ignore_errors=True)
    print(f"{side} round {round_}: exit {run['exit_code']}, {run['wall_s']} s, peak {run['peak_rss_bytes'] / GIB:.2f} GiB "
          f"(load {before} -> {after})", flush=True)
    return run


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per side: its largest peak, its fastest and median wall (failed runs left out)."""
    out = {}
    for side in ("kvembed", "optimum"):
        ok = [r for r in runs if r["side"] == side and r["exit_code"] == 0]
        if ok:
            out[side] = {"peak_rss_bytes": max(r["peak_rss_bytes"] for r in ok),
                         "tree_peak_rss_bytes": max(r["tree_peak_rss_bytes"] for r in ok),
                         "wall_min_s": min(r["wall_s"] for r in ok), "wall_median_s": statistics.median(r["wall_s"] for r in ok),
                         "runs": len(ok)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", help="Work dir outside the repo (checkpoint, venv, exports, logs).")
    parser.add_argument("--layers", type=int, default=8, help="Decoder layers of the Qwen3-4B-shaped checkpoint.")
    parser.add_argument("--vocab", type=int, default=None, help="Vocabulary (default: the tokenizer's).")
    parser.add_argument("--tokenizer", default="smollm2-135m", help="export_memory's --tokenizer (a real BPE by default).")
    parser.add_argument("--method", default="last-token", help="kvembed's method (last-token: full depth, like Optimum's graph).")
    parser.add_argument("--rounds", type=int, default=2, help="Interleaved rounds, each one export per side.")
    parser.add_argument("--out-dir", type=Path, default=RESULTS / "peers", help="Where the record goes.")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    work = peer_venv.work_dir(args.work)
    peer_venv.ensure(work)
    suffix = "" if args.tokenizer is None else "-" + Path(args.tokenizer).name.replace(".", "_")
    model = work / f"qwen3-4b-shaped-{args.layers}l-bf16{suffix}"
    if not (model / "model.safetensors.index.json").exists():
        build_sharded(model, "4b", args.layers, args.vocab, tokenizer=args.tokenizer)
    # Optimum reads the checkpoint through transformers 4.x: the same weights, the config and
    # tokenizer settings spelled as 4.x reads them (peer_venv.transformers4_copy)
    peer_model = peer_venv.transformers4_copy(model, work / f"{model.name}-transformers4")
    start_load, runs = load(), []
    print(f"free memory {psutil.virtual_memory().available / GIB:.1f} GiB, load {start_load}", flush=True)
    for round_ in range(args.rounds):
        for side in ("kvembed", "optimum"):
            runs.append(measured(side, work, model if side == "kvembed" else peer_model, args.method, round_))
            # every run kept as it ends: an hour of exports is not lost to a later failure
            (work / "optimum-bench-runs.json").write_text(json.dumps(runs, indent=2) + "\n", encoding="utf-8")
    end_load = load()
    sides = summary(runs)
    figures = {}
    for side, values in sides.items():
        figures[f"{side} export peak RSS"] = figure(round(values["peak_rss_bytes"] / GIB, 2), "GiB")
        figures[f"{side} export wall (fastest)"] = figure(values["wall_min_s"], "s")
    targets: dict[str, Any] = {"peak_ratio_at_most": PEAK_TARGET, "wall_ratio_at_most": 1.0}
    if len(sides) == 2:
        peak_ratio = sides["kvembed"]["peak_rss_bytes"] / sides["optimum"]["peak_rss_bytes"]
        wall_ratio = sides["kvembed"]["wall_min_s"] / sides["optimum"]["wall_min_s"]
        figures["peak RSS kvembed / optimum"] = figure(round(peak_ratio, 3), "x")
        figures["wall kvembed / optimum"] = figure(round(wall_ratio, 3), "x")
        targets.update(peak_met=peak_ratio <= PEAK_TARGET, wall_met=wall_ratio <= 1.0)
    if not figures:
        raise SystemExit("no export finished on either side; see the logs in " + str(work))
    loaded = any(r["loaded"] for r in runs) or max(start_load, end_load) >= QUIET_LOAD
    write_record("peers_optimum_export", figures, directory=args.out_dir,
                 checkpoint={"path": str(model), "optimum_path": str(peer_model), "layers": args.layers,
                             "tokenizer": args.tokenizer, "fp32_weight_bytes": fp32_weight_bytes(model)},
                 cpu_name=cpu_name(), load_start=start_load, load_end=end_load,
                 walls_loaded=loaded, targets=targets, sides=sides, runs=runs,
                 peer_versions=peer_venv.versions(work))


if __name__ == "__main__":
    main()
