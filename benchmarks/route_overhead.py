"""``kvembed serve``'s dialects against each other: the same requests to OpenAI's
``/v1/embeddings``, TEI's ``/embed`` and Cohere's ``/v2/embed`` on one server process, at 1 and
N closed-loop clients; throughput, latency and each route's ratio to ``/v1/embeddings``.

    python benchmarks/route_overhead.py kv=ARTIFACT --out benchmarks/results/serve/route-overhead
    python benchmarks/route_overhead.py kv=ARTIFACT --requests 96 --latency-requests 32 --rounds 5

All three routes go through one embedding path (``kvembed.serve.embedding.embed_request``); they
differ in how they read the body and write the answer. So the question is what the dialects' own
code costs. One ``kvembed serve`` process serves the artifact (TEI's route answers with the first
artifact given, so it is the only one). One fixed list of requests (1 to ``--max-texts`` texts of
1 to ``--max-chars`` characters, seed 1, as ``serve_bench.py`` makes them): the N-client cells send
all of it, the 1-client cells its first ``--latency-requests``. Each cell is one route at one
client count: closed-loop async clients in this process share the list as a queue. Within a round
the three routes of a client count run back to back, their order rotated by round (the VM drifts,
and whichever runs first or last would otherwise carry the drift); each route/OpenAI ratio is taken
within its round, and the table shows medians over rounds with the ratios' range. Clients and
server share the machine's cores; the server process's own CPU seconds per cell are read from
``/proc`` (texts per server CPU-second: the route's cost without the clients').

On a shared VM a cell of one route can land in a slow stretch that the next route's cell misses, so
each round also runs two interleaved cells (``--no-interleaved`` leaves them out): at 1 client each
of the 1-client requests goes to every route back to back, the routes' order rotated by request
(each request's latency on a route over its latency on ``/v1/embeddings`` moments apart); at N
clients the first ``--mixed-requests`` requests, each to every route, share one queue (every
route's p50 / p95 from the same seconds, under the same load). Throughput per route needs a cell
of its own; latency ratios are best read from the interleaved cells.

Every answer is checked: the right number of vectors, each of the model's width, and each request's
vectors on every route against the same request's on ``/v1/embeddings`` in the same round and
client count (cosine; requests batched with different neighbours may differ in the last bits).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import numpy as np

from kvembed.bench.served import ServerProcess  # noqa: E402  (the served subject's handle)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import cpu, figure, write_record  # noqa: E402
from serve_bench import cpu_seconds, make_requests, percentile  # noqa: E402

from kvembed.serve.config import parse_artifact  # noqa: E402

#: route -> (path, request body of a model and its texts, the answer's vectors)
ROUTES: dict[str, tuple[str, Callable[[str, list[str]], dict[str, Any]], Callable[[Any], list[list[float]]]]] = {
    "openai": ("/v1/embeddings", lambda model, texts: {"model": model, "input": texts},
               lambda answer: [item["embedding"] for item in answer["data"]]),
    "tei": ("/embed", lambda model, texts: {"inputs": texts}, lambda answer: answer),
    "cohere": ("/v2/embed", lambda model, texts: {"model": model, "texts": texts},
               lambda answer: answer["embeddings"]["float"]),
}
BASE = "openai"


def lscpu() -> dict[str, str]:
    """lscpu's model name, family, model and stepping (the record's ``cpu`` has kvembed's own reading)."""
    import subprocess

    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    wanted = ("Model name", "CPU family", "Model", "Stepping", "Vendor ID", "Hypervisor vendor")
    return {key: fields[key].strip() for key in wanted if key in fields}


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


async def drive(url: str, route: str, model: str, requests: list[list[str]], clients: int) -> dict[str, Any]:
    """``clients`` closed-loop httpx clients send ``requests`` to ``route`` (a shared queue): each
    request's latency and answer, and the wall time of all."""
    result = await drive_jobs(url, model, [(index, route, texts) for index, texts in enumerate(requests)], clients)
    return {"wall": result["wall"], "latencies": result["latencies"][route], "answers": result["answers"][route],
            "errors": result["errors"]}


