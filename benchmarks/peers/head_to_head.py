"""kvembed serve against llama.cpp's llama-server on the same weights, the way users compare them:
both servers up at once, the official ``openai`` client, the same texts, measured interleaved.

    python benchmarks/peers/head_to_head.py --reference WORK/smollm2-last \\
        --kvembed fp32=WORK/smollm2-last --kvembed bf16=WORK/smollm2-last-bf16 \\
        --llama-server WORK/build-avx512/bin/llama-server \\
        --gguf f16=WORK/models/smollm2-135m-f16.gguf --gguf q8_0=WORK/models/smollm2-135m-q8_0.gguf \\
        --pooling last --rounds 5 --out benchmarks/results/peers

Workloads (one request unless said): ``16x128`` sixteen texts of 128 tokens; ``1x32`` one text of
32 tokens; ``32clients`` 32 concurrent clients (``--clients``) each sending one-text requests of
16-64 tokens.
Every round runs every server on every workload in a shuffled order (the machine drifts), each
kvembed/llama ratio is taken within a round, and the record holds the medians over rounds.
``--search`` first tries each GGUF at a few ``-np`` / ``-ub`` settings (one round, the two
throughput workloads) and keeps each GGUF's fastest for the interleaved run: llama.cpp at its
best, not at its defaults. Fidelity is each server's worst cosine against ``--reference`` (a
kvembed artifact run in-process on onnxruntime's CPU provider, which computes in fp32: an fp32
artifact, or for a checkpoint too big for two fp32 copies an fp16 one, whose weights are a bf16
checkpoint's own) on every text the benchmark sent; it runs and is freed before any server starts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
from llama_server import LlamaServer, SMOKE_TEXTS, build_facts, cosine_rows  # noqa: E402
from record import figure, write_record  # noqa: E402
from kvembed.bench.served import ServerProcess  # noqa: E402

#: llama-server settings tried by --search: (-np slots, -ub micro-batch tokens)
SEARCH = ((1, 512), (4, 2048), (16, 2048))
#: the fidelity below which a llama.cpp configuration does not count as a peer (the issue's bar)
FAITHFUL = 0.99


@dataclass
class Workloads:
    """The benchmark's texts, cut to exact token counts with the model's own tokenizer."""

    long16: list[str]
    short1: list[str]
    clients: list[str]

    def all_texts(self) -> list[str]:
        return self.long16 + self.short1 + self.clients


def make_workloads(tokenizer_file: Path, seed: int = 0, client_texts: int = 64) -> Workloads:
    """Plain English cut to token counts (the tokenizer decodes its own prefix back to text)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    rng = random.Random(seed)
    sentences = list(SMOKE_TEXTS)

    def text_of(tokens: int) -> str:
        words: list[str] = []
        while len(tok.encode(" ".join(words), add_special_tokens=False).ids) < tokens + 4:
            words.append(rng.choice(sentences))
        ids = tok.encode(" ".join(words), add_special_tokens=False).ids[:tokens]
        return tok.decode(ids).strip()

    return Workloads(long16=[text_of(128) for _ in range(16)], short1=[text_of(32)],
                     clients=[text_of(rng.randint(16, 64)) for _ in range(client_texts)])


@dataclass
class Peer:
    """One server under test: its OpenAI base URL and how to stop it."""

    name: str
    kind: str  # "kvembed" or "llama.cpp"
    base_url: str
    model: str
    stop: Callable[[], Any]
    command: list[str] = field(default_factory=list)
    tokenize: Callable[[str], list[int]] | None = None  # llama-server's /tokenize: the ids it feeds the model

    def client(self) -> Any:
        from openai import OpenAI

        return OpenAI(base_url=f"{self.base_url}/v1", api_key="sk-none", max_retries=0, timeout=600.0)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        response = self.client().embeddings.create(model=self.model, input=list(texts), encoding_format="float")
        return np.asarray([row.embedding for row in sorted(response.data, key=lambda r: r.index)], dtype=np.float32)


