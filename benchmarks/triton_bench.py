"""Triton python-backend ensemble vs the in-process ``Embedder``: throughput, latency, full load test.

Writes a repository for one artifact (default: stories260k exported with kv-embedding to a
temporary directory), starts the pip-installed ``tritonserver`` on it (stub environment:
$KVEMBED_TRITON_PYTHON or .venv-triton), and for each client count runs

- in-process: that many threads calling ``Embedder.encode([text])`` on one shared embedder;
- Triton: that many concurrent clients (asyncio tasks, each with its own tritonclient aio client,
  gRPC by default), one text a request;

reporting texts/s and p50/p99 latency per request, plus the in-process batched ceiling
(``encode(all, batch_size=64)``). Then the issue's load test: 32 clients x 200 requests, every
response compared with the runtime, server health checked after.

Cells alternate (in-process, Triton) for ``--rounds`` rounds and report medians, so a shared
machine's load drift hits both sides alike.

Run: python benchmarks/triton_bench.py [--artifact DIR] [--clients 1,8,32] [--seconds 5] [--rounds 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from kvembed.errors import KvembedError
from kvembed.runtime import Embedder, read_manifest
from kvembed.triton import write_repository
from kvembed.triton.client import infer, make_client
from kvembed.triton.server import TritonServer, find_tritonserver, stub_environment

ROOT = Path(__file__).resolve().parents[1]


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


def triton_cell(server, args, texts: list[str], count: int) -> dict:
    """One closed-loop cell against the server: ``count`` concurrent clients as asyncio tasks in
    one thread, each with its own aio client. Python threads would be fairer to nobody: on a
    2-core host, 32 busy client threads starve the server's single-threaded python stubs of CPU
    (the OS shares CPU per thread), which measures the benchmark, not the server."""
    import asyncio

    if args.protocol == "grpc":
        import tritonclient.grpc as module
        import tritonclient.grpc.aio as aio
        url = server.grpc_url
    else:
        import tritonclient.http as module
        import tritonclient.http.aio as aio
        url = server.http_url

    async def client_loop(index: int, stop_at: float, latencies: list[float]) -> None:
        client = aio.InferenceServerClient(url)
        step = 0
        try:
            while time.perf_counter() < stop_at:
                array = np.array([[texts[(index * 131 + step) % len(texts)].encode()]], dtype=object)
                tensor = module.InferInput("TEXT", [1, 1], "BYTES")
                tensor.set_data_from_numpy(array)
                began = time.perf_counter()
                await client.infer("bench", [tensor], outputs=[module.InferRequestedOutput("embedding")])
                latencies.append(time.perf_counter() - began)
                step += 1
        finally:
            await client.close()

    async def run() -> tuple[list[float], float]:
        latencies: list[float] = []
        began = time.perf_counter()
        await asyncio.gather(*(client_loop(i, began + args.seconds, latencies) for i in range(count)))
        return latencies, time.perf_counter() - began

    latencies, elapsed = asyncio.run(run())
    p50, p99 = percentiles(latencies)
    return {"clients": count, "requests": len(latencies), "seconds": elapsed, "texts_per_s": len(latencies) / elapsed,
            "p50_ms": p50, "p99_ms": p99}


def server_cpu_split(server) -> dict[str, float]:
    """User + system CPU seconds so far of tritonserver (``tritonserver``) and of its python
    backend stubs, summed per model (a stub's command line names its model instance)."""
    import psutil

    root = psutil.Process(server.process.pid)
    split: dict[str, float] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            command = process.cmdline()
        except psutil.NoSuchProcess:
            continue
        role = "tritonserver"
        if process.pid != root.pid:
            instance = command[-2] if len(command) >= 2 else "stub"  # e.g. bench_model_0_1
            role = instance.rsplit("_", 2)[0] if instance.count("_") >= 2 else instance
        split[role] = split.get(role, 0.0) + times.user + times.system
    return split


def server_cpu_seconds(server) -> float:
    """User + system CPU seconds of tritonserver and its python backend stubs so far."""
    return sum(server_cpu_split(server).values())


def with_cpu(cell_fn, server=None) -> dict:
    """Run a cell and add texts per CPU-second: this process's CPU (callers / clients), plus the
    server's when there is one. On a shared host, wall-clock rates mostly measure how many threads
    each side has runnable (the OS shares CPU per thread); CPU cost per text does not."""
    own, split = time.process_time(), server_cpu_split(server) if server is not None else {}
    cell = cell_fn()
    own = time.process_time() - own
    after = server_cpu_split(server) if server is not None else {}
    if server is not None:
        cell["server_cpu_split"] = {role: round(after[role] - split.get(role, 0.0), 2) for role in after}
    theirs = sum(after.values()) - sum(split.values())
    cell.update(cpu_seconds=own + theirs, server_cpu_seconds=theirs, texts_per_cpu_s=cell["requests"] / (own + theirs))
    if server is not None:
        cell["texts_per_server_cpu_s"] = cell["requests"] / theirs
    return cell


def median_cell(cells: list[dict]) -> dict:
    """Median of each figure over the rounds, and every round's texts/s."""
    keys = [key for key in ("texts_per_s", "p50_ms", "p99_ms", "texts_per_cpu_s", "texts_per_server_cpu_s") if key in cells[0]]
    cell = {"clients": cells[0]["clients"], "rounds": [round(c["texts_per_s"], 1) for c in cells]}
    cell.update({key: float(np.median([c[key] for c in cells])) for key in keys})
    if "server_cpu_split" in cells[0]:  # CPU seconds per text, per server process role, summed over rounds
        texts = sum(c["requests"] for c in cells)
        roles = sorted({role for c in cells for role in c["server_cpu_split"]})
        cell["server_cpu_per_text"] = {role: round(sum(c["server_cpu_split"].get(role, 0.0) for c in cells) / texts, 4)
                                       for role in roles}
        cell["client_cpu_per_text"] = round(sum(c["cpu_seconds"] - c["server_cpu_seconds"] for c in cells) / texts, 4)
    else:
        cell["cpu_per_text"] = round(sum(c["cpu_seconds"] for c in cells) / sum(c["requests"] for c in cells), 4)
    return cell


def check_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """The server runs the very graph of the in-process embedder: float32, per-row cosine >= 0.99999
    and max abs <= 1e-5, or an error naming the request."""
    cosine = float(np.min(np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))))
    worst = float(np.abs(got - want).max())
    if got.dtype != np.float32 or cosine < 0.99999 or worst > 1e-5:
        raise AssertionError(f"{what}: {got.dtype}, cosine {cosine:.6f}, max abs {worst:.2e}")


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
                check_close(got, want[kind][pick : pick + 1], f"client {index} request {step}")
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


