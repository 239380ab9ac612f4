"""Cost of Causal2Vec's Contextual token: the causal2vec graph vs last-token on the same LLM.

    python benchmarks/make_qwen3_06b_shaped.py --layers 8 --out /tmp/q06
    python benchmarks/causal2vec_cost.py --llm /tmp/q06 --work /tmp/c2v-bench --out benchmarks/results/causal2vec

A BERT-base-shaped encoder (12 layers, hidden 768, random weights, a WordPiece vocabulary trained
on the built-in calibration texts) and the LLM are assembled into an untrained checkpoint
(``kvembed causal2vec assemble``); both methods are exported fp32 through the parity gate and run
by the torch-free runtime on the same 16 texts of 128 LLM tokens (raw text; causal2vec adds its
placeholder and EOS), interleaved round by round, each ratio taken within its round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from kvembed.bench.synthetic import build_bert
from kvembed.modeling.causal2vec import assemble
from kvembed.export.core import export_result
from kvembed.runtime import Embedder

WORDS = "the a cat dog sat ran on in park mat blue sky why is was happy over under".split()


def texts_of(embedder: Embedder, count: int, tokens: int) -> list[str]:
    """``count`` texts of exactly ``tokens`` raw-text tokens under ``embedder``'s tokenizer."""
    out = []
    for i in range(count):
        words = [WORDS[(i + k) % len(WORDS)] for k in range(tokens * 2)]
        text = " ".join(words)
        while len(embedder.encoder.tokenizer.encode(text).ids) > tokens:
            text = text[: -1].rstrip()
        out.append(text)
    return out


def timed(embedder: Embedder, texts: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        embedder.encode(texts, batch_size=len(texts))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llm", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/causal2vec"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--texts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "ckpt" / "causal2vec.json").is_file():
        build_bert(work / "bert-base-shaped", hidden=768, layers=12, heads=12, max_positions=512)
        assemble(work / "bert-base-shaped", args.llm, work / "ckpt", seed=0)
    artifacts = {"causal2vec": work / "causal2vec-fp32", "last-token": work / "last-token-fp32"}
    for method, directory in artifacts.items():
        if not (directory / "kvembed.json").is_file():
            source = work / "ckpt" if method == "causal2vec" else args.llm
            export_result(source, method, directory, precision="fp32", force=True)
    runtimes = {method: Embedder.load(directory, provider="cpu", threads=args.threads) for method, directory in artifacts.items()}
    texts = texts_of(runtimes["last-token"], args.texts, args.tokens)
    tokens = {m: sum(len(item.ids) for item in e.encoder.encode(texts)) for m, e in runtimes.items()}
    encoder_tokens = sum(len(item.context or ()) for item in runtimes["causal2vec"].encoder.encode(texts))
    for runtime in runtimes.values():
        timed(runtime, texts, 1)  # warm-up
    rounds = []
    for _ in range(args.rounds):
        cell = {method: timed(runtime, texts, args.repeats) for method, runtime in runtimes.items()}
        cell["ratio"] = cell["causal2vec"] / cell["last-token"]
        rounds.append(cell)
    result = {
        "llm": str(args.llm), "encoder": "BERT-base-shaped (12 x 768, random)", "texts": args.texts,
        "llm_tokens": tokens, "encoder_tokens": encoder_tokens, "threads": args.threads, "rounds": rounds,
        "median_s": {m: statistics.median(r[m] for r in rounds) for m in runtimes},
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "parity_worst_cosine": {
            m: json.loads((d / "kvembed.json").read_text())["parity"]["worst_cosine"] for m, d in artifacts.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cost.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("llm_tokens", "encoder_tokens", "median_s", "median_ratio", "parity_worst_cosine")}, indent=2))


if __name__ == "__main__":
    main()