def start_kvembed(name: str, artifact: Path, log_dir: Path, extra_args: Sequence[str] = ()) -> Peer:
    args = [f"{name}={artifact}", *extra_args]
    server = ServerProcess(args, log_dir / f"kvembed-{name}.log").wait_healthy(1800)  # a 4B model compiles for minutes on OpenVINO
    return Peer(name, "kvembed", server.url, name, server.stop, ["kvembed", "serve", *args])


def start_llama(name: str, binary: Path, gguf: Path, pooling: str, threads: int, parallel: int, ubatch: int,
                log_dir: Path, extra_args: Sequence[str] = ()) -> Peer:
    server = LlamaServer(binary, gguf, pooling=pooling, threads=threads, parallel=parallel, ubatch=ubatch,
                         extra_args=tuple(extra_args), log_path=log_dir / f"llama-{name}-np{parallel}-ub{ubatch}.log").start()
    return Peer(name, "llama.cpp", server.base_url, gguf.name, server.stop, server.command(), server.tokenize)


def same_tokens(peers: Sequence[Peer], reference: Path, text: str) -> dict[str, bool]:
    """Whether each llama.cpp peer feeds its model the ids kvembed's tokenizer gives ``text``
    (a BOS or EOS one side adds and the other not shows as a fidelity gap, not as a speed one)."""
    from kvembed.artifact import load_manifest
    from kvembed.runtime.artifact import encoder_from_manifest

    ids = list(encoder_from_manifest(reference, load_manifest(reference)).encode([text], "document")[0].ids)
    return {p.name: p.tokenize(text) == ids for p in peers if p.tokenize is not None}


def time_request(peer: Peer, texts: Sequence[str], repeats: int) -> float:
    """Median seconds of one request of ``texts`` (after one untimed warm-up)."""
    client = peer.client()
    model = peer.model
    client.embeddings.create(model=model, input=list(texts), encoding_format="float")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        client.embeddings.create(model=model, input=list(texts), encoding_format="float")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def clients_throughput(peer: Peer, texts: Sequence[str], clients: int, requests: int) -> float:
    """Requests per second of ``clients`` closed-loop async clients sending one text each."""
    from openai import AsyncOpenAI

    async def run() -> float:
        client = AsyncOpenAI(base_url=f"{peer.base_url}/v1", api_key="sk-none", max_retries=0, timeout=600.0)
        queue = list(range(requests))

        async def one_client() -> None:
            while queue:
                index = queue.pop()
                await client.embeddings.create(model=peer.model, input=[texts[index % len(texts)]], encoding_format="float")

        await client.embeddings.create(model=peer.model, input=[texts[0]], encoding_format="float")
        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - start
        await client.close()
        return requests / elapsed

    return asyncio.run(run())


def measure(peer: Peer, work: Workloads, repeats: int, requests: int, clients: int) -> dict[str, float]:
    """One round of every workload on ``peer``: texts/s for the throughput cells, seconds for 1x32."""
    return {
        "16x128_texts_per_s": len(work.long16) / time_request(peer, work.long16, repeats),
        "1x32_latency_s": time_request(peer, work.short1, repeats * 4),
        f"{clients}clients_requests_per_s": clients_throughput(peer, work.clients, clients, requests),
    }


def score(cells: dict[str, float]) -> float:
    """The geometric mean of the two throughput cells, by which --search ranks settings."""
    throughput = [value for cell, value in cells.items() if cell.endswith("per_s")]
    return float(np.prod(throughput)) ** (1 / len(throughput))


def fidelity(peer: Peer, work: Workloads, reference: np.ndarray) -> float:
    vectors = peer.embed(work.all_texts())
    return float(cosine_rows(vectors, reference).min())


