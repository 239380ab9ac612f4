"""Weight-only int8 (``--int8-recipe weights``): gate, held-out figure and size per method and block.

    python benchmarks/experiments/int8_weight_only.py --models gemma3-270m --blocks 128 64 --out benchmarks/results/int8-weight-only.json

One trace per (model, method), one int8 artifact per block size, each through the exporter's own
gate (onnxruntime's CPU provider at the accuracy level kvembed pins, ``WEIGHT_ONLY_ACCURACY``).
``--levels`` also runs the same artifact at other ``session.qdq_matmulnbits_accuracy_level``s
(weights pre-packed, as the runtime opens it: level 4, onnxruntime's default, quantises the
activations to int8 per block inside the kernel) on the gate's and the held-out texts against the
same reference outputs. Quality and size only: no timing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

METHODS = ("kv-embedding", "aligned-wva", "token-prepending", "echo", "va", "last-token", "mean", "prompteol")


def level_session(path: Path, level: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(level))
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gemma3-270m"])
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    parser.add_argument("--blocks", nargs="*", type=int, default=[128])
    parser.add_argument("--levels", nargs="*", type=int, default=[], help="other accuracy levels to measure")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/int8-weight-only.json"))
    args = parser.parse_args()
    import torch

    from kvembed.artifact import load_manifest
    from kvembed.export.core import Exporter, load_embedder
    from kvembed.export.gate.parity import HELD_OUT_TEXTS, run_parity
    from kvembed.export.precision.convert import INT8_RECIPES
    from kvembed.runtime.artifact import encoder_from_manifest

    torch.set_num_threads(2)
    warnings.simplefilter("ignore")
    root = Path(tempfile.mkdtemp(prefix="kvembed-weight-only-"))
    base = INT8_RECIPES["weights"]
    names = {}
    for block in args.blocks:
        name = base.name if block == base.block else f"{base.name}-b{block}"
        INT8_RECIPES.setdefault(name, dataclasses.replace(base, name=name, block=block))
        names[block] = name
    rows: list[dict[str, Any]] = []
    for model in args.models:
        for method in args.methods:
            with Exporter(load_embedder(model, method)) as exporter:
                for block, recipe in names.items():
                    out = root / f"{Path(model).name}-{method}-{block}"
                    row: dict[str, Any] = {"model": model, "method": method, "block": block}
                    try:
                        result = exporter.write(out, "int8", int8_recipe=recipe)
                        parity = result.manifest.raw["parity"]
                        conversion = result.manifest.raw["graph"]["precision_conversion"]
                        row.update(gate=parity["worst_cosine"], held_out=parity["held_out"]["worst_cosine"],
                                   mb=sum(f.stat().st_size for f in out.iterdir() if f.is_file()) / 1e6,
                                   level=conversion["accuracy_level"], block_sizes=conversion["block_sizes"])
                        encoder = encoder_from_manifest(out, load_manifest(out))
                        reference = exporter._references[None]
                        for level in args.levels:
                            session = level_session(out / "model.onnx", level)
                            gate = run_parity(session, encoder, reference, "int8", cache=exporter._reference_outputs)
                            held = run_parity(session, encoder, reference, "int8", texts=HELD_OUT_TEXTS,
                                              cache=exporter._reference_outputs)
                            row[f"level{level}"] = {"gate": gate.worst_cosine, "held_out": held.worst_cosine}
                            del session
                    except Exception as err:  # a failed gate is a result too
                        report = getattr(err, "report", None)
                        row.update(error=f"{type(err).__name__}: {err}"[:300],
                                   gate=getattr(report, "worst_cosine", None))
                    shutil.rmtree(out, ignore_errors=True)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
