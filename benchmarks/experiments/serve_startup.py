"""Where ``kvembed serve``'s start-up time goes: the checks before the bind vs opening the session after it.

    python benchmarks/experiments/serve_startup.py ARTIFACT [--rounds 3]

In process: the pre-bind checks (:func:`kvembed.serve.preflight.check_artifact`: manifest, sha256
of every file, tokenizer, prompt vs cap) split into hashing and the rest, and the loading thread's
work (``Embedder.load(verify=False)``: the onnxruntime session). Then a real ``kvembed serve``
process: seconds from launch until the port accepts connections (``/health`` answers, 503 while
loading) and until it is ready (``/health`` 200). Medians over rounds. The split decides what runs
before the bind (cheap checks whose failure should be one line) and what after (slow loading that
``/health`` should report).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kvembed.bench.served import free_port, kvembed_command, stop_process  # noqa: E402

from kvembed.runtime import Embedder  # noqa: E402
from kvembed.artifact import check_files, load_manifest  # noqa: E402
from kvembed.serve.config import ServeConfig  # noqa: E402
from kvembed.serve.preflight import check_artifact  # noqa: E402


def timed(job) -> float:
    start = time.perf_counter()
    job()
    return time.perf_counter() - start


def process_start(artifact: Path, log: Path) -> tuple[float, float]:
    """Seconds from launching ``kvembed serve`` to the port answering, and to ``/health`` 200."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    start = time.perf_counter()
    with open(log, "wb") as out:
        process = subprocess.Popen([*kvembed_command(), "serve", str(artifact), "--port", str(port)], stdout=out, stderr=subprocess.STDOUT)
    bound = None
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"kvembed serve exited with {process.returncode}: {log.read_text()}")
            try:
                status = httpx.get(url, timeout=5).status_code
            except httpx.TransportError:
                time.sleep(0.02)
                continue
            bound = bound or time.perf_counter() - start
            if status == 200:
                return bound, time.perf_counter() - start
            time.sleep(0.02)
    finally:
        stop_process(process, 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = ServeConfig(artifacts=(("model", args.artifact),), provider="cpu")
    manifest = load_manifest(args.artifact)
    size = sum(record.bytes for record in manifest.files.values())
    cells: dict[str, list[float]] = {"hash every file": [], "pre-bind checks in all": [], "session (loading thread)": [],
                                     "process: port answers": [], "process: ready": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            cells["hash every file"].append(timed(lambda: check_files(args.artifact, manifest)))
            cells["pre-bind checks in all"].append(timed(lambda: check_artifact("model", args.artifact, config)))
            cells["session (loading thread)"].append(timed(lambda: Embedder.load(args.artifact, provider="cpu", verify=False)))
            bound, ready = process_start(args.artifact, Path(tmp) / "serve.log")
            cells["process: port answers"].append(bound)
            cells["process: ready"].append(ready)
    print(f"{args.artifact}: {size / 1e6:.0f} MB of files, {args.rounds} rounds, medians")
    for cell, values in cells.items():
        print(f"  {cell}: {statistics.median(values):.2f} s  (all: {', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
