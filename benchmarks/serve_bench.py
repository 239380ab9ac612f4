"""``kvembed serve`` vs in-process ``Embedder.encode``: throughput and latency at 1, 8, 64 clients,
and the issue's load run (64 clients x 500 requests, every row checked).

    python benchmarks/serve_bench.py kv=ARTIFACT [NAME=DIR ...] --out benchmarks/results/serve
    python benchmarks/serve_bench.py va=ARTIFACT --load --out benchmarks/results/serve
    python benchmarks/serve_bench.py kv=ARTIFACT --padding --out benchmarks/results/serve

Throughput/latency: one fixed list of requests (mixed sizes) per artifact. In-process throughput is
``Embedder.encode`` of all their texts at once (batch 64, 16384 tokens: the runtime's best case);
in-process latency is ``encode`` of each request alone. The server (a ``kvembed serve`` process)
gets the same requests from N closed-loop httpx clients in this process. The in-process and server
cells are interleaved round by round (the VM drifts) and each ratio is taken within a round; the
table shows medians over rounds. Clients and server share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from kvembed.bench.served import ServerProcess, metric, metrics  # noqa: E402  (the served subject's handle)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import figure, write_record  # noqa: E402

from kvembed.runtime import Embedder  # noqa: E402
from kvembed.runtime.batching import plan_batches  # noqa: E402
from kvembed.serve.config import parse_artifact  # noqa: E402

WORDS = "the a cat dog sat ran on in park mat blue sky why is was happy over under".split()


def random_text(rng: random.Random, lo: int, hi: int) -> str:
    target, words = rng.randint(lo, hi), []
    while len(" ".join(words)) < target:
        words.append(rng.choice(WORDS))
    return " ".join(words)[:target]


def make_requests(count: int, max_texts: int, max_chars: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    return [[random_text(rng, 1, max_chars) for _ in range(rng.randint(1, max_texts))] for _ in range(count)]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


async def drive(url: str, model: str, requests: list[list[str]], clients: int, fmt: str = "float",
                client: str = "aiohttp") -> dict[str, Any]:
    """``clients`` closed-loop clients send ``requests`` (shared queue); latency of each, wall time of all.

    ``client`` is the HTTP library: aiohttp (the default: it costs the shared cores least, ~0.1 ms
    of CPU per request) or httpx's AsyncClient (what the ``openai`` client's async API is built on;
    ~8x aiohttp's CPU per request here, taken from the server's cores)."""
    queue = list(enumerate(requests))[::-1]
    latencies: list[float] = []

    async def post(send: Any) -> None:
        while queue:
            _, texts = queue.pop()
            start = time.perf_counter()
            await send({"model": model, "input": texts, "encoding_format": fmt})
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    if client == "aiohttp":
        import aiohttp

        async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=clients),
                                         timeout=aiohttp.ClientTimeout(total=600)) as session:
            async def send(body: dict[str, Any]) -> None:
                async with session.post("/v1/embeddings", json=body) as response:
                    response.raise_for_status()
                    await response.json()

            start = time.perf_counter()
            await asyncio.gather(*(post(send) for _ in range(clients)))
            wall = time.perf_counter() - start
    elif client == "httpx":
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=clients)) as http:
            async def send(body: dict[str, Any]) -> None:
                (await http.post("/v1/embeddings", json=body)).raise_for_status().json()

            start = time.perf_counter()
            await asyncio.gather(*(post(send) for _ in range(clients)))
            wall = time.perf_counter() - start
    else:
        raise ValueError(f"client must be aiohttp or httpx, got {client!r}")
    return {"wall": wall, "latencies": latencies}


def in_process(embedder: Embedder, requests: list[list[str]], latency_requests: int) -> dict[str, Any]:
    texts = [text for request in requests for text in request]
    start, cpu = time.perf_counter(), time.process_time()
    embedder.encode(texts, batch_size=64, max_batch_tokens=16384)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    latencies = []
    for request in requests[:latency_requests]:
        start = time.perf_counter()
        embedder.encode(request, batch_size=64, max_batch_tokens=16384)
        latencies.append(time.perf_counter() - start)
    return {"wall": wall, "latencies": latencies, "cpu": cpu}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (and its threads) so far."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def served(pid: int, cell: Any) -> dict[str, Any]:
    """Run a server cell and add the server process's CPU seconds (clients excluded)."""
    before = cpu_seconds(pid)
    result = asyncio.run(cell)
    result["cpu"] = cpu_seconds(pid) - before
    return result