def client_counts(text: str) -> list[int]:
    try:
        counts = [int(item) for item in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"takes comma-separated positive integers, e.g. 1,8,32; got {text!r}")
    return counts


class OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str):  # one line on stderr, exit 2 (no usage block)
        self.exit(2, f"{self.prog}: error: {message}\n")


def main() -> None:
    parser = OneLineErrors(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, help="artifact directory (default: export stories260k kv-embedding)")
    parser.add_argument("--clients", type=client_counts, default="1,8,32")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each closed-loop cell")
    parser.add_argument("--rounds", type=int, default=3, help="alternating in-process / Triton rounds per client count")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads, in-process and per Triton model instance")
    parser.add_argument("--max-batch-tokens", type=int, help="python-backend model: padded tokens per batch (default: the runtime's per-call budget)")
    parser.add_argument("--provider", default="auto", help="python-backend model's runtime provider (auto, cpu, openvino)")
    parser.add_argument("--load-clients", type=int, default=32)
    parser.add_argument("--load-requests", type=int, default=200)
    parser.add_argument("--python", default=os.environ.get("KVEMBED_TRITON_PYTHON") or str(ROOT / ".venv-triton" / "bin" / "python"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    clients = args.clients
    try:  # before any export or server start: a wrong --artifact or --python fails at once, in one line
        if args.artifact is not None:
            read_manifest(args.artifact)
        find_tritonserver()
        stub_environment(args.python)
    except (OSError, ValueError, KvembedError) as err:
        parser.error(str(err))
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
                         "max_batch_tokens": args.max_batch_tokens, "provider": args.provider,
                         "cpus": os.cpu_count(), "in_process": [], "triton": []}
        began = time.perf_counter()
        embedder.encode(texts, batch_size=64)
        results["in_process_batched_texts_per_s"] = len(texts) / (time.perf_counter() - began)
        repository = write_repository(artifact, Path(tmp) / "repo", "bench", max_queue_delay_us=args.max_queue_delay_us,
                                      instances=args.instances, threads=args.threads, warmup=True,
                                      max_batch_tokens=args.max_batch_tokens, provider=args.provider)
        with open(Path(tmp) / "server.log", "w") as log, TritonServer(repository, python=args.python, log=log) as server:
            for count in clients:  # rounds alternate in-process and Triton: load drift hits both alike
                rounds: dict[str, list[dict]] = {"in_process": [], "triton": []}
                for _ in range(args.rounds):
                    rounds["in_process"].append(with_cpu(lambda: closed_loop(
                        count, args.seconds, lambda i, s: embedder.encode([texts[(i * 131 + s) % len(texts)]]))))
                    rounds["triton"].append(with_cpu(lambda: triton_cell(server, args, texts, count), server))
                for side, cells in rounds.items():
                    results[side].append(median_cell(cells))
                pairs = list(zip(rounds["triton"], rounds["in_process"]))
                results["triton"][-1]["ratio"] = float(np.median([t["texts_per_s"] / i["texts_per_s"] for t, i in pairs]))
                results["triton"][-1]["cpu_ratio"] = float(np.median([t["texts_per_cpu_s"] / i["texts_per_cpu_s"] for t, i in pairs]))
                print(json.dumps({"in_process": results["in_process"][-1], "triton": results["triton"][-1]}), flush=True)
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
    print("| clients | in-process texts/s | p50 / p99 ms | texts/CPU-s | Triton texts/s | p50 / p99 ms | texts/CPU-s "
          "(server only) | Triton / in-process: texts/s, texts/CPU-s |")
    print("|---|---|---|---|---|---|---|---|")
    for local, remote in zip(results["in_process"], results["triton"]):
        print(f"| {local['clients']} | {local['texts_per_s']:.0f} | {local['p50_ms']:.1f} / {local['p99_ms']:.1f} | "
              f"{local['texts_per_cpu_s']:.0f} | {remote['texts_per_s']:.0f} | {remote['p50_ms']:.1f} / {remote['p99_ms']:.1f} | "
              f"{remote['texts_per_cpu_s']:.0f} ({remote['texts_per_server_cpu_s']:.0f}) | {remote['ratio']:.2f}x, {remote['cpu_ratio']:.2f}x |")
    print(f"in-process batched ceiling (encode(512 texts, batch_size=64)): {results['in_process_batched_texts_per_s']:.0f} texts/s")
    batches = results.get("tokenize_batches") or {}
    if batches:
        rows = sum(int(size) * int(count) for size, count in batches.items())
        print(f"tokenizer executions: {sum(int(c) for c in batches.values())}, mean batch {rows / sum(int(c) for c in batches.values()):.1f} rows")
    load = results["load_test"]
    print(f"load test: {load['clients']} clients x {load['requests'] // load['clients']} requests: {load['errors']} errors, "
          f"{load['seconds']:.1f} s ({load['texts_per_s']:.0f} texts/s), healthy after: {load['healthy_after']}")


if __name__ == "__main__":
    main()
