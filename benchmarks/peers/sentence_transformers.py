"""kvembed's ``Embedder`` against sentence-transformers' ONNX and OpenVINO backends on SmolLM2-135M:
speed in-process on the same texts, and fidelity to kvembed's fp32 artifacts (issue 49, item 1).

    python benchmarks/peers/sentence_transformers.py run WORK [--rounds 5] [--out-dir DIR]

Both sides start from the same weights: kvembed's dequantised HF folder of the packaged Q4_1
GGUF (``llama_server.py hf-dir``). kvembed runs its fp32 ``last-token`` and ``mean`` artifacts
(``WORK/smollm2-last``, ``WORK/smollm2-mean``, exported when missing); sentence-transformers runs
``Transformer(HF, backend=...)`` (ONNX: Optimum exports the graph on first load and
onnxruntime runs it; OpenVINO: optimum-intel converts it and OpenVINO runs it, at its default
inference precision) under a ``Pooling`` of ``lasttoken`` and ``mean``, each backend's
Transformer shared by both poolings. A backend that does not load, or does not embed two texts
once loaded, is recorded with its error and left out of the timing.

sentence-transformers lives in the peers' venv (``peer_venv.py``), kvembed in this one, so the
peers run in a worker process (``worker``, JSON lines on stdin/stdout) and every side times its own
``encode`` calls in its own process. The contenders take turns, call by call set: kvembed, then
each peer model, then kvembed again, ``--rounds`` times, so a drift of the machine's speed hits
all of them alike. Workloads: 16 texts of 128 tokens in one call, and 1 text of 32 tokens.
Fidelity: per-text cosine of each peer model against kvembed's artifact of the same pooling, on
those texts and on texts of mixed lengths (padding), and whether the token ids agree.
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
from typing import Any, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peer_venv  # noqa: E402
from json_worker import JsonWorker, reply  # noqa: E402

#: sentence-transformers' pooling modes and the kvembed method each is compared with
POOLINGS = {"lasttoken": "last-token", "mean": "mean"}
#: ``openvino:f32`` / ``openvino:bf16``: OpenVINO with that inference precision hint (default: its own)
BACKENDS = ("onnx", "openvino", "openvino:f32")
#: (name, texts, tokens per text, calls per timing sample)
WORKLOADS = (("16x128", 16, 128, 3), ("1x32", 1, 32, 30))
QUIET_LOAD = 1.5


# -- the worker: runs in the peers' venv, never imports kvembed ----------------------------------


def worker(args: argparse.Namespace) -> None:
    """Load every (backend, pooling) model and embed two texts with it, answer with each backend's
    status once (a backend that fails either is left out), then ``embed`` / ``ids`` requests."""
    # this script's folder is first on sys.path and this file is named like the package: drop it
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    st: dict[str, Any] = {}
    status: dict[str, Any] = {}
    for backend in args.backends.split(","):
        start = time.perf_counter()
        try:
            kind, _, hint = backend.partition(":")  # openvino:f32 sets OpenVINO's inference precision
            kwargs = {"ov_config": {"INFERENCE_PRECISION_HINT": hint}} if hint else {}
            module = Transformer(args.hf_dir, backend=kind, model_kwargs=kwargs)
            dim = module.get_embedding_dimension()
            for pooling in POOLINGS:
                st[f"{backend}/{pooling}"] = SentenceTransformer(modules=[module, Pooling(dim, pooling_mode=pooling)],
                                                                 device="cpu")
            status[backend] = {"loaded": True, "load_s": round(time.perf_counter() - start, 1),
                               "padding_side": module.tokenizer.padding_side}
            probe = st[f"{backend}/lasttoken"].encode(["a first text", "and a second, longer one"])
            # a backend may run and still return NaN: said here, and its cosines are NaN too
            status[backend].update(encodes=True, finite=bool(np.isfinite(probe).all()))
        except Exception as err:  # a peer that does not load or run is a result, recorded with its reason
            status[backend] = {**status.get(backend, {"loaded": False}), "encodes": False,
                               "error": f"{type(err).__name__}: {err}"[:2000]}
            for pooling in POOLINGS:
                st.pop(f"{backend}/{pooling}", None)
    reply({"status": status, "models": sorted(st)})
    for line in sys.stdin:
        request = json.loads(line)
        model = st[request["model"]]
        if request["op"] == "ids":
            reply({"ids": model.tokenizer(request["texts"])["input_ids"]})
            continue
        times = []
        for _ in range(request.get("calls", 1)):
            start = time.perf_counter()
            vectors = model.encode(request["texts"], batch_size=len(request["texts"]), normalize_embeddings=True,
                                   convert_to_numpy=True)
            times.append(time.perf_counter() - start)
        reply({"seconds": times, "vectors": np.asarray(vectors, dtype=np.float32).tolist()})


def start_peers(python: Path, hf_dir: Path, backends: Sequence[str], log: Path) -> JsonWorker:
    """The worker process, in the peers' venv (its own packages only: PYTHONPATH cleared)."""
    command = [str(python), str(Path(__file__).resolve()), "worker", "--hf-dir", str(hf_dir), "--backends", ",".join(backends)]
    return JsonWorker(command, log, "sentence-transformers", env={**os.environ, "PYTHONPATH": ""})