def paired_overhead(url: str, model: str, embedder: Embedder, requests: list[list[str]]) -> dict[str, list[float]]:
    """Server latency minus in-process latency of the same request, measured back to back per
    request (one request at a time, kept-alive connections), so machine drift cancels out. Two
    clients: the standard library's ``http.client`` (the least client-side work: the server's own
    overhead plus the TCP round trip) and a synchronous ``httpx.Client`` (what the ``openai``
    client is built on)."""
    host, port = httpx.URL(url).host, httpx.URL(url).port
    connection = http.client.HTTPConnection(host, port, timeout=600)
    differences: dict[str, list[float]] = {"http.client": [], "httpx": []}
    with httpx.Client(base_url=url, timeout=600) as client:
        for texts in requests:
            body = json.dumps({"model": model, "input": texts})
            start = time.perf_counter()
            embedder.encode(texts, batch_size=64, max_batch_tokens=16384)
            local = time.perf_counter() - start
            start = time.perf_counter()
            connection.request("POST", "/v1/embeddings", body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200, response.status
            json.loads(response.read())
            differences["http.client"].append(time.perf_counter() - start - local)
            start = time.perf_counter()
            client.post("/v1/embeddings", content=body, headers={"Content-Type": "application/json"}).raise_for_status().json()
            differences["httpx"].append(time.perf_counter() - start - local)
    connection.close()
    return differences


def parse_variant(value: str) -> tuple[str, list[str]]:
    """``LABEL:ARGS`` -> (label, extra ``kvembed serve`` arguments), e.g. ``w2:--workers 2``."""
    label, sep, extra = value.partition(":")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"--server takes LABEL:ARGS (e.g. 'w2:--workers 2'), got {value!r}")
    return label, shlex.split(extra)


