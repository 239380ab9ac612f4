"""Long documents through windows: one vector of a document many times the cap, against cap-length inputs.

    python benchmarks/long_documents.py ARTIFACT [--cap 512] [--factor 20] [--rounds 5] --out DIR

``ARTIFACT`` (default ``artifacts/smollm2-kv``) is loaded with ``Embedder.load(provider="cpu")``
and its per-input cap lowered with ``embedder.cap_input_tokens(--cap)`` (so a run stays short; the
cap is recorded). The document is real English prose (kvembed's calibration text, repeated) of
``--factor`` x ``--cap`` tokens of text, embedded with ``encode(doc, windows=True)`` into one
vector. The cap-length input is the document's first window's text: it fills the cap, prompt
included, and is not cut.

Memory: each case in its own fresh process (``--case``), peak RSS from the OS
(``kvembed.bench.measure.peak_rss_mb``: ``VmHWM``, not ``ru_maxrss``, which Linux carries over
from the parent): ``load`` (the load and nothing else), ``cap`` (one cap-length input), ``window``
(the document through windows), ``window-1`` (the same with ``max_call_tokens`` set to the cap:
one window per graph call), ``cut`` (the document without windows: cut to the cap). The figure is
the peak, and the peak above the load's.

Speed: in one process, interleaved for ``--rounds`` rounds (``kvembed.bench.measure.interleaved``):
``window`` (the document, windows), ``cap x1`` (one cap-length input per call) and ``cap xN``
(the document's windows as ``N`` ordinary inputs of one ``encode`` call: the same model work
without the window bookkeeping). Per round, seconds per token of text and per model token
(prompt and specials included); ratios are medians of per-round ratios.
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
from typing import Any

from record import figure, write_record  # benchmarks/record.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT / "src" / "kvembed" / "data" / "calibration.txt"
CASES = ("load", "cap", "window", "window-1", "cut")


def load(artifact: Path, cap: int, threads: int) -> Any:
    from kvembed.runtime import Embedder

    embedder = Embedder.load(artifact, provider="cpu", threads=threads)
    embedder.cap_input_tokens(cap)
    return embedder


def document(embedder: Any, tokens: int) -> str:
    """Prose of at least ``tokens`` tokens of text (the calibration lines, repeated), cut at a line."""
    lines = CALIBRATION.read_text(encoding="utf-8").splitlines()
    tokenizer = embedder.encoder.tokenizer
    text, count, index = [], 0, 0
    while count < tokens:
        line = lines[index % len(lines)]
        text.append(line)
        count += len(tokenizer.encode(" " + line, add_special_tokens=False).ids)
        index += 1
    return " ".join(text)


def inputs(embedder: Any, factor: int) -> tuple[str, list[str], int]:
    """The document, its windows' texts, and its tokens of text."""
    doc = document(embedder, factor * embedder.max_length)
    windows = embedder.encoder.encode_windows(doc)
    texts = [embedder.encoder.tokenizer.decode(list(w.ids), skip_special_tokens=True) for w in windows]
    template = embedder.method.templates["document"]
    head, tail = template.split("{text}")[0], template.split("{text}")[-1]
    texts = [t[len(head) : len(t) - len(tail)] for t in texts]
    return doc, texts, sum(w.text_tokens for w in windows)


def case(args: argparse.Namespace) -> None:
    """One memory case in this fresh process: JSON on stdout."""
    import warnings

    from kvembed.bench.measure import peak_rss_mb

    embedder = load(args.artifact, args.cap, args.threads)
    doc, texts, _ = inputs(embedder, args.factor)
    after_load = peak_rss_mb()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if args.case == "cap":
            vectors = embedder.encode([texts[0]])
        elif args.case in ("window", "window-1"):
            if args.case == "window-1":
                embedder.max_call_tokens = args.cap
            vectors = embedder.encode([doc], windows=True)
        elif args.case == "cut":
            vectors = embedder.encode([doc])
        else:
            vectors = None
    seconds = time.perf_counter() - start
    print(json.dumps({"case": args.case, "peak_rss_mb": peak_rss_mb(), "after_load_mb": after_load, "seconds": seconds,
                      "rows": None if vectors is None else len(vectors), "windows": len(texts)}))


