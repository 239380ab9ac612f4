"""Corpus embedding throughput and memory: ``--runner local`` vs ``--runner ray`` at equal cores.

Builds a Parquet corpus (5 files) of mixed-length texts from kvembed's calibration sentences
(1-4 sentences per text; ``--sentences`` / ``--words`` change that), then runs ``embed_corpus`` once per runner configuration, each in a
fresh process: texts/s and tokens/s over the embedding call (Ray: after ``ray.init``, which a
cluster has already done; actor start and model load are included), and the worker's peak RSS
from the manifest. ``--memory`` runs the local runner on growing corpora of short texts to show
that peak RSS does not grow with the corpus. ``--tokenize N`` times the artifact's own
``TextEncoder`` (its prompt and tokenizer, no model run) on N mixed texts in this process, one
thread: the host-side tokenising rate a corpus run needs per worker. Examples:

    python benchmarks/corpus_bench.py --artifact ART --texts 20000 --memory 20000,200000 --out DIR
    python benchmarks/corpus_bench.py --artifact ART --configs '' --tokenize 4000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FILES = 5


def corpus_texts(count: int, sentences: tuple[int, int], seed: int = 0, words: tuple[int, int] | None = None) -> list[str]:
    """``count`` texts of ``sentences[0]..[1]`` calibration sentences each, cut to ``words[0]..[1]`` words if given."""
    pool = (Path(__file__).resolve().parents[1] / "src" / "kvembed" / "data" / "calibration.txt").read_text().split("\n")
    pool = [line for line in pool if line.strip()]
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(pool) for _ in range(rng.randint(*sentences))) for _ in range(count)]
    return [" ".join(text.split()[:rng.randint(*words)]) for text in texts] if words else texts


def make_corpus(folder: Path, count: int, sentences: tuple[int, int], seed: int = 0,
                words: tuple[int, int] | None = None) -> str:
    """``corpus_texts`` in 5 Parquet files; returns a glob."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = corpus_texts(count, sentences, seed, words)
    folder.mkdir(parents=True, exist_ok=True)
    start = 0
    for f in range(FILES):
        n = count // FILES + (f < count % FILES)
        part, start = texts[start:start + n], start + n
        pq.write_table(pa.table({"id": [f"{f}-{i}" for i in range(n)], "text": part}), folder / f"part-{f}.parquet")
    return str(folder / "*.parquet")


def tokenize_rate(artifact: str, count: int) -> dict:
    """Tokens/s of the artifact's TextEncoder on ``count`` mixed texts, this thread, no model run."""
    from kvembed.artifact import load_manifest
    from kvembed.runtime.artifact import encoder_from_manifest

    encoder = encoder_from_manifest(artifact, load_manifest(artifact))
    texts = corpus_texts(count, (1, 4))
    encoder.encode(texts[:100], "document")  # warm-up
    started = time.perf_counter()
    encoded = encoder.encode(texts, "document")
    seconds = time.perf_counter() - started
    tokens = sum(len(item.ids) for item in encoded)
    return {"texts": count, "tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds),
            "method": encoder.method.name, "vocab": encoder.tokenizer.get_vocab_size(with_added_tokens=True)}


def run_one(config: str, artifact: str, inputs: str, output: str, rows_per_file: int) -> dict:
    """In a fresh process: one runner configuration ``local:1x2`` / ``ray:2x1`` (workers x threads)."""
    runner, shape = config.split(":")
    workers, threads = (int(x) for x in shape.split("x"))
    ray_init = 0.0
    if runner == "ray":
        import ray

        started = time.perf_counter()
        ray.init(num_cpus=workers * threads, include_dashboard=False, logging_level="ERROR")
        ray_init = time.perf_counter() - started
    from kvembed.corpus import CorpusOptions, embed_corpus

    started = time.perf_counter()
    manifest = embed_corpus(CorpusOptions(artifact, [inputs], output, runner=runner, workers=workers, threads=threads,
                                          rows_per_file=rows_per_file, progress=False))
    seconds = time.perf_counter() - started
    return {
        "config": config, "runner": runner, "workers": workers, "threads": threads, "rows": manifest["rows"],
        "tokens": manifest["tokens"], "seconds": round(seconds, 2), "ray_init_s": round(ray_init, 2),
        "texts_per_s": round(manifest["rows"] / seconds, 1), "tokens_per_s": round(manifest["tokens"] / seconds, 1),
        "worker_peak_rss_mb": manifest["worker_peak_rss_mb"], "shards": len(manifest["shards"]),
    }