def bench_artifact(name: str, directory: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """In-process cells and, for each server variant (its own ``kvembed serve`` process, all up at
    once), the 1-client and N-client cells, interleaved round by round."""
    embedder = Embedder.load(directory, provider="cpu")
    requests = make_requests(args.requests, args.max_texts, args.max_chars, seed=1)
    texts = sum(map(len, requests))
    tokens = sum(len(embedder.encoder.encode_one(t).ids) for request in requests for t in request)
    latency_set = requests[: args.latency_requests]
    variants = args.server or [("serve", [])]
    servers: dict[str, ServerProcess] = {}
    rounds: list[dict[str, Any]] = []
    try:
        for label, extra in variants:
            servers[label] = ServerProcess([f"{name}={directory}", "--provider", "cpu", *extra], out / f"server-{name}-{label}.log")
        for server in servers.values():
            server.wait_healthy()
            asyncio.run(drive(server.url, name, requests[:16], 4, client=args.client))  # warm-up
        in_process(embedder, requests[:16], 4)
        for _ in range(args.rounds):
            cells: dict[str, Any] = {"in-process": in_process(embedder, requests, args.latency_requests)}
            for label, server in servers.items():
                tag = "" if len(servers) == 1 else f" [{label}]"
                cells[f"1 client{tag}"] = served(server.process.pid, drive(server.url, name, latency_set, 1, client=args.client))
                cells[f"1 client{tag}"]["paired"] = paired_overhead(server.url, name, embedder, latency_set)
                for clients in args.clients:
                    cells[f"{clients} clients{tag}"] = served(server.process.pid, drive(server.url, name, requests, clients, client=args.client))
            rounds.append(cells)
    finally:
        for server in servers.values():
            server.stop()
    latency_texts = sum(map(len, latency_set))
    latency_tokens = sum(len(embedder.encoder.encode_one(t).ids) for request in latency_set for t in request)
    rows = []
    for cell in rounds[0]:
        n_texts, n_tokens = (latency_texts, latency_tokens) if cell.startswith("1 client") else (texts, tokens)
        walls = [r[cell]["wall"] for r in rounds]
        p50 = [percentile(r[cell]["latencies"], 50) * 1000 for r in rounds]
        p99 = [percentile(r[cell]["latencies"], 99) * 1000 for r in rounds]
        ratio = [
            (n_texts / r[cell]["wall"]) / (texts / r["in-process"]["wall"]) for r in rounds
        ]
        overhead = [
            (percentile(r[cell]["latencies"], 50) - percentile(r["in-process"]["latencies"], 50)) * 1000 for r in rounds
        ]
        rows.append({
            "cell": cell, "texts_per_s": statistics.median(n_texts / w for w in walls),
            "tokens_per_s": statistics.median(n_tokens / w for w in walls),
            "p50_ms": statistics.median(p50), "p99_ms": statistics.median(p99),
            "throughput_vs_in_process": statistics.median(ratio), "p50_overhead_ms": statistics.median(overhead),
            "texts_per_cpu_s": statistics.median(n_texts / r[cell]["cpu"] for r in rounds),
            "cpu_efficiency_vs_in_process": statistics.median(
                (n_texts / r[cell]["cpu"]) / (texts / r["in-process"]["cpu"]) for r in rounds),
        })
        if "paired" in rounds[0][cell]:
            rows[-1]["paired_overhead_ms"] = {}
            for client in rounds[0][cell]["paired"]:
                paired = [d * 1000 for r in rounds for d in r[cell]["paired"][client]]
                rows[-1]["paired_overhead_ms"][client] = {
                    "p50": percentile(paired, 50), "p10": percentile(paired, 10), "p90": percentile(paired, 90), "n": len(paired)}
    precision = embedder.manifest.get("precision")
    return {"name": name, "artifact": str(directory), "method": embedder.method.name, "precision": precision,
            "servers": {label: extra for label, extra in variants}, "client": args.client,
            "requests": len(requests), "texts": texts, "tokens": tokens, "rounds": args.rounds, "rows": rows}


def padding(name: str, directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Padded / real tokens of the throughput workload's texts (in request order) planned as the
    server's batcher plans them: windows of W batches' worth of inputs and tokens, each packed by
    ``plan_batches`` (batch 64, 16384 tokens); W = 1, 2, 4, 8, and all texts at once."""
    embedder = Embedder.load(directory, provider="cpu")
    requests = make_requests(args.requests, args.max_texts, args.max_chars, seed=1)
    lengths = [len(embedder.encoder.encode_one(t).ids) for request in requests for t in request]

    def padded(window: list[int]) -> int:
        return sum(len(batch) * max(window[i] for i in batch) for batch in plan_batches(window, 64, 16384))

    ratios = {}
    for batches in (1, 2, 4, 8):
        windows, window = [], []
        for length in lengths:
            if window and (len(window) >= 64 * batches or sum(window) + length > 16384 * batches):
                windows.append(window)
                window = []
            window.append(length)
        windows.append(window)
        ratios[f"{batches}-batch windows"] = sum(map(padded, windows)) / sum(lengths)
    ratios["all at once"] = padded(lengths) / sum(lengths)
    return {"name": name, "method": embedder.method.name, "requests": len(requests), "texts": len(lengths),
            "tokens": sum(lengths), "padded_over_real": ratios}


def load_run(name: str, directory: Path, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The issue's load test: 64 clients x 500 requests; every row checked against Embedder.encode."""
    embedder = Embedder.load(directory, provider="cpu")
    rng = random.Random(5)
    pools = [[random_text(rng, 1, args.max_chars) for _ in range(32)] for _ in range(64)]  # disjoint per client
    oracle = [dict(zip(pool, embedder.encode(pool))) for pool in pools]
    plans = [[[rng.choice(pool) for _ in range(rng.randint(1, args.max_texts))] for _ in range(args.load_requests)] for pool in pools]
    server = ServerProcess([f"{name}={directory}", "--provider", "cpu"], out / f"load-{name}.log").wait_healthy()
    bad: list[str] = []
    try:
        asyncio.run(drive(server.url, name, pools[0:4], 4))
        rss_warm = server.rss_kib()
        before = metrics(server.url)

        async def client(index: int, http: httpx.AsyncClient) -> None:
            for number, texts in enumerate(plans[index]):
                try:
                    response = await http.post("/v1/embeddings", json={"model": name, "input": texts})
                except httpx.TransportError as err:
                    bad.append(f"client {index} request {number}: {type(err).__name__}")
                    continue
                data = response.json().get("data", []) if response.status_code == 200 else []
                got = np.asarray([item["embedding"] for item in data], dtype=np.float32)
                want = np.stack([oracle[index][t] for t in texts])
                if [item.get("index") for item in data] != list(range(len(texts))) or got.shape != want.shape or not np.allclose(got, want, atol=1e-5):
                    bad.append(f"client {index} request {number}: status {response.status_code}")

        async def run() -> float:
            async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=httpx.Limits(max_connections=64)) as http:
                start = time.perf_counter()
                await asyncio.gather(*(client(i, http) for i in range(64)))
                return time.perf_counter() - start

        wall = asyncio.run(run())
        after = metrics(server.url)
        rss_after = server.rss_kib()
    finally:
        server.stop()
    sent = [texts for plan in plans for texts in plan]
    tokens = sum(len(embedder.encoder.encode_one(t).ids) for texts in sent for t in texts)
    delta = {key: metric(after, key, model=name) - metric(before, key, model=name)
             for key in ("kvembed_requests_total", "kvembed_texts_total", "kvembed_tokens_total", "kvembed_batch_size_count")}
    return {
        "name": name, "clients": 64, "requests_per_client": args.load_requests, "max_texts": args.max_texts,
        "max_chars": args.max_chars, "requests": len(sent), "texts": sum(map(len, sent)), "tokens": tokens,
        "wrong_or_lost": len(bad), "first_bad": bad[:5], "wall_s": wall, "texts_per_s": sum(map(len, sent)) / wall,
        "metrics_delta": delta,
        "metrics_match": delta["kvembed_requests_total"] == len(sent) and delta["kvembed_texts_total"] == sum(map(len, sent))
        and delta["kvembed_tokens_total"] == tokens,
        "rss_warm_kib": rss_warm, "rss_after_kib": rss_after, "rss_ratio": rss_after / rss_warm,
    }


def markdown(results: list[dict[str, Any]]) -> str:
    lines = ["| artifact | cell | texts/s | tokens/s | p50 ms | p99 ms | throughput vs in-process | p50 overhead ms "
             "| texts per CPU-s (server only) | vs in-process |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for result in results:
        label = f"{result['name']} ({result['method']}, {result['precision']})"
        for row in result["rows"]:
            lines.append(
                f"| {label} | {row['cell']} | {row['texts_per_s']:.0f} | {row['tokens_per_s']:.0f} | {row['p50_ms']:.1f} | "
                f"{row['p99_ms']:.1f} | {row['throughput_vs_in_process']:.2f}x | {row['p50_overhead_ms']:+.1f} | "
                f"{row['texts_per_cpu_s']:.0f} | {row['cpu_efficiency_vs_in_process']:.2f}x |"
            )
    for result in results:
        for row in result["rows"]:
            for client, p in row.get("paired_overhead_ms", {}).items():
                lines.append(f"\n{result['name']} {row['cell']}: overhead with {client}, paired per request (server minus in-process, "
                             f"back to back, n={p['n']}): p50 {p['p50']:+.2f} ms (p10 {p['p10']:+.2f}, p90 {p['p90']:+.2f})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", nargs="+", help="DIR (named after its folder) or NAME=DIR")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serve"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=128, help="requests per throughput cell")
    parser.add_argument("--latency-requests", type=int, default=48, help="requests of the 1-client / in-process latency cells")
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--server", type=parse_variant, action="append",
                        help="a server variant LABEL:ARGS (extra kvembed serve arguments), repeatable; each runs in its own process")
    parser.add_argument("--client", choices=("aiohttp", "httpx"), default="aiohttp", help="HTTP library of the N-client cells")
    parser.add_argument("--max-texts", type=int, default=8)
    parser.add_argument("--max-chars", type=int, default=128)
    parser.add_argument("--load", action="store_true", help="run the 64-client load test instead")
    parser.add_argument("--load-requests", type=int, default=500)
    parser.add_argument("--padding", action="store_true", help="only print the padded/real token ratios of the batcher's windows (no server)")
    args = parser.parse_args()
    try:  # kvembed serve's own reading of DIR / NAME=DIR (the directory must hold a manifest)
        pairs = [parse_artifact(a) for a in args.artifacts]
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.padding:
        result = [padding(name, directory, args) for name, directory in pairs]
        (args.out / "padding.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
        return
    if args.load:
        result = load_run(*pairs[0], args, args.out)
        (args.out / f"load-{pairs[0][0]}.json").write_text(json.dumps(result, indent=2))
        print(json.dumps(result, indent=2))
        return
    results = [bench_artifact(name, directory, args, args.out) for name, directory in pairs]
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "artifacts", "load", "padding")}
    (args.out / "results.json").write_text(json.dumps({"settings": settings, "results": results}, indent=2, default=str))
    table = markdown(results)
    (args.out / "results.md").write_text(table + "\n")
    print(table)
    figures = {}
    for result in results:
        for row in result["rows"]:
            figures[f"{result['name']} {row['cell']} throughput vs in-process"] = figure(row["throughput_vs_in_process"], "x")
            for client, p in row.get("paired_overhead_ms", {}).items():
                figures[f"{result['name']} {row['cell']} paired overhead p50 ({client})"] = figure(p["p50"], "ms")
    write_record("serve_bench", figures, output=str(args.out))


if __name__ == "__main__":
    main()
