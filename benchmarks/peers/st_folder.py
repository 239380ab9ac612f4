"""A trained decoder embedder's sentence-transformers folder: kvembed's export of it against
sentence-transformers' own PyTorch on it, speed and fidelity (issue 61, item 2's target).

    python benchmarks/peers/st_folder.py build WORK [--layers 28]
    python benchmarks/peers/st_folder.py run WORK [--precision fp16] [--rounds 5] [--out-dir DIR]

``build`` writes ``WORK/qwen3-embedding-0.6b-shaped``: Qwen3-Embedding-0.6B's decoder widths
(random weights: transformers' own initialisation), SmolLM2's real BPE tokenizer with an
EOS post-processor (Qwen3-Embedding's own tokenizer is not reachable here; the vocabulary changes
only the embedding lookup), and Qwen3-Embedding's sentence-transformers files: last-token pooling,
Normalize, its query prompt. ``run`` exports it with ``kvembed export --model FOLDER --precision P``
(the ``st`` method, gated against sentence-transformers as the second reference) when
``WORK/art-P`` is missing, then times kvembed's default path (``Embedder.load(dir)``: ``auto``)
in this process and ``SentenceTransformer(FOLDER)`` (PyTorch, fp32, the CPU) in a worker process,
taking turns call set by call set, ``--rounds`` times. Workloads: 16 documents of 128 tokens in
one call, and 1 query of 32 tokens (with its prompt). Fidelity: per-text cosine of kvembed's vectors
against sentence-transformers' on every text, queries and documents.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from json_worker import JsonWorker, reply  # noqa: E402

# this folder holds a sentence_transformers.py of its own: keep it from shadowing the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
FOLDER = "qwen3-embedding-0.6b-shaped"
QWEN3_QUERY = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
#: (name, texts, tokens per text, kind, calls per timing sample)
WORKLOADS = (("16x128", 16, 128, "document", 3), ("1x32", 1, 32, "query", 20))
PROMPT_NAME = {"query": "query", "document": "document"}


def build(args: argparse.Namespace) -> None:
    from kvembed.bench.synthetic import QWEN3_06B, build_random_model, copy_demo_tokenizer, write_sentence_transformers_files

    out = Path(args.work) / FOLDER
    if (out / "modules.json").exists():
        print(f"{out} exists", flush=True)
        return
    build_random_model(out, layers=args.layers, vocab_size=49152, **QWEN3_06B)
    copy_demo_tokenizer(out, 4096, source="smollm2-135m")
    # the EOS appended is <|im_end|> (id 2), not the pad token: a random model's pad row is zero
    write_sentence_transformers_files(out, "pooling_mode_lasttoken", {"query": QWEN3_QUERY, "document": ""}, eos_id=2,
                                      max_seq_length=8192)
    print(f"wrote {out}", flush=True)


# -- the worker: sentence-transformers' side, its own process -----------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.threads)
    model = SentenceTransformer(args.folder, device="cpu")
    reply({"ready": True, "torch": torch.__version__, "threads": torch.get_num_threads()})
    for line in sys.stdin:
        request = json.loads(line)
        texts, prompt = request["texts"], PROMPT_NAME[request["kind"]]
        seconds = []
        with torch.inference_mode():
            for _ in range(request.get("calls", 1)):
                start = time.perf_counter()
                vectors = model.encode(texts, prompt_name=prompt, batch_size=len(texts), normalize_embeddings=True)
                seconds.append(time.perf_counter() - start)
        reply({"seconds": seconds, "vectors": np.asarray(vectors, dtype=np.float32).tolist()})


def start_worker(folder: Path, threads: int, log: Path) -> JsonWorker:
    """sentence-transformers on ``folder`` in a child process."""
    command = [sys.executable, str(Path(__file__).resolve()), "worker", str(folder), "--threads", str(threads)]
    return JsonWorker(command, log, "sentence-transformers")


# -- the runner ---------------------------------------------------------------------------------


def exported(work: Path, folder: Path, precision: str) -> Path:
    out = work / f"art-{precision}"
    if not (out / "kvembed.json").exists():
        exe = Path(sys.executable).with_name("kvembed")
        subprocess.run([str(exe), "export", "--model", str(folder), "--precision", precision, "--out", str(out)], check=True)
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> list[float]:
    return [float(x) for x in np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))]


def run(args: argparse.Namespace) -> None:
    from kvembed import Embedder
    from kvembed.bench.measure import time_calls
    from kvembed.bench.report import usable_cores
    from kvembed.bench.workload import exact_rows

    sys.path.insert(0, str(HERE.parent))
    from record import figure, write_record

    work = Path(args.work)
    folder = work / FOLDER
    if not (folder / "modules.json").exists():
        raise SystemExit(f"no {folder}: run `st_folder.py build {work}` first")
    threads = args.threads or usable_cores()
    artifact = exported(work, folder, args.precision)
    kv = Embedder.load(artifact, threads=threads)
    print(f"kvembed: {kv.runtime_line()}", flush=True)
    texts = {name: list(exact_rows(kv.encoder, tokens, count, kind=kind).texts) for name, count, tokens, kind, _ in WORKLOADS}
    kinds = {name: kind for name, _, _, kind, _ in WORKLOADS}
    calls = {name: n for name, *_, n in WORKLOADS}
    peer = start_worker(folder, threads, work / "st-worker.log")
    start_load = round(os.getloadavg()[0], 2)

    fidelity: dict[str, list[float]] = {}
    for name, rows in texts.items():
        for kind in ("query", "document"):
            ours = kv.encode(rows, kind=kind)
            theirs = np.asarray(peer.ask(texts=rows, kind=kind)["vectors"], dtype=np.float32)
            fidelity[f"{name} {kind}"] = [round(c, 6) for c in cosines(ours, theirs)]
    worst = min(min(v) for v in fidelity.values())

    samples: dict[str, dict[str, list[float]]] = {name: {"kvembed": [], "sentence-transformers": []} for name in texts}
    for name, rows in texts.items():  # warm-up, not timed
        kv.encode(rows, kind=kinds[name])
        peer.ask(texts=rows, kind=kinds[name])
    for round_index in range(args.rounds):
        for name, rows in texts.items():
            sides = [("kvembed", lambda r=rows, k=kinds[name], n=calls[name]: time_calls(lambda: kv.encode(r, kind=k), warmup=0, min_repeats=n, min_seconds=0.0, max_repeats=n)),
                     ("sentence-transformers", lambda r=rows, k=kinds[name], n=calls[name]: peer.ask(texts=r, kind=k, calls=n)["seconds"])]
            for side, call in (sides if round_index % 2 == 0 else sides[::-1]):
                samples[name][side].append(statistics.median(call()))
    peer_hello = peer.hello
    peer.close()
    end_load = round(os.getloadavg()[0], 2)

    figures = {"worst_cos_vs_sentence_transformers": figure(round(worst, 6), "cosine")}
    speed = {}
    for name, by in samples.items():
        ours, theirs = statistics.median(by["kvembed"]), statistics.median(by["sentence-transformers"])
        ratios = [t / o for o, t in zip(by["kvembed"], by["sentence-transformers"])]
        speed[name] = {side: [round(1000 * s, 3) for s in values] for side, values in by.items()}
        figures[f"kvembed_{name}_ms"] = figure(round(1000 * ours, 3), "ms")
        figures[f"sentence_transformers_{name}_ms"] = figure(round(1000 * theirs, 3), "ms")
        figures[f"speed_over_sentence_transformers_{name}"] = figure(round(statistics.median(ratios), 3), "x")
        print(f"{name}: kvembed {1000 * ours:9.2f} ms   sentence-transformers {1000 * theirs:9.2f} ms   "
              f"{statistics.median(ratios):5.2f}x", flush=True)
    print(f"worst cosine vs sentence-transformers: {worst:.6f}", flush=True)
    write_record("peers_st_folder", figures, directory=args.out_dir, folder=FOLDER, precision=args.precision,
                 kvembed_runtime=kv.runtime_line(), threads=threads, rounds=args.rounds, calls_per_sample=calls,
                 workloads={n: (c, t, k) for n, c, t, k, _ in WORKLOADS}, fidelity=fidelity, speed_ms=speed,
                 peer=peer_hello, load_start=start_load, load_end=end_load)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write the Qwen3-Embedding-0.6B-shaped sentence-transformers folder")
    b.add_argument("work")
    b.add_argument("--layers", type=int, default=28, help="Decoder layers (the real model's 28 by default).")
    r = sub.add_parser("run", help="export it and time kvembed against sentence-transformers")
    r.add_argument("work")
    r.add_argument("--precision", default="fp16", help="The export's precision (default fp16: bf16 on a CPU with BF16).")
    r.add_argument("--threads", type=int, default=None, help="Both sides' threads (default: the usable cores).")
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--out-dir", type=Path, default=HERE.parent / "results" / "peers")
    w = sub.add_parser("worker", help="(internal) sentence-transformers' side")
    w.add_argument("folder")
    w.add_argument("--threads", type=int, required=True)
    args = parser.parse_args(argv)
    {"build": build, "run": run, "worker": worker}[args.command](args)


if __name__ == "__main__":
    main()
