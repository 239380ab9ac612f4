"""A short request's latency while one max-length input is being embedded (issue 29, item 3).

    python benchmarks/serve_long_input.py ARTIFACT [--server "LABEL:ARGS" ...] --out benchmarks/results/serve/long-input
    python benchmarks/serve_long_input.py ARTIFACT --lengths 128 512 1024 2048 --out DIR

Each server variant is its own ``kvembed serve`` process (default: the default settings), all up at
once. Per round and variant: ``idle`` sends one-word requests one at a time to a quiet server;
``loaded`` keeps one long request in flight (one input cut to the model's ``max_input_tokens``
with ``truncate: true``, as read from ``GET /v1/models``; sent again as soon as it returns) and
sends the same one-word requests, each after a random pause so they land at every phase of the
long call; ``long alone`` times the long request on a quiet server. Rounds interleave the
variants (the machine drifts); percentiles pool every round.

``--lengths``: instead, one server (``--max-input-tokens`` the largest) times one input of about
each length alone (what one input costs, hence the default cap), medians over ``--long-alone``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from kvembed.bench.served import ServerProcess  # noqa: E402  (the served subject's handle)

SHORT = "hello"


def parse_variant(value: str) -> tuple[str, list[str]]:
    """``LABEL:ARGS`` -> (label, extra ``kvembed serve`` arguments), e.g. ``one-lane:--long-input-tokens none``;
    leading ``NAME=VALUE`` words of ARGS are environment variables of that server."""
    label, sep, extra = value.partition(":")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"--server takes LABEL:ARGS, got {value!r}")
    return label, shlex.split(extra)


def split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        key, _, val = words[0].partition("=")
        env[key] = val
        words = words[1:]
    return env, words


def post(http: httpx.Client, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    response = http.post("/v1/embeddings", json=body)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed, response.json()


def shorts(http: httpx.Client, model: str, count: int, max_pause: float, rng: random.Random) -> list[float]:
    """``count`` one-word requests one at a time, each after a pause of up to ``max_pause`` s."""
    latencies = []
    for _ in range(count):
        time.sleep(rng.uniform(0, max_pause))
        latencies.append(post(http, {"model": model, "input": SHORT})[0])
    return latencies


class LongLoad:
    """A thread keeping one max-length request in flight until stopped; the durations of each."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.url, self.body = url, body
        self.durations: list[float] = []
        self.started = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=3600) as http:
            while not self._stop.is_set():
                self.started.set()
                self.durations.append(post(http, self.body)[0])

    def __enter__(self) -> "LongLoad":
        self._thread.start()
        self.started.wait()
        time.sleep(0.2)  # the first long request is tokenised and in its graph call
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def percentiles(values: list[float]) -> dict[str, float]:
    array = np.asarray(values) * 1000
    return {"n": len(values), "p50_ms": float(np.percentile(array, 50)), "p99_ms": float(np.percentile(array, 99)),
            "max_ms": float(array.max())}


