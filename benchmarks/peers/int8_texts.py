"""int8 artifacts against their fp32 artifact on the head-to-head's texts (issue 49, item 3):
worst cosine and rows below int8's bar, per backend and per draw of texts.

    python benchmarks/peers/int8_texts.py --reference WORK/smollm2-last \
        smooth=WORK/smollm2-last-int8 weights=WORK/smollm2-last-int8-weights --providers auto cpu

The texts are :func:`head_to_head.make_workloads`' (plain English sentences joined and cut at a
token count: 16 of 128 tokens, one of 32, 64 of 16-64); seed 0 is the head-to-head's own draw,
the others are fresh draws of the same kind, which no export has seen. Everything runs
in-process (``Embedder.encode``), so the figures are the artifacts', not a server's. The record
goes to ``benchmarks/results/peers/``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from head_to_head import make_workloads  # noqa: E402
from record import RESULTS, figure, write_record  # noqa: E402

#: int8's bar (docs/methods.md)
BAR = 0.99


def named(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"give NAME=ARTIFACT, got {value!r}")
    return name, Path(path)


def compare(reference_path: Path, artifacts: list[tuple[str, Path]], providers: list[str], seeds: list[int],
            prefix: str = "") -> tuple[dict, list[dict]]:
    """Each artifact on each provider against ``reference_path`` (fp32, onnxruntime CPU) on each
    seed's draw of texts: figures (``prefix`` before their names) and one row each."""
    from kvembed import Embedder

    reference = Embedder.load(reference_path, provider="cpu")
    draws = {seed: make_workloads(reference_path / "tokenizer.json", seed=seed).all_texts() for seed in seeds}
    wanted = {seed: reference.encode(texts, normalize=True) for seed, texts in draws.items()}
    figures, rows = {}, []
    for name, path in artifacts:
        for provider in providers:
            embedder = Embedder.load(path, provider=provider)
            ran = embedder.session.name
            for seed, texts in draws.items():
                cosines = (wanted[seed] * embedder.encode(texts, normalize=True)).sum(axis=1)
                worst, below = float(cosines.min()), int((cosines < BAR).sum())
                figures[f"{prefix}{name} {provider} seed {seed} worst cos"] = figure(round(worst, 5), "cosine")
                figures[f"{prefix}{name} {provider} seed {seed} rows below {BAR}"] = figure(below, "rows")
                rows.append(dict(artifact=f"{prefix}{name}", provider=provider, ran=ran, seed=seed, worst=worst,
                                 below=below, texts=len(texts)))
                print(f"{prefix}{name:>12} {provider:>5} ({ran}) seed {seed}: worst {worst:.4f}, {below} of "
                      f"{len(texts)} below {BAR}", flush=True)
    return figures, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, help="the fp32 artifact (onnxruntime CPU)")
    parser.add_argument("artifacts", nargs="+", type=named, help="NAME=ARTIFACT, each an int8 (or any) artifact")
    parser.add_argument("--providers", nargs="+", default=["auto", "cpu"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=RESULTS / "peers")
    args = parser.parse_args(argv)
    for path in [args.reference, *(path for _, path in args.artifacts)]:
        if not (path / "kvembed.json").is_file():
            parser.error(f"{str(path)!r} is no kvembed artifact (no kvembed.json): give a directory kvembed-export wrote")

    figures, rows = compare(args.reference, args.artifacts, args.providers, args.seeds)
    write_record("peers_int8_texts", figures, directory=args.out, bar=BAR, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