async def drive_jobs(url: str, model: str, jobs: list[tuple[int, str, list[str]]], clients: int) -> dict[str, Any]:
    """``clients`` closed-loop httpx clients work through ``jobs`` (request index, route, texts) in
    order: each route's latencies and answers (by request index), and the wall time of all."""
    queue = jobs[::-1]
    latencies: dict[str, list[float]] = {route: [] for route in ROUTES}
    by_index: dict[str, dict[int, float]] = {route: {} for route in ROUTES}
    answers: dict[str, dict[int, np.ndarray]] = {route: {} for route in ROUTES}
    errors: list[str] = []

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=clients)) as http:
        async def client() -> None:
            while queue:
                index, route, texts = queue.pop()
                path, body, vectors_of = ROUTES[route]
                start = time.perf_counter()
                response = await http.post(path, json=body(model, texts))
                answer = response.json()
                latencies[route].append(time.perf_counter() - start)
                by_index[route][index] = latencies[route][-1]
                if response.status_code != 200:
                    errors.append(f"{route} request {index}: {response.status_code} {str(answer)[:200]}")
                    continue
                answers[route][index] = np.asarray(vectors_of(answer), dtype=np.float32)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - start
    return {"wall": wall, "latencies": latencies, "by_index": by_index, "answers": answers, "errors": errors}


def interleaved(requests: list[list[str]], routes: list[str], shift: int) -> list[tuple[int, str, list[str]]]:
    """Each request to every route, back to back, the routes' order rotated by request (and by ``shift``)."""
    jobs = []
    for index, texts in enumerate(requests):
        turn = (index + shift) % len(routes)
        jobs += [(index, route, texts) for route in routes[turn:] + routes[:turn]]
    return jobs


def paired_cell(server: ServerProcess, model: str, jobs: list[tuple[int, str, list[str]]], clients: int) -> dict[str, Any]:
    """``jobs`` (every route's requests interleaved) from ``clients`` clients: per-route answers and
    latencies in one stretch of time, so drift lands on every route alike."""
    before = cpu_seconds(server.process.pid)
    result = asyncio.run(drive_jobs(server.url, model, jobs, clients))
    result["server_cpu"] = cpu_seconds(server.process.pid) - before
    result["load"] = load_average()
    return result


def cell(server: ServerProcess, route: str, model: str, requests: list[list[str]], clients: int) -> dict[str, Any]:
    """One route at one client count, with the server process's CPU seconds and the load average."""
    before = cpu_seconds(server.process.pid)
    result = asyncio.run(drive(server.url, route, model, requests, clients))
    result["server_cpu"] = cpu_seconds(server.process.pid) - before
    result["load"] = load_average()
    return result


def check(cells: dict[str, dict[str, Any]], requests: list[list[str]], dim: int | None) -> dict[str, Any]:
    """Each route's answers against the shapes asked and against /v1/embeddings' answers: the
    worst cosine per route, and every problem found."""
    problems: list[str] = []
    worst: dict[str, float] = {}
    for route, result in cells.items():
        problems += result["errors"]
        for index, texts in enumerate(requests):
            got = result["answers"].get(index)
            if got is None:
                if not result["errors"]:
                    problems.append(f"{route} request {index}: no answer")
                continue
            if got.ndim != 2 or got.shape[0] != len(texts) or (dim is not None and got.shape[1] != dim):
                problems.append(f"{route} request {index}: shape {got.shape}, asked {len(texts)} x {dim}")
                continue
            base = cells[BASE]["answers"].get(index)
            if route == BASE or base is None or base.shape != got.shape:
                continue
            cosine = np.sum(got * base, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(base, axis=1))
            worst[route] = min(worst.get(route, 1.0), float(cosine.min()))
    return {"problems": problems, "worst_cosine": worst}