def search_llama(args: argparse.Namespace, work: Workloads, log_dir: Path) -> dict[str, tuple[int, int, dict[str, float]]]:
    """Each GGUF's fastest (-np, -ub) by the two throughput workloads' geometric mean."""
    best: dict[str, tuple[int, int, dict[str, float]]] = {}
    for name, path in args.gguf:
        for parallel, ubatch in SEARCH:
            peer = start_llama(name, args.llama_server, path, args.pooling, args.threads, parallel, ubatch, log_dir,
                               args.llama_arg)
            try:
                cells = measure(peer, work, max(1, args.repeats // 2), args.requests, args.clients)
            finally:
                peer.stop()
            print(f"search {name} -np {parallel} -ub {ubatch}: {cells}", flush=True)
            if name not in best or score(cells) > score(best[name][2]):
                best[name] = (parallel, ubatch, cells)
    return best


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def pairs(values: Sequence[str]) -> list[tuple[str, Path]]:
    out = []
    for value in values:
        name, _, path = value.partition("=")
        if not path:
            raise SystemExit(f"expected NAME=PATH, got {value!r}")
        out.append((name, Path(path)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, required=True,
                        help="kvembed artifact run in-process on onnxruntime's CPU provider (fp32 arithmetic)")
    parser.add_argument("--kvembed", action="append", default=[], help="NAME=ARTIFACT served by kvembed serve")
    parser.add_argument("--llama-server", type=Path, required=True)
    parser.add_argument("--gguf", action="append", default=[], help="NAME=GGUF served by llama-server")
    parser.add_argument("--pooling", default="last", choices=("last", "mean"))
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="requests timed per cell and round")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients of the clients cell")
    parser.add_argument("--requests", type=int, default=128, help="requests per clients cell")
    parser.add_argument("--client-texts", type=int, default=64, help="distinct texts the clients send (all checked for fidelity)")
    parser.add_argument("--search", action="store_true", help="pick each GGUF's fastest -np/-ub first")
    parser.add_argument("--np", type=int, default=1, help="llama-server -np without --search")
    parser.add_argument("--ub", type=int, default=2048, help="llama-server -ub without --search")
    parser.add_argument("--kvembed-arg", action="append", default=[],
                        help="one more `kvembed serve` argument (repeatable; every kvembed server), e.g. "
                             "--kvembed-arg=--provider --kvembed-arg=openvino --kvembed-arg=--ov-precision --kvembed-arg=bf16")
    parser.add_argument("--llama-arg", action="append", default=[],
                        help="one more llama-server argument (repeatable), e.g. --llama-arg=--override-kv "
                             "--llama-arg=tokenizer.ggml.add_bos_token=bool:false")
    parser.add_argument("--log-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "head_to_head")
    parser.add_argument("--out", type=Path, default=HERE.parent / "results" / "peers")
    args = parser.parse_args(argv)
    args.kvembed, args.gguf = pairs(args.kvembed), pairs(args.gguf)
    missing = [str(p) for p in (args.reference / "kvembed.json", args.llama_server, *(path for _, path in args.kvembed + args.gguf))
               if not p.exists()]
    if missing:
        parser.error(f"not found: {', '.join(missing)} (--reference and --kvembed take artifact directories, "
                     "--gguf a .gguf file, --llama-server the built binary)")
    if args.clients < 1 or args.requests < 1 or args.client_texts < 1 or args.rounds < 1 or args.repeats < 1:
        parser.error("--clients, --requests, --client-texts, --rounds and --repeats must be at least 1")
    args.log_dir.mkdir(parents=True, exist_ok=True)

    from kvembed import Embedder

    work = make_workloads(args.reference / "tokenizer.json", client_texts=args.client_texts)
    reference = Embedder.load(args.reference, provider="cpu").encode(work.all_texts(), normalize=True)
    load_start = load_average()
    chosen = search_llama(args, work, args.log_dir) if args.search else {name: (args.np, args.ub, {}) for name, _ in args.gguf}

    peers: list[Peer] = []
    try:
        try:
            for name, artifact in args.kvembed:
                peers.append(start_kvembed(name, artifact, args.log_dir, args.kvembed_arg))
            for name, path in args.gguf:
                parallel, ubatch, _ = chosen[name]
                peers.append(start_llama(name, args.llama_server, path, args.pooling, args.threads, parallel, ubatch,
                                         args.log_dir, args.llama_arg))
        except RuntimeError as err:  # a server that did not start: what it said last, not a traceback
            said = str(err).strip().splitlines()
            raise SystemExit(f"error: {said[0]} {said[-1] if len(said) > 1 else ''} (logs in {args.log_dir})") from None
        tokens = same_tokens(peers, args.reference, work.short1[0])
        print(f"llama.cpp feeds kvembed's token ids: {tokens}", flush=True)
        cosines = {peer.name: fidelity(peer, work, reference) for peer in peers}
        rounds: list[dict[str, dict[str, float]]] = []
        rng = random.Random(1)
        for index in range(args.rounds):
            order = peers[:]
            rng.shuffle(order)
            rounds.append({peer.name: measure(peer, work, args.repeats, args.requests, args.clients) for peer in order})
            print(f"round {index + 1}: {rounds[-1]}", flush=True)
    finally:
        for peer in peers:
            peer.stop()

    figures: dict[str, Any] = {}
    for peer in peers:
        figures[f"{peer.name}_worst_cos_vs_fp32"] = figure(round(cosines[peer.name], 6), "cosine")
        for cell in rounds[0][peer.name]:
            unit = "s" if cell.endswith("_s") and "per_s" not in cell else "1/s"
            figures[f"{peer.name}_{cell}"] = figure(round(statistics.median(r[peer.name][cell] for r in rounds), 4), unit)
    kv = [p for p in peers if p.kind == "kvembed"]
    for k in kv:
        for ll in (p for p in peers if p.kind == "llama.cpp"):
            for cell in rounds[0][k.name]:
                faster = (lambda r: r[ll.name][cell] / r[k.name][cell]) if cell.endswith("latency_s") else (lambda r: r[k.name][cell] / r[ll.name][cell])
                figures[f"{k.name}_vs_{ll.name}_{cell.split('_')[0]}"] = figure(round(statistics.median(faster(r) for r in rounds), 3), "x")
    # the target: kvembed against llama.cpp's fastest configuration that keeps cos >= 0.99
    faithful = [p for p in peers if p.kind == "llama.cpp" and cosines[p.name] >= FAITHFUL]
    fastest: dict[str, str] = {}
    for k in kv:
        for cell in rounds[0][k.name] if faithful else ():
            latency = cell.endswith("latency_s")
            best = (min if latency else max)(faithful, key=lambda p: statistics.median(r[p.name][cell] for r in rounds))
            ratio = statistics.median((r[best.name][cell] / r[k.name][cell]) if latency else (r[k.name][cell] / r[best.name][cell])
                                      for r in rounds)
            figures[f"{k.name}_vs_fastest_faithful_llama_{cell.split('_')[0]}"] = figure(round(ratio, 3), "x")
            fastest[cell.split('_')[0]] = best.name
    extra = {
        "fastest_faithful_llama": fastest, "llama_same_token_ids": tokens,
        "pooling": args.pooling, "threads": args.threads, "rounds": args.rounds, "clients": args.clients,
        "requests": args.requests, "repeats": args.repeats, "client_texts": args.client_texts,
        "load_average_start": load_start, "load_average_end": load_average(),
        "servers": {p.name: {"kind": p.kind, "command": [str(c) for c in p.command]} for p in peers},
        "llama_search": {name: {"np": c[0], "ub": c[1], "cells": c[2]} for name, c in chosen.items()},  # without --search: the -np/-ub given
        "llama_build": build_facts(args.llama_server),
        "per_round": rounds,
    }
    path = write_record(f"head_to_head_{args.pooling}", figures, directory=args.out, **extra)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