def spawn(config: str, artifact: str, inputs: str, output: Path, rows_per_file: int) -> dict:
    command = [sys.executable, __file__, "--one", config, "--artifact", artifact, "--input", inputs,
               "--output", str(output), "--rows-per-file", str(rows_per_file)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{config} failed:\n{result.stderr[-3000:]}")
    row = json.loads(result.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)
    return row


def markdown(results: dict) -> str:
    lines = ["| config | rows | tokens | s | texts/s | tokens/s | vs local | worker peak RSS MB |", "|---|---|---|---|---|---|---|---|"]
    lines = lines if results["throughput"] else []
    base = next((r["tokens_per_s"] for r in results["throughput"] if r["runner"] == "local"), None)
    for r in results["throughput"]:
        ratio = f"{r['tokens_per_s'] / base:.3f}" if base else "-"
        lines.append(f"| {r['config']} | {r['rows']:,} | {r['tokens']:,} | {r['seconds']:.1f} | {r['texts_per_s']:,.1f} "
                     f"| {r['tokens_per_s']:,.0f} | {ratio} | {r['worker_peak_rss_mb']:,.0f} |")
    if results["memory"]:
        lines += ["", "| short texts (local, 2 threads) | tokens | s | texts/s | worker peak RSS MB |", "|---|---|---|---|---|"]
        for r in results["memory"]:
            lines.append(f"| {r['rows']:,} | {r['tokens']:,} | {r['seconds']:.1f} | {r['texts_per_s']:,.1f} | {r['worker_peak_rss_mb']:,.0f} |")
    if results.get("tokenize"):
        t = results["tokenize"]
        lines += ["", f"TextEncoder ({t['method']}, vocabulary {t['vocab']:,}), one thread: {t['texts']:,} texts, "
                      f"{t['tokens']:,} tokens in {t['seconds']:.2f} s = {t['tokens_per_s']:,} tokens/s"]
    return "\n".join(lines).lstrip("\n") + "\n"


def span(text: str) -> tuple[int, int]:
    """``"1-4"`` -> (1, 4); ``"3"`` -> (3, 3)."""
    low, _, high = text.partition("-")
    try:
        bounds = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO-HI (e.g. 1-4), got {text!r}") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
    return bounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", required=True)
    parser.add_argument("--texts", type=int, default=2000, help="Texts for the throughput runs (see --sentences, --words).")
    parser.add_argument("--sentences", type=span, default=(1, 4), help="Calibration sentences a throughput text, LO-HI.")
    parser.add_argument("--words", type=span, default=None,
                        help="Cut every throughput text to LO-HI words (short, title-like texts).")
    parser.add_argument("--configs", default="local:1x2,ray:1x2,ray:2x1", help="runner:WORKERSxTHREADS, comma-separated.")
    parser.add_argument("--rounds", type=int, default=1, help="Run every config this many times, interleaved.")
    parser.add_argument("--memory", default="", help="Comma list of short-text corpus sizes for the memory runs (local).")
    parser.add_argument("--rows-per-file", type=int, default=100_000)
    parser.add_argument("--tokenize", type=int, default=0, help="Time the artifact's TextEncoder on this many texts.")
    parser.add_argument("--out", help="Directory for results.json and results.md.")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.artifact, args.input, args.output, args.rows_per_file)))
        return
    results: dict = {"artifact": os.path.abspath(args.artifact), "texts": args.texts, "sentences": args.sentences,
                     "words": args.words, "rows_per_file": args.rows_per_file, "throughput": [], "memory": []}
    if args.tokenize:
        results["tokenize"] = tokenize_rate(args.artifact, args.tokenize)
        print(json.dumps(results["tokenize"]), flush=True)
    with tempfile.TemporaryDirectory(prefix="corpus-bench-") as tmp:
        root = Path(tmp)
        inputs = make_corpus(root / "mixed", args.texts, args.sentences, words=args.words)
        for round_ in range(args.rounds):
            for config in [c for c in args.configs.split(",") if c]:
                results["throughput"].append(spawn(config, args.artifact, inputs, root / f"out-{config}-{round_}".replace(":", "-"), args.rows_per_file))
        for size in [int(x) for x in args.memory.split(",") if x]:
            short = make_corpus(root / f"short-{size}", size, (1, 1), seed=1)
            results["memory"].append(spawn("local:1x2", args.artifact, short, root / f"mem-{size}", args.rows_per_file))
    print(markdown(results))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        (out / "results.md").write_text(markdown(results))


if __name__ == "__main__":
    main()