def summarise(rounds: list[dict[str, dict[str, dict[str, Any]]]], counts: dict[str, int]) -> list[dict[str, Any]]:
    """Per client count and route: medians over rounds, and the ratios to /v1/embeddings taken
    within each round (median, min, max)."""
    rows = []
    for clients in rounds[0]:
        texts = counts[clients]
        for route in ROUTES:
            per = [r[clients][route] for r in rounds]
            base = [r[clients][BASE] for r in rounds]
            tput = [texts / c["wall"] for c in per]
            p50 = [percentile(c["latencies"], 50) * 1000 for c in per]
            p95 = [percentile(c["latencies"], 95) * 1000 for c in per]
            per_cpu = [texts / c["server_cpu"] for c in per]
            ratios = {
                "throughput": [(texts / c["wall"]) / (texts / b["wall"]) for c, b in zip(per, base)],
                "p50": [percentile(c["latencies"], 50) / percentile(b["latencies"], 50) for c, b in zip(per, base)],
                "p95": [percentile(c["latencies"], 95) / percentile(b["latencies"], 95) for c, b in zip(per, base)],
                "texts_per_server_cpu_s": [(texts / c["server_cpu"]) / (texts / b["server_cpu"]) for c, b in zip(per, base)],
            }
            rows.append({
                "clients": clients, "route": route, "path": ROUTES[route][0],
                "texts_per_s": statistics.median(tput), "p50_ms": statistics.median(p50), "p95_ms": statistics.median(p95),
                "texts_per_server_cpu_s": statistics.median(per_cpu),
                "vs_openai": {name: {"median": statistics.median(v), "min": min(v), "max": max(v), "rounds": v}
                              for name, v in ratios.items()},
            })
    return rows


