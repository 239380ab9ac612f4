"""Peak memory of ``Embedder.load`` + one 16 x 128 batch, against the artifact's bytes (issue 30).

Each configuration runs in a fresh process under ``/usr/bin/time -v``: it loads the artifact,
embeds 16 texts cut to 128 tokens (one warm-up batch, then ``--reps`` timed ones) and reports
VmHWM (``/proc/self/status``: the peak the kernel saw) after the load and after the batches,
the RSS / PSS / anonymous split of ``/proc/self/smaps_rollup``, and the median time per batch.
Configurations (onnxruntime CPU):

- ``auto``: ``Embedder.load(dir)``, the backend kvembed chooses here (its OpenVINO blobs cached in
  ``--cache``, compiled by a run before the measured ones); ``default``: what ``Embedder.load(dir, provider="cpu")`` does now;
- ``ort-prepack``: onnxruntime's own defaults (weights pre-packed at load, CPU arena on): the
  baseline of the speed ratios; ``ort-noprepack``: pre-packing off (``session.disable_prepacking``);
- ``ort-noarena``, ``ort-noprepack-noarena``: the same with the CPU memory arena off;
- ``ort-nofuse...`` (by name only): onnxruntime's QDQ fusions off (``session.disable_quant_qdq``);
- ``openvino-bf16``, ``openvino-f32``, ``openvino-f16``: OpenVINO's CPU plugin with that precision
  hint, compiled from the ONNX (no cache); ``openvino-bf16-cached``, ``openvino-f16-cached``:
  imported from a blob compiled beforehand.

``auto`` and the cached configurations first run once to compile and write the blob; that run is
reported too, as ``first_load``.

Rounds interleave the configurations (round 1: every configuration once, round 2: again ...), so
speed ratios within one run are comparable on a shared machine. ``--sharing`` starts two processes
on the same artifact at once and reports each one's RSS and PSS while both hold it.

    python benchmarks/load_memory.py --artifacts /tmp/a-fp32 /tmp/a-fp16 /tmp/a-int8 --rounds 2 --out benchmarks/results/load-memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

GIB = 1024**3
BASELINE = "ort-prepack"  # speed ratios are against onnxruntime's own defaults
ORT_CONFIGS = ("auto", "default", "ort-prepack", "ort-noprepack", "ort-noarena", "ort-noprepack-noarena")
#: onnxruntime without its QDQ fusions (``-nofuse``), asked for by name only: a weight-only int8 graph
#: then dequantises each weight during the call instead of holding MatMulNBits' copy of it
EXTRA_CONFIGS = ("ort-nofuse", "ort-nofuse-noarena", "ort-noprepack-noarena-nofuse")
OV_CONFIGS = ("openvino-bf16", "openvino-f32", "openvino-f16", "openvino-bf16-cached", "openvino-f16-cached")
TEXT = "The quick brown fox jumps over the lazy dog while the little cat sat in the sun. " * 20


def status_kb(field: str) -> int:
    """A ``kB`` line of ``/proc/self/status`` (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def rollup() -> dict[str, int]:
    """``/proc/self/smaps_rollup`` in bytes: Rss, Pss, Anonymous, Pss_File ..."""
    out = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "kB":
            out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def artifact_bytes(artifact: Path) -> int:
    return sum(p.stat().st_size for p in artifact.iterdir() if p.is_file())


def open_embedder(artifact: Path, config: str, threads: int, cache: Path) -> Any:
    """The Embedder a configuration describes (ORT variants build their session options here)."""
    from kvembed import OpenVINOOptions
    from kvembed.runtime import Embedder

    if config == "default":
        return Embedder.load(artifact, provider="cpu", threads=threads, verify=False)
    if config == "auto":  # what a user gets: the backend kvembed chooses for this artifact on this machine
        return Embedder.load(artifact, threads=threads, verify=False, options=[OpenVINOOptions(cache_dir=cache)])
    if config.startswith("openvino"):
        precision = config.split("-")[1]
        return Embedder.load(artifact, provider="openvino", threads=threads, verify=False, options=OpenVINOOptions(precision=precision, cache_dir=cache if config.endswith("cached") else False))
    from kvembed.artifact import MODEL, load_manifest
    from kvembed.backends.onnxruntime import CPU, OnnxRuntimeSession, open_session, session_options
    from kvembed.runtime.artifact import encoder_from_manifest

    options = session_options(threads, memory_arena="noarena" not in config, prepacking="noprepack" not in config)
    if "nofuse" in config:  # no QDQ fusion: a weight-only graph's DequantizeLinear -> MatMul stays as written
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    manifest = load_manifest(artifact)
    session = OnnxRuntimeSession(open_session(artifact / MODEL, options, [CPU]))
    return Embedder(artifact, manifest, encoder_from_manifest(artifact, manifest), session)


def child(args: argparse.Namespace) -> None:
    """One configuration in this process; prints one JSON line."""
    import numpy as np  # noqa: F401  (imported before the baseline, as the runtime imports it)
    import onnxruntime  # noqa: F401
    import tokenizers  # noqa: F401

    base = status_kb("VmRSS")
    start = time.perf_counter()
    embedder = open_embedder(args.artifact, args.config, args.threads, args.cache)
    load_s = time.perf_counter() - start
    after_load = {"rss": status_kb("VmRSS"), "hwm": status_kb("VmHWM"), **{k.lower(): v for k, v in rollup().items() if k in ("Pss", "Anonymous")}}
    embedder.cap_input_tokens(args.tokens)
    texts = [f"{i} {TEXT}" for i in range(args.batch)]
    warnings.simplefilter("ignore")  # every text is truncated on purpose
    widths = {len(item.ids) for item in embedder.encoder.encode(texts)}
    embedder.encode(texts, batch_size=args.batch)  # warm-up
    times, small = [], []
    for _ in range(args.reps):
        start = time.perf_counter()
        embedder.encode(texts, batch_size=args.batch)
        times.append(time.perf_counter() - start)
    embedder.cap_input_tokens(args.query_tokens)  # one short query: where on-the-fly packing weighs most against the product
    embedder.encode(texts[:1])
    for _ in range(args.reps):
        start = time.perf_counter()
        embedder.encode(texts[:1])
        small.append(time.perf_counter() - start)
    if args.barrier is not None:  # --sharing: measure while the other process holds the artifact too
        (args.barrier / f"{os.getpid()}.ready").touch()
        deadline = time.monotonic() + 600
        while len(list(args.barrier.glob("*.ready"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
    roll = rollup()
    if args.barrier is not None:  # and stay until the other process has measured too
        (args.barrier / f"{os.getpid()}.done").touch()
        deadline = time.monotonic() + 600
        while len(list(args.barrier.glob("*.done"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    print(json.dumps({
        "config": args.config, "artifact": str(args.artifact), "baseline_rss": base, "load_s": round(load_s, 2),
        "after_load": after_load, "rss": status_kb("VmRSS"), "hwm": status_kb("VmHWM"),
        "pss": roll.get("Pss", 0), "anonymous": roll.get("Anonymous", 0), "pss_file": roll.get("Pss_File", 0),
        "batch_s": round(statistics.median(times), 4), "query_s": round(statistics.median(small), 4), "widths": sorted(widths), "target": embedder.target,
    }), flush=True)


def speed(args: argparse.Namespace) -> None:
    """``--speed``: the configurations' Embedders side by side in this one process, called in turn
    (A B C A B C ...), so each ratio compares calls made under the same machine load."""
    embedders = {config: open_embedder(args.artifact, config, args.threads, args.cache) for config in args.configs.split(",")}
    texts = [f"{i} {TEXT}" for i in range(args.batch)]
    warnings.simplefilter("ignore")
    times: dict[str, dict[str, list[float]]] = {c: {"batch": [], "query": []} for c in embedders}
    for _ in range(args.reps + 1):  # the first turn warms up
        for config, embedder in embedders.items():
            for kind, count, tokens in (("batch", args.batch, args.tokens), ("query", 1, args.query_tokens)):
                embedder.encoder.max_length = tokens
                start = time.perf_counter()
                embedder.encode(texts[:count], batch_size=args.batch)
                times[config][kind].append(time.perf_counter() - start)
    base = next(iter(embedders))
    print(f"{args.artifact.name}: {args.reps} turns, medians (ratio = {base}'s time / this one's: >1 is faster)")
    for config, got in times.items():
        cells = []
        for kind in ("batch", "query"):
            median = statistics.median(got[kind][1:])
            ratio = statistics.median(b / t for b, t in zip(times[base][kind][1:], got[kind][1:]))
            cells.append(f"{kind} {median:.3f} s ({ratio:.2f}x)")
        print(f"  {config}: {', '.join(cells)}")


def run_child(artifact: Path, config: str, args: argparse.Namespace, barrier: Path | None = None) -> subprocess.Popen:
    command = ["/usr/bin/time", "-v", sys.executable, __file__, "--child", "--artifact", str(artifact), "--config", config,
               "--threads", str(args.threads), "--reps", str(args.reps), "--batch", str(args.batch),
               "--tokens", str(args.tokens), "--query-tokens", str(args.query_tokens), "--cache", str(args.cache)]
    if barrier is not None:
        command += ["--barrier", str(barrier)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> dict[str, Any]:
    out, err = process.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if process.returncode or not lines:
        return {"error": (err.strip().splitlines() or ["?"])[-1][:300], "exit_code": process.returncode}
    result = json.loads(lines[-1])
    result["time_max_rss"] = next((int(l.split(":")[1]) * 1024 for l in err.splitlines() if "Maximum resident set size" in l), 0)
    return result


def markdown(runs: list[dict[str, Any]]) -> str:
    """Per artifact and configuration: peak RSS, peak - artifact bytes, x artifact, load, s per call, speed vs :data:`BASELINE`."""
    rows = ["| artifact | config | artifact GB | peak RSS GB (time -v) | peak - artifact GB | x artifact | RSS after load GB | RSS at end GB (file-backed) | load s | 16x128 s | speed vs ort-prepack | 1 query s | speed vs ort-prepack |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    by_artifact: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_artifact.setdefault(run["artifact"], []).append(run)
    for artifact, items in by_artifact.items():
        size = items[0]["artifact_bytes"]
        configs = list(dict.fromkeys(r["config"] for r in items))
        default = [r["batch_s"] for r in items if r["config"] == BASELINE and "batch_s" in r]
        default_query = [r["query_s"] for r in items if r["config"] == BASELINE and "query_s" in r]
        for config in configs:
            done = [r for r in items if r["config"] == config and "error" not in r]
            if not done:
                error = next(r for r in items if r["config"] == config)["error"]
                rows.append(f"| {Path(artifact).name} | {config} | {size / 1e9:.2f} | failed: {error} | | | | | | | | | |")
                continue
            peak = max(r["time_max_rss"] or r["hwm"] for r in done)
            batch = statistics.median(r["batch_s"] for r in done)
            ratio = f"{statistics.median(default) / batch:.2f}x" if default else ""
            query = statistics.median(r["query_s"] for r in done)
            query_ratio = f"{statistics.median(default_query) / query:.2f}x" if default_query else ""
            rows.append(
                f"| {Path(artifact).name} | {config} | {size / 1e9:.2f} | {peak / 1e9:.2f} | {(peak - size) / 1e9:+.2f} | "
                f"{peak / size:.2f} | {statistics.median(r['after_load']['rss'] for r in done) / 1e9:.2f} | "
                f"{statistics.median(r['rss'] for r in done) / 1e9:.2f} ({statistics.median(r['pss_file'] for r in done) / 1e9:.2f}) | "
                f"{statistics.median(r['load_s'] for r in done):.1f} | {batch:.3f} | {ratio} | {query:.3f} | {query_ratio} |"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", nargs="*", type=Path, default=[])
    parser.add_argument("--configs", default=",".join(ORT_CONFIGS + OV_CONFIGS),
                        help="Comma-separated; OpenVINO configurations run on artifacts OpenVINO can run (fp32, fp16, bf16, int8 with its OpenVINO graph).")
    parser.add_argument("--rounds", type=int, default=1, help="Interleaved rounds (each configuration once per round).")
    parser.add_argument("--reps", type=int, default=5, help="Timed 16 x 128 batches per process (after one warm-up).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--query-tokens", type=int, default=64, help="Tokens of the one-text call timed after the batches (prompt included).")
    parser.add_argument("--sharing", action="store_true", help="Also: two processes on one artifact at once.")
    parser.add_argument("--sharing-config", default="default", help="The configuration both --sharing processes run.")
    parser.add_argument("--cache", type=Path, default=None, help="OpenVINO blob cache for *-cached (default: a temporary folder).")
    parser.add_argument("--out", type=Path, default=None, help="JSON results file.")
    parser.add_argument("--speed", action="store_true",
                        help="Time the --configs side by side in one process on --artifact (turns interleaved), no memory.")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--artifact", type=Path, help="The artifact of --speed.")
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--barrier", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.speed:
        args.cache = args.cache or Path(tempfile.mkdtemp(prefix="load-memory-"))
        speed(args)
        return
    missing = [str(a) for a in args.artifacts if not (a / "kvembed.json").is_file()]
    if missing:
        parser.error(f"not a kvembed artifact (no kvembed.json): {', '.join(missing)}")
    configs = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(configs) - set(ORT_CONFIGS + EXTRA_CONFIGS + OV_CONFIGS))
    if unknown:
        parser.error(f"unknown --configs {', '.join(unknown)}; known: {', '.join(ORT_CONFIGS + EXTRA_CONFIGS + OV_CONFIGS)}")
    from kvembed.artifact import load_manifest

    temporary = tempfile.TemporaryDirectory(prefix="load-memory-")
    args.cache = args.cache or Path(temporary.name) / "ov-cache"
    runs: list[dict[str, Any]] = []
    first_loads: list[dict[str, Any]] = []
    for artifact in args.artifacts:
        manifest = load_manifest(artifact)
        precision = manifest.precision
        # OpenVINO runs an int8 artifact's own OpenVINO graph; one without (older exports) is not worth timing there
        openvino_graph = precision != "int8" or "openvino" in manifest.graphs
        chosen = [c for c in configs if not c.startswith("openvino") or openvino_graph]
        skipped = sorted(set(configs) - set(chosen))
        if skipped:
            print(f"{artifact.name}: skipping {', '.join(skipped)} (a {precision} artifact without an OpenVINO graph)", flush=True)
        for warm in [c for c in chosen if c == "auto" or c.endswith("-cached")]:  # compile once: cached runs import a blob
            result = finish(run_child(artifact, warm, args))
            result.update(artifact=str(artifact), config=warm, precision=precision, first_load=True,
                          artifact_bytes=artifact_bytes(artifact))
            print(json.dumps(result), flush=True)
            first_loads.append(result)
        for round_ in range(args.rounds):
            for config in chosen:
                result = finish(run_child(artifact, config, args))
                result.update(artifact=str(artifact), config=config, precision=precision, round=round_,
                              artifact_bytes=artifact_bytes(artifact))
                runs.append(result)
                print(json.dumps(result), flush=True)
    sharing = []
    if args.sharing:
        for artifact in args.artifacts:
            with tempfile.TemporaryDirectory() as barrier:
                pair = [run_child(artifact, args.sharing_config, args, Path(barrier)) for _ in range(2)]
                both = [finish(p) for p in pair]
            entry = {"artifact": str(artifact), "config": args.sharing_config, "artifact_bytes": artifact_bytes(artifact),
                     "processes": [{k: r.get(k) for k in ("rss", "pss", "anonymous", "pss_file", "hwm", "error")} for r in both]}
            sharing.append(entry)
            print(json.dumps(entry), flush=True)
    print()
    print(markdown(runs))
    for entry in sharing:
        cells = ", ".join(f"RSS {p['rss'] / 1e9:.2f} / PSS {p['pss'] / 1e9:.2f} / anon {p['anonymous'] / 1e9:.2f} GB"
                          for p in entry["processes"] if p.get("rss"))
        print(f"two processes on {Path(entry['artifact']).name} ({entry['artifact_bytes'] / 1e9:.2f} GB, {entry['config']}): {cells}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"runs": runs, "first_loads": first_loads, "sharing": sharing}, indent=2) + "\n", encoding="utf-8")
    record_peaks(runs + first_loads)


def record_peaks(results: list[dict[str, Any]]) -> None:
    """One record of every configuration's highest peak RSS (GB), first loads apart."""
    from record import figure, write_record  # benchmarks/record.py, beside this script

    peaks: dict[str, float] = {}
    for r in results:
        peak = r.get("time_max_rss") or r.get("hwm")
        if peak:
            name = f"{Path(r['artifact']).name} {r['config']}{' first load' if r.get('first_load') else ''} peak RSS"
            peaks[name] = max(peaks.get(name, 0.0), peak / 1e9)
    if peaks:
        write_record("load_memory", {name: figure(round(gb, 2), "GB") for name, gb in peaks.items()})


if __name__ == "__main__":
    main()