def memory(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for name in CASES:
        command = [sys.executable, __file__, str(args.artifact), "--case", name, "--cap", str(args.cap),
                   "--factor", str(args.factor), "--threads", str(args.threads)]
        out = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
        found[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"memory {name}: {found[name]}", flush=True)
    return found


def speed(args: argparse.Namespace) -> dict[str, Any]:
    from kvembed.bench.measure import interleaved

    embedder = load(args.artifact, args.cap, args.threads)
    doc, texts, text_tokens = inputs(embedder, args.factor)
    encoder = embedder.encoder
    model_tokens = {"window": sum(len(w.ids) for w in encoder.encode_windows(doc)),
                    "cap x1": len(encoder.encode_one(texts[0]).ids)}
    model_tokens["cap xN"] = sum(len(encoder.encode_one(t).ids) for t in texts)
    content = {"window": text_tokens, "cap x1": encoder.encode_windows(doc)[0].text_tokens, "cap xN": text_tokens}
    calls = {
        "window": lambda: embedder.encode([doc], windows=True),
        "cap x1": lambda: embedder.encode([texts[0]]),
        "cap xN": lambda: embedder.encode(texts),
    }
    times = interleaved(calls, args.rounds)
    per_text = {name: [t / content[name] for t in values] for name, values in times.items()}
    per_model = {name: [t / model_tokens[name] for t in values] for name, values in times.items()}

    def ratio(table: dict[str, list[float]], a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(table[a], table[b]))

    return {
        "times_s": times, "text_tokens": content, "model_tokens": model_tokens, "windows": len(texts),
        "median_s": {name: statistics.median(values) for name, values in times.items()},
        "per_text_token_ratio_window_vs_cap1": ratio(per_text, "window", "cap x1"),
        "per_model_token_ratio_window_vs_cap1": ratio(per_model, "window", "cap x1"),
        "per_text_token_ratio_window_vs_capN": ratio(per_text, "window", "cap xN"),
        "per_model_token_ratio_window_vs_capN": ratio(per_model, "window", "cap xN"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path, nargs="?", default=ROOT / "artifacts" / "smollm2-kv")
    parser.add_argument("--cap", type=int, default=512, help="per-input cap (embedder.cap_input_tokens)")
    parser.add_argument("--factor", type=int, default=20, help="document length in caps")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", choices=("memory", "speed"), help="run one half (its record holds its figures)")
    parser.add_argument("--case", choices=CASES, help="internal: run one memory case in this process")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "long-documents")
    args = parser.parse_args()
    if args.case:
        return case(args)
    args.out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    mem = memory(args) if args.only != "speed" else {}
    fast = speed(args) if args.only != "memory" else {"windows": None}
    load_end = os.getloadavg()
    result = {"cap": args.cap, "factor": args.factor, "threads": args.threads, "artifact": str(args.artifact),
              "memory": mem, "speed": fast, "load_average": [load_start, load_end]}
    (args.out / f"long_documents{'-' + args.only if args.only else ''}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    figures = {name: figure(round(fast[name], 3), "x") for name in fast if name.startswith("per_")}
    if mem:
        figures.update(memory_figures(mem))
    write_record("long_documents", figures, directory=args.out, cap=args.cap, factor=args.factor, threads=args.threads,
                 windows=fast["windows"], load_average_start=list(load_start), load_average_end=list(load_end))
    print(json.dumps({k: v["value"] for k, v in figures.items()}, indent=2))


def memory_figures(mem: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    above = {name: mem[name]["peak_rss_mb"] - mem["load"]["peak_rss_mb"] for name in CASES}
    return {
        "peak_rss_window_mb": figure(round(mem["window"]["peak_rss_mb"], 1), "MB"),
        "peak_rss_cap_mb": figure(round(mem["cap"]["peak_rss_mb"], 1), "MB"),
        "peak_rss_cut_mb": figure(round(mem["cut"]["peak_rss_mb"], 1), "MB"),
        "peak_rss_load_mb": figure(round(mem["load"]["peak_rss_mb"], 1), "MB"),
        "peak_rss_ratio_window_vs_cap": figure(round(mem["window"]["peak_rss_mb"] / mem["cap"]["peak_rss_mb"], 3), "x"),
        "peak_rss_ratio_window1_vs_cap": figure(round(mem["window-1"]["peak_rss_mb"] / mem["cap"]["peak_rss_mb"], 3), "x"),
        "above_load_window1_mb": figure(round(above["window-1"], 1), "MB"),
        "above_load_window_mb": figure(round(above["window"], 1), "MB"),
        "above_load_cap_mb": figure(round(above["cap"], 1), "MB"),
    }


if __name__ == "__main__":
    main()
