"""Triton python-backend ensemble vs the in-process ``Embedder``: throughput, latency, full load test.

Writes a repository for one artifact (default: stories260k exported with kv-embedding to a
temporary directory), starts the pip-installed ``tritonserver`` on it (stub environment:
$KVEMBED_TRITON_PYTHON or .venv-triton), and for each client count runs

- in-process: that many threads calling ``Embedder.encode([text])`` on one shared embedder;
- Triton: that many threads, each with its own tritonclient (gRPC by default), one text a request;

reporting texts/s and p50/p99 latency per request, plus the in-process batched ceiling
(``encode(all, batch_size=64)``). Then the issue's load test: 32 clients x 200 requests, every
response compared with the runtime, server health checked after.

Run: python benchmarks/triton_bench.py [--artifact DIR] [--clients 1,8,32] [--seconds 10] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from kvembed.runtime import Embedder
from kvembed.triton import write_repository
from kvembed.triton.server import TritonServer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from triton_util import assert_close, infer, make_client  # noqa: E402


def corpus(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "the a little cat dog girl boy ran sat played happy park sun tree home ball big red".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) for _ in range(count)]


def percentiles(latencies: list[float]) -> tuple[float, float]:
    values = np.asarray(latencies) * 1000
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def closed_loop(clients: int, seconds: float, call) -> dict:
    """``clients`` threads calling ``call(client_index, step)`` back to back for ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    start_gate = threading.Barrier(clients + 1)
    stop_at: list[float] = []

    def worker(index: int) -> None:
        start_gate.wait()
        step = 0
        while time.perf_counter() < stop_at[0]:
            began = time.perf_counter()
            call(index, step)
            latencies[index].append(time.perf_counter() - began)
            step += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    stop_at.append(began + seconds)
    start_gate.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    flat = [value for values in latencies for value in values]
    p50, p99 = percentiles(flat)
    return {"clients": clients, "requests": len(flat), "seconds": elapsed, "texts_per_s": len(flat) / elapsed, "p50_ms": p50, "p99_ms": p99}


def load_test(server, embedder: Embedder, texts: list[str], clients: int, requests: int, protocol: str) -> dict:
    want = {kind: embedder.encode(texts, kind=kind) for kind in ("query", "document")}
    errors: list[str] = []

    def run(index: int) -> int:
        client = make_client(protocol, server)
        for step in range(requests):
            pick = (index * 131 + step * 17) % len(texts)
            kind = ("query", "document")[(index + step) % 2]
            try:
                got = infer(client, protocol, "bench", [texts[pick]], kind=kind)["embedding"]
                assert_close(got, want[kind][pick : pick + 1], f"client {index} request {step}")
            except Exception as err:  # counted and reported, never lost
                errors.append(f"{type(err).__name__}: {err}"[:200])
        return requests

    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        sent = sum(pool.map(run, range(clients)))
    elapsed = time.perf_counter() - began
    admin = make_client("http", server)
    healthy = admin.is_server_ready() and admin.is_model_ready("bench")
    return {"clients": clients, "requests": sent, "errors": len(errors), "first_errors": errors[:3],
            "seconds": elapsed, "texts_per_s": sent / elapsed, "healthy_after": bool(healthy)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, help="artifact directory (default: export stories260k kv-embedding)")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each closed-loop cell")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads, in-process and per Triton model instance")
    parser.add_argument("--load-clients", type=int, default=32)
    parser.add_argument("--load-requests", type=int, default=200)
    parser.add_argument("--python", default=os.environ.get("KVEMBED_TRITON_PYTHON") or str(ROOT / ".venv-triton" / "bin" / "python"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    texts = corpus(512)
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        artifact = args.artifact
        if artifact is None:
            from kvembed.export import export

            artifact = export("stories260k", "kv-embedding", Path(tmp) / "artifact")
        embedder = Embedder.load(artifact, provider="cpu", threads=args.threads or None)
        embedder.encode(texts[:64])
        results: dict = {"artifact": str(artifact), "method": embedder.method.name, "protocol": args.protocol,
                         "threads": args.threads, "instances": args.instances, "max_queue_delay_us": args.max_queue_delay_us,
                         "cpus": os.cpu_count(), "in_process": [], "triton": []}
        began = time.perf_counter()
        embedder.encode(texts, batch_size=64)
        results["in_process_batched_texts_per_s"] = len(texts) / (time.perf_counter() - began)
        for count in clients:
            cell = closed_loop(count, args.seconds, lambda i, s: embedder.encode([texts[(i * 131 + s) % len(texts)]]))
            results["in_process"].append(cell)
            print("in-process", json.dumps(cell), flush=True)
        repository = write_repository(artifact, Path(tmp) / "repo", "bench", max_queue_delay_us=args.max_queue_delay_us,
                                      instances=args.instances, threads=args.threads, warmup=True)
        with open(Path(tmp) / "server.log", "w") as log, TritonServer(repository, python=args.python, log=log) as server:
            for count in clients:
                local = threading.local()

                def call(index: int, step: int) -> None:
                    if not hasattr(local, "client"):
                        local.client = make_client(args.protocol, server)
                    infer(local.client, args.protocol, "bench", [texts[(index * 131 + step) % len(texts)]])

                cell = closed_loop(count, args.seconds, call)
                results["triton"].append(cell)
                print("triton", json.dumps(cell), flush=True)
            admin = make_client("http", server)
            results["tokenize_batches"] = {
                b["batch_size"]: b["compute_infer"]["count"]
                for b in admin.get_inference_statistics("bench_tokenize")["model_stats"][0]["batch_stats"]
            }
            results["load_test"] = load_test(server, embedder, texts, args.load_clients, args.load_requests, args.protocol)
            print("load", json.dumps(results["load_test"]), flush=True)
    print_table(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


def print_table(results: dict) -> None:
    print(f"\n{results['method']} artifact, Triton {results['protocol']} vs in-process Embedder, {results['cpus']} CPUs, "
          f"{results['threads']} onnxruntime thread(s), {results['instances']} instance(s), queue delay {results['max_queue_delay_us']} us")
    print("| clients | in-process texts/s | p50 / p99 ms | Triton texts/s | p50 / p99 ms | Triton / in-process |")
    print("|---|---|---|---|---|---|")
    for local, remote in zip(results["in_process"], results["triton"]):
        print(f"| {local['clients']} | {local['texts_per_s']:.0f} | {local['p50_ms']:.2f} / {local['p99_ms']:.2f} | "
              f"{remote['texts_per_s']:.0f} | {remote['p50_ms']:.2f} / {remote['p99_ms']:.2f} | "
              f"{remote['texts_per_s'] / local['texts_per_s']:.2f}x |")
    print(f"in-process batched ceiling (encode(512 texts, batch_size=64)): {results['in_process_batched_texts_per_s']:.0f} texts/s")
    load = results["load_test"]
    print(f"load test: {load['clients']} clients x {load['requests'] // load['clients']} requests: {load['errors']} errors, "
          f"{load['seconds']:.1f} s ({load['texts_per_s']:.0f} texts/s), healthy after: {load['healthy_after']}")


if __name__ == "__main__":
    main()
