"""Issue 34's bundle targets, measured: ``python benchmarks/bundle_bench.py --artifact DIR``.

- build: ``kvembed bundle DIR --out ...`` for this machine with pip's cache warm (one untimed build
  first), without and with ``--tar``;
- install: the tarball unpacked into a fresh directory, ``install.sh`` run with the package index
  unreachable (``unshare --net`` where allowed; pip pointed at a closed loopback port, no config);
- first request: ``run.sh`` started, then one ``POST /v1/embeddings`` retried until it answers 200;
  stopped with SIGTERM (its exit code is reported);
- wheelhouse size: linux-x86_64 and linux-aarch64, without and with ``--with openvino``.

Prints a markdown table (and writes ``--json``). Everything runs in ``--work`` (a temporary
directory unless given); the artifact is only read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx

from kvembed.bundle.offline import network_cut, offline_env

KVEMBED = str(Path(sys.executable).with_name("kvembed"))
#: wheelhouses whose size is reported: (label, kvembed bundle options). OpenVINO's current aarch64
#: wheels need glibc 2.35 (at the default 2.28 the bundle is refused, naming openvino)
SIZES = (
    ("linux-x86_64", ["--platform", "linux-x86_64"]),
    ("linux-x86_64 +openvino", ["--platform", "linux-x86_64", "--with", "openvino"]),
    ("linux-aarch64", ["--platform", "linux-aarch64"]),
    ("linux-aarch64 +openvino, --glibc 2.35", ["--platform", "linux-aarch64", "--with", "openvino", "--glibc", "2.35"]),
)


def bundle(artifact: Path, out: Path, *extra: str) -> tuple[float, dict]:
    started = time.monotonic()
    done = subprocess.run([KVEMBED, "bundle", f"model={artifact}", "--out", str(out), "--force", *extra],
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"kvembed bundle {' '.join(extra)} failed: {done.stderr.strip()}")
    return seconds, json.loads((out / "bundle.json").read_text())


def install(tarball: Path, where: Path) -> float:
    where.mkdir(parents=True)
    with tarfile.open(tarball) as archive:
        archive.extractall(where, filter="tar")
    (root,) = where.iterdir()
    started = time.monotonic()
    done = subprocess.run([*network_cut(), str(root / "install.sh")], env=offline_env(), cwd=where, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"install.sh failed: {done.stderr.strip()[-2000:]}")
    return seconds


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def first_request(root: Path, log: Path) -> tuple[float, int]:
    """Seconds from run.sh's start to the first 200 on /v1/embeddings, and run.sh's exit code after SIGTERM."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/embeddings"
    started = time.monotonic()
    with open(log, "wb") as sink:
        server = subprocess.Popen([str(root / "run.sh"), "--port", str(port)], stdout=sink, stderr=subprocess.STDOUT,
                                  env=offline_env(), cwd=root)
    try:
        while True:
            if server.poll() is not None or time.monotonic() - started > 300:
                raise SystemExit(f"run.sh did not answer: {log.read_text()[-2000:]}")
            try:
                if httpx.post(url, json={"model": "model", "input": "a cat"}, timeout=30).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        seconds = time.monotonic() - started
        server.send_signal(signal.SIGTERM)
        return seconds, server.wait(120)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def cpu_name() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", type=Path, required=True, help="artifact directory to bundle")
    parser.add_argument("--runs", type=int, default=3, help="repeats of each timed step")
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bundle-bench-")) if args.work is None else args.work
    work.mkdir(parents=True, exist_ok=True)
    artifact_mb = sum(p.stat().st_size for p in args.artifact.iterdir() if p.is_file()) / 1e6
    results: dict = {"cpu": cpu_name(), "cores": os.cpu_count(), "load_before": os.getloadavg()[0],
                     "artifact": str(args.artifact), "artifact_mb": round(artifact_mb, 1)}
    try:
        bundle(args.artifact, work / "warm")  # pip's cache warm, as the target says
        results["build_s"] = [round(bundle(args.artifact, work / f"b{i}")[0], 1) for i in range(args.runs)]
        tarred = [bundle(args.artifact, work / "bundle", "--tar") for _ in range(args.runs)]
        results["build_tar_s"] = [round(seconds, 1) for seconds, _ in tarred]
        tarball = work / "bundle.tar.gz"
        results["tarball_mb"] = round(tarball.stat().st_size / 1e6, 1)
        results["install_s"] = [round(install(tarball, work / f"host{i}"), 1) for i in range(args.runs)]
        root = work / "host0" / "bundle"
        starts = [first_request(root, work / f"run{i}.log") for i in range(args.runs)]
        results["first_request_s"] = [round(seconds, 2) for seconds, _ in starts]
        results["sigterm_exit"] = [code for _, code in starts]
        sizes = {}
        for label, extra in SIZES:
            _, manifest = bundle(args.artifact, work / "size", *extra)
            sizes[label] = round(manifest["wheelhouse_bytes"] / 1e6, 1)
        results["wheelhouse_mb"] = sizes
        results["load_after"] = os.getloadavg()[0]
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{results['cpu']}, {results['cores']} cores, load {results['load_before']:.1f} -> {results['load_after']:.1f}; "
          f"artifact {results['artifact_mb']} MB\n")
    print("| step | runs | target |\n|---|---|---|")
    print(f"| build, warm pip cache | {', '.join(map(str, results['build_s']))} s | <= 120 s |")
    print(f"| build with --tar ({results['tarball_mb']} MB) | {', '.join(map(str, results['build_tar_s']))} s | |")
    print(f"| install.sh offline | {', '.join(map(str, results['install_s']))} s | <= 60 s |")
    print(f"| run.sh start to first answered request | {', '.join(map(str, results['first_request_s']))} s (SIGTERM exit {results['sigterm_exit']}) | <= 10 s |")
    for name, mb in results["wheelhouse_mb"].items():
        print(f"| wheelhouse {name} | {mb} MB | {'<= 150 MB' if name == 'linux-x86_64' else ''} |")


if __name__ == "__main__":
    main()
