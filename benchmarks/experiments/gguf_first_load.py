"""A GGUF's first load (dequantized into a fresh cache), two kvembed checkouts interleaved.

    python benchmarks/experiments/gguf_first_load.py OLD_SRC NEW_SRC [--model smollm2-135m --model gemma3-270m] [--rounds 2]

Each run is a fresh interpreter with ``PYTHONPATH=SRC`` and an empty ``KVEMBED_CACHE_DIR``, loading
``TorchEmbedder.from_pretrained(model, "kv-embedding")``: the header read, transformers' GGUF
loader, the cache folder written, the folder loaded. Wall seconds and the process's peak RSS
(``ru_maxrss``), checkout after checkout within a round. Writes a record (benchmarks/record.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from record import figure, write_record  # noqa: E402

CHILD = """
import json, resource, sys, time
start = time.perf_counter()
from kvembed.modeling.reference import TorchEmbedder
TorchEmbedder.from_pretrained(sys.argv[1], "kv-embedding")
print(json.dumps({"wall_s": time.perf_counter() - start, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def first_load(src: Path, model: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gguf-first-load-") as cache:
        env = {**os.environ, "PYTHONPATH": str(src), "KVEMBED_CACHE_DIR": cache}
        done = subprocess.run([sys.executable, "-c", CHILD, model], capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        raise SystemExit(f"{src} {model}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path, help="the src/ folder of the checkout before")
    parser.add_argument("new", type=Path, help="the src/ folder of the checkout after")
    parser.add_argument("--model", action="append", help="packaged GGUF model names (default: smollm2-135m, gemma3-270m)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    models = args.model or ["smollm2-135m", "gemma3-270m"]
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for model in models:
            for label, src in (("old", args.old), ("new", args.new)):
                got = first_load(src.resolve(), model)
                runs.setdefault((model, label), []).append(got)
                print(f"round {round_ + 1} {model} {label}: {got['wall_s']:.1f} s, peak RSS {got['peak_rss_mb']:.0f} MB", flush=True)
    figures = {}
    for (model, label), values in runs.items():
        figures[f"{model}.{label}.wall"] = figure(round(statistics.median(v["wall_s"] for v in values), 1), "s")
        figures[f"{model}.{label}.peak_rss"] = figure(round(max(v["peak_rss_mb"] for v in values)), "MB")
    write_record("gguf-first-load", figures, command=" ".join(["python", *sys.argv]))


if __name__ == "__main__":
    main()