def artifact(work: Path, method: str) -> Path:
    """kvembed's fp32 artifact of SmolLM2-135M for ``method`` in the work dir (exported when missing)."""
    out = work / ("smollm2-last" if method == "last-token" else f"smollm2-{method}")
    if not (out / "kvembed.json").exists():
        exe = Path(sys.executable).with_name("kvembed")
        subprocess.run([str(exe), "export", "--model", "smollm2-135m", "--method", method, "--out", str(out)], check=True)
    return out


def run(args: argparse.Namespace) -> None:
    from kvembed import Embedder
    from kvembed.bench.measure import time_calls
    from kvembed.bench.workload import exact_rows
    from llama_server import SMOKE_TEXTS, cosine_rows, kvembed_hf_dir

    sys.path.insert(0, str(HERE.parent))
    from record import figure, write_record

    work = peer_venv.work_dir(args.work)
    python = peer_venv.ensure(work)
    hf_dir = peer_venv.transformers4_copy(kvembed_hf_dir(args.model), work / "smollm2-135m-transformers4")
    kv = {pooling: Embedder.load(artifact(work, method), provider="cpu", threads=args.threads)
          for pooling, method in POOLINGS.items()}
    encoder = kv["lasttoken"].encoder
    workloads = {name: list(exact_rows(encoder, tokens, count).texts) for name, count, tokens, _ in WORKLOADS}
    calls = {name: n for name, _, _, n in WORKLOADS}
    start_load = round(os.getloadavg()[0], 2)
    peers = start_peers(python, hf_dir, args.backends.split(","), work / "st-worker.log")
    status, names = peers.hello["status"], peers.hello["models"]
    print(json.dumps(status), flush=True)

    fidelity: dict[str, Any] = {}
    mixed = list(SMOKE_TEXTS)
    for name in names:
        pooling = name.split("/")[1]
        entry: dict[str, Any] = {}
        for label, texts in (("mixed", mixed), *workloads.items()):
            ours = kv[pooling].encode(texts, normalize=True)
            theirs = np.asarray(peers.ask(op="embed", model=name, texts=texts)["vectors"], dtype=np.float32)
            entry[label] = [round(float(c), 6) for c in cosine_rows(theirs, ours)]
        their_ids = peers.ask(op="ids", model=name, texts=mixed)["ids"]
        our_ids = [list(item.ids) for item in encoder.encode(mixed)]
        entry["same_token_ids"] = sum(a == b for a, b in zip(their_ids, our_ids))
        entry["texts"] = len(mixed)
        entry["min_cosine"] = min(min(v) for k, v in entry.items() if isinstance(v, list))
        fidelity[name] = entry

    samples: dict[str, dict[str, list[float]]] = {w: {} for w in workloads}
    for workload, texts in workloads.items():  # one warm-up call each, not timed
        for pooling in POOLINGS:
            kv[pooling].encode(texts)
        for name in names:
            peers.ask(op="embed", model=name, texts=texts)
    loads = [round(os.getloadavg()[0], 2)]
    for _ in range(args.rounds):
        for workload, texts in workloads.items():
            n = calls[workload]
            for pooling in POOLINGS:
                samples[workload].setdefault(f"kvembed/{pooling}", []).append(
                    statistics.median(time_calls(lambda p=pooling: kv[p].encode(texts), warmup=0, min_repeats=n, min_seconds=0.0, max_repeats=n)))
            for name in names:
                seconds = peers.ask(op="embed", model=name, texts=texts, calls=n)["seconds"]
                samples[workload].setdefault(name, []).append(statistics.median(seconds))
        loads.append(round(os.getloadavg()[0], 2))
    peers.close()
    end_load = round(os.getloadavg()[0], 2)

    figures, speed = {}, {}
    for workload, by in samples.items():
        speed[workload] = {name: {"median_ms": round(1000 * statistics.median(s), 3),
                                  "samples_ms": [round(1000 * x, 3) for x in s]} for name, s in by.items()}
        for name, values in speed[workload].items():
            figures[f"{workload} {name} ms per call"] = figure(values["median_ms"], "ms")
            pooling = name.split("/")[1]
            if not name.startswith("kvembed/"):
                ratio = values["median_ms"] / speed[workload][f"kvembed/{pooling}"]["median_ms"]
                figures[f"{workload} {name} / kvembed"] = figure(round(ratio, 3), "x")
    for name, entry in fidelity.items():
        figures[f"{name} min cosine vs kvembed fp32"] = figure(entry["min_cosine"], "cosine")
    for name, values in speed["16x128"].items():
        print(f"{name:22s} 16x128 {values['median_ms']:9.2f} ms   1x32 {speed['1x32'][name]['median_ms']:8.2f} ms   "
              + (f"min cos {fidelity[name]['min_cosine']:.6f}" if name in fidelity else ""), flush=True)
    write_record("peers_sentence_transformers", figures, directory=args.out_dir,
                 hf_dir=str(hf_dir), threads=args.threads, rounds=args.rounds, workloads={n: (c, t) for n, c, t, _ in WORKLOADS},
                 calls_per_sample=calls, backends=status, fidelity=fidelity, speed=speed,
                 load_start=start_load, load_end=end_load, load_per_round=loads,
                 walls_loaded=max(start_load, end_load, *loads) >= QUIET_LOAD,
                 peer_versions=peer_venv.versions(work))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="measure kvembed against the sentence-transformers backends")
    go.add_argument("work", help="Work dir outside the repo (venv, artifacts, exported peer graphs, logs).")
    go.add_argument("--model", default="smollm2-135m", help="A packaged GGUF model alias (its dequantised HF folder).")
    go.add_argument("--backends", default=",".join(BACKENDS))
    go.add_argument("--threads", type=int, default=None, help="kvembed's threads (default: its own; the peers keep theirs).")
    go.add_argument("--rounds", type=int, default=5, help="Interleaved timing rounds.")
    go.add_argument("--out-dir", type=Path, default=None, help="Where the record goes (default benchmarks/results/peers).")
    wk = sub.add_parser("worker", help="(internal) the sentence-transformers side, in the peers' venv")
    wk.add_argument("--hf-dir", required=True)
    wk.add_argument("--backends", required=True)
    args = parser.parse_args(argv)
    if args.command == "worker":
        worker(args)
        return
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.out_dir is None:
        args.out_dir = HERE.parent / "results" / "peers"
    run(args)


if __name__ == "__main__":
    main()