def summarise_paired(paired: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The interleaved cells: at 1 client each request's latency on a route over its latency on
    /v1/embeddings sent just before or after it (median over every request of every round); at N
    clients each route's p50 / p95 over /v1/embeddings' in the same cell (median over rounds)."""
    rows = []
    for kind in paired[0]:
        cells = [p[kind] for p in paired]
        for route in ROUTES:
            row: dict[str, Any] = {"cell": kind, "route": route, "path": ROUTES[route][0],
                                   "p50_ms": statistics.median(percentile(c["latencies"][route], 50) * 1000 for c in cells),
                                   "p95_ms": statistics.median(percentile(c["latencies"][route], 95) * 1000 for c in cells)}
            p50 = [percentile(c["latencies"][route], 50) / percentile(c["latencies"][BASE], 50) for c in cells]
            p95 = [percentile(c["latencies"][route], 95) / percentile(c["latencies"][BASE], 95) for c in cells]
            row["p50_vs_openai"] = {"median": statistics.median(p50), "min": min(p50), "max": max(p50), "rounds": p50}
            row["p95_vs_openai"] = {"median": statistics.median(p95), "min": min(p95), "max": max(p95), "rounds": p95}
            if kind.startswith("1 "):
                each = [c["by_index"][route][i] / c["by_index"][BASE][i] for c in cells for i in c["by_index"][BASE]
                        if i in c["by_index"][route]]
                row["per_request_vs_openai"] = {"median": statistics.median(each), "p10": percentile(each, 10),
                                                "p90": percentile(each, 90), "n": len(each)}
            rows.append(row)
    return rows


def paired_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| cell | route | p50 ms | p95 ms | p50 vs OpenAI (range) | p95 vs OpenAI (range) | per request vs OpenAI: median (p10-p90, n) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        a, b = row["p50_vs_openai"], row["p95_vs_openai"]
        each = row.get("per_request_vs_openai")
        per = f"{each['median']:.3f}x ({each['p10']:.3f}-{each['p90']:.3f}, {each['n']})" if each else ""
        lines.append(f"| {row['cell']} | `{row['path']}` | {row['p50_ms']:.1f} | {row['p95_ms']:.1f} | "
                     f"{a['median']:.3f}x ({a['min']:.3f}-{a['max']:.3f}) | {b['median']:.3f}x ({b['min']:.3f}-{b['max']:.3f}) | {per} |")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]], checks: dict[str, Any]) -> str:
    lines = ["| clients | route | texts/s | p50 ms | p95 ms | texts per server CPU-s | throughput vs OpenAI (range) "
             "| p50 vs OpenAI (range) | p95 vs OpenAI (range) | server CPU-s per text vs OpenAI |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def ratio(row: dict[str, Any], name: str, invert: bool = False) -> str:
        r = row["vs_openai"][name]
        if invert:  # CPU seconds per text: the inverse of texts per CPU-second
            return f"{1 / r['median']:.3f}x ({1 / r['max']:.3f}-{1 / r['min']:.3f})"
        return f"{r['median']:.3f}x ({r['min']:.3f}-{r['max']:.3f})"

    for row in rows:
        lines.append(
            f"| {row['clients']} | `{row['path']}` | {row['texts_per_s']:.1f} | {row['p50_ms']:.1f} | {row['p95_ms']:.1f} | "
            f"{row['texts_per_server_cpu_s']:.1f} | {ratio(row, 'throughput')} | {ratio(row, 'p50')} | {ratio(row, 'p95')} | "
            f"{ratio(row, 'texts_per_server_cpu_s', invert=True)} |")
    worst = ", ".join(f"{route} {value:.6f}" for route, value in checks["worst_cosine"].items())
    lines.append(f"\nWorst cosine to /v1/embeddings' answer of the same request (same round and client count): {worst}; "
                 f"problems: {len(checks['problems'])}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", help="DIR (named after its folder) or NAME=DIR")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serve/route-overhead"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=96, help="requests of the N-client cells")
    parser.add_argument("--latency-requests", type=int, default=16, help="requests of the 1-client cells (the list's first)")
    parser.add_argument("--mixed-requests", type=int, default=32,
                        help="requests of the interleaved N-client cell (the list's first), each sent to every route")
    parser.add_argument("--no-interleaved", action="store_true", help="only the one-route-per-cell cells")
    parser.add_argument("--clients", type=int, default=64, help="N, the concurrent clients of the loaded cells")
    parser.add_argument("--max-texts", type=int, default=8)
    parser.add_argument("--max-chars", type=int, default=128)
    parser.add_argument("--server-args", type=shlex.split, default=[], help="extra kvembed serve arguments, one string")
    args = parser.parse_args()
    try:
        name, directory = parse_artifact(args.artifact)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    requests = make_requests(args.requests, args.max_texts, args.max_chars, seed=1)
    sets = {1: requests[: args.latency_requests], args.clients: requests}
    counts = {clients: sum(map(len, s)) for clients, s in sets.items()}
    dim = json.loads((Path(directory) / "kvembed.json").read_text()).get("dim") if (Path(directory) / "kvembed.json").exists() else None
    routes = list(ROUTES)
    rounds: list[dict[str, dict[str, dict[str, Any]]]] = []
    paired: list[dict[str, dict[str, Any]]] = []
    checks: list[dict[str, Any]] = []
    started = time.perf_counter()
    server = ServerProcess([f"{name}={directory}", *args.server_args], args.out / "server.log")
    try:
        server.wait_healthy(timeout=300)
        for route in routes:  # warm-up: every route, both client counts
            cell(server, route, name, requests[:8], 1)
            cell(server, route, name, requests[:32], 8)
        for number in range(args.rounds):
            order = routes[number % len(routes):] + routes[: number % len(routes)]
            this: dict[str, dict[str, dict[str, Any]]] = {}
            for clients, subset in sets.items():
                this[clients] = {route: cell(server, route, name, subset, clients) for route in order}
                found = check(this[clients], subset, dim)
                checks.append({"round": number, "clients": clients, **found})
                walls = ", ".join(f"{route} {this[clients][route]['wall']:.1f} s" for route in order)
                print(f"round {number + 1}/{args.rounds}, {clients} client(s): {walls}; load {load_average():.2f}; "
                      f"worst cosine {found['worst_cosine']}; problems {len(found['problems'])}", flush=True)
            rounds.append(this)
            if args.no_interleaved:
                continue
            mixed = {"1 client, interleaved per request": paired_cell(server, name, interleaved(sets[1], routes, number), 1),
                     f"{args.clients} clients, interleaved": paired_cell(
                         server, name, interleaved(requests[: args.mixed_requests], routes, number), args.clients)}
            for kind, result in mixed.items():
                views = {route: {"answers": result["answers"][route], "errors": result["errors"] if route == BASE else []}
                         for route in routes}
                subset = sets[1] if kind.startswith("1 ") else requests[: args.mixed_requests]
                found = check(views, subset, dim)
                checks.append({"round": number, "clients": kind, **found})
                print(f"round {number + 1}/{args.rounds}, {kind}: {result['wall']:.1f} s; load {result['load']:.2f}; "
                      f"worst cosine {found['worst_cosine']}; problems {len(found['problems'])}", flush=True)
            paired.append(mixed)
    finally:
        server.stop()
    elapsed = time.perf_counter() - started
    rows = summarise(rounds, counts)
    worst: dict[str, float] = {}
    for found in checks:
        for route, value in found["worst_cosine"].items():
            worst[route] = min(worst.get(route, 1.0), value)
    problems = [p for found in checks for p in found["problems"]]
    summary = {"worst_cosine": worst, "problems": problems}
    table = markdown(rows, summary)
    paired_rows = summarise_paired(paired) if paired else []
    if paired_rows:
        table += "\n\nInterleaved cells (every request to every route, back to back, order rotating):\n\n" + paired_markdown(paired_rows)
    loads = [c["load"] for r in rounds for by_route in r.values() for c in by_route.values()]
    result = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "artifact": str(directory), "name": name, "lscpu": lscpu(), "cpu": cpu(),
        "requests": {str(c): len(s) for c, s in sets.items()}, "texts": {str(c): n for c, n in counts.items()},
        "load_average": {"min": min(loads), "max": max(loads)}, "elapsed_s": elapsed,
        "rows": rows, "interleaved_rows": paired_rows, "checks": checks, "worst_cosine": worst, "problems": problems[:50],
        "rounds": [{str(c): {route: {k: v for k, v in res.items() if k != "answers"} for route, res in by_route.items()}
                    for c, by_route in r.items()} for r in rounds],
        "interleaved_rounds": [{kind: {k: v for k, v in res.items() if k != "answers"} for kind, res in p.items()} for p in paired],
    }
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    (args.out / "results.md").write_text(table + "\n")
    print(table)
    print(f"lscpu: {result['lscpu']}; load average {min(loads):.2f}-{max(loads):.2f}; {elapsed:.0f} s")
    figures = {}
    for row in rows:
        if row["route"] == BASE:
            continue
        for name_, key in (("throughput", "throughput"), ("p50", "p50"), ("p95", "p95")):
            figures[f"{row['path']} {name_} vs /v1/embeddings, {row['clients']} client(s)"] = figure(row["vs_openai"][key]["median"], "x")
    for row in paired_rows:
        if row["route"] == BASE:
            continue
        figures[f"{row['path']} p50 vs /v1/embeddings, {row['cell']}"] = figure(row["p50_vs_openai"]["median"], "x")
        figures[f"{row['path']} p95 vs /v1/embeddings, {row['cell']}"] = figure(row["p95_vs_openai"]["median"], "x")
        if "per_request_vs_openai" in row:
            figures[f"{row['path']} latency per request vs /v1/embeddings, {row['cell']}"] = figure(
                row["per_request_vs_openai"]["median"], "x")
    for route, value in worst.items():
        figures[f"{ROUTES[route][0]} worst cosine to /v1/embeddings"] = figure(value, "cosine")
    figures["problems"] = figure(len(problems), "answers")
    write_record("route_overhead", figures, output=str(args.out), lscpu=result["lscpu"],
                 load_average=result["load_average"])
    if problems:
        print(f"{len(problems)} problem(s), first: {problems[:5]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