def cpu_name() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return platform.processor()
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("Flags")), [])
    extras = [flag for flag in ("avx512f", "amx_tile", "avx2") if flag in flags]
    return f"{name} ({', '.join(extras) or 'no AVX2'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, help="artifact directory (served as 'model')")
    parser.add_argument("--server", type=parse_variant, action="append", help="LABEL:ARGS, repeatable (default: 'default:')")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--short", type=int, default=30, help="one-word requests per cell and round")
    parser.add_argument("--max-pause", type=float, default=0.3, help="longest random pause before a one-word request (s)")
    parser.add_argument("--long-alone", type=int, default=2, help="long requests timed alone per round")
    parser.add_argument("--lengths", type=int, nargs="+", help="time one input of each length (tokens) instead")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/serve/long-input"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.lengths:
        return lengths(args)
    variants = args.server or [("default", [])]
    rng = random.Random(0)
    servers: dict[str, ServerProcess] = {}
    cells: dict[str, dict[str, list[float]]] = {label: {"idle": [], "loaded": [], "long alone": [], "long loaded": []} for label, _ in variants}
    caps: dict[str, int] = {}
    loads = [os.getloadavg()[0]]
    try:
        for label, extra in variants:
            env, words = split_env(extra)
            servers[label] = ServerProcess([f"model={args.artifact}", *words], args.out / f"server-{label}.log", env=env)
        for label, server in servers.items():
            server.wait_healthy(600)
            card = httpx.get(f"{server.url}/v1/models").json()["data"][0]
            caps[label] = card["max_input_tokens"]
            with httpx.Client(base_url=server.url, timeout=3600) as http:  # warm-up, and the long input's real length
                shorts(http, "model", 3, 0, rng)
                _, body = post(http, long_body(caps[label]))
                assert body["usage"]["prompt_tokens"] == caps[label], body["usage"]
        for number in range(args.rounds):
            for label, server in servers.items():
                with httpx.Client(base_url=server.url, timeout=3600) as http:
                    cells[label]["idle"] += shorts(http, "model", args.short, args.max_pause, rng)
                    cells[label]["long alone"] += [post(http, long_body(caps[label]))[0] for _ in range(args.long_alone)]
                    with LongLoad(server.url, long_body(caps[label])) as load:
                        cells[label]["loaded"] += shorts(http, "model", args.short, args.max_pause, rng)
                    cells[label]["long loaded"] += load.durations
                loads.append(os.getloadavg()[0])
                print(f"round {number + 1}/{args.rounds} {label}: done (load average {loads[-1]:.1f})", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    summary = {label: {cell: percentiles(values) for cell, values in by_cell.items() if values} for label, by_cell in cells.items()}
    result = {"cpu": cpu_name(), "artifact": str(args.artifact), "variants": {label: extra for label, extra in variants},
              "max_input_tokens": caps, "load_average_1min": loads, "args": {k: str(v) for k, v in vars(args).items()}, "summary": summary, "raw": cells}
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    lines = [f"CPU: {result['cpu']}; 1-minute load average {min(loads):.1f}-{max(loads):.1f}", "",
             "| server | max_input_tokens | short idle p50 / p99 ms | short during a long input p50 / p99 ms | long alone p50 s | long, shorts beside it p50 s |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, by_cell in summary.items():
        def ms(cell: str) -> str:
            return f"{by_cell[cell]['p50_ms']:.0f} / {by_cell[cell]['p99_ms']:.0f}" if cell in by_cell else "-"

        def seconds(cell: str) -> str:
            return f"{by_cell[cell]['p50_ms'] / 1000:.2f}" if cell in by_cell else "-"

        lines.append(f"| {label} `{' '.join(dict(variants)[label])}` | {caps[label]} | {ms('idle')} | {ms('loaded')} "
                     f"| {seconds('long alone')} | {seconds('long loaded')} |")
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def lengths(args: argparse.Namespace) -> None:
    """Seconds for one input of about each of ``args.lengths`` tokens, alone on a quiet server."""
    server = ServerProcess([f"model={args.artifact}", "--max-input-tokens", str(max(args.lengths))], args.out / "server-lengths.log")
    rows = []
    try:
        server.wait_healthy(600)
        with httpx.Client(base_url=server.url, timeout=3600) as http:
            prompt = post(http, {"model": "model", "input": ""})[1]["usage"]["prompt_tokens"]
            for length in args.lengths:
                body = {"model": "model", "input": "word " * max(1, length - prompt), "truncate": True}
                times, tokens = [], 0
                for _ in range(max(1, args.long_alone)):
                    elapsed, answer = post(http, body)
                    times.append(elapsed)
                    tokens = answer["usage"]["prompt_tokens"]
                rows.append({"tokens": tokens, "seconds": float(np.median(times)), "all": times})
                print(f"{tokens} tokens: {rows[-1]['seconds']:.2f} s", flush=True)
    finally:
        server.stop()
    (args.out / "lengths.json").write_text(json.dumps({"cpu": cpu_name(), "artifact": str(args.artifact), "rows": rows}, indent=1))


def long_body(cap: int) -> dict[str, Any]:
    """One input of more than ``cap`` tokens (a word and a space are at least one token), cut to ``cap``."""
    return {"model": "model", "input": "word " * (2 * cap), "truncate": True}


if __name__ == "__main__":
    main()
