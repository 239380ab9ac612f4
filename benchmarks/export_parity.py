"""Export parity table: worst-row cosine of every method x architecture x precision.

    python benchmarks/export_parity.py [--out benchmarks/results/export_parity.md]
    python benchmarks/export_parity.py --models gemma3-270m --sizes --out benchmarks/results/export_parity_gemma3.md
    python benchmarks/export_parity.py --families granite olmo2 phi3 stablelm cohere --methods kv-embedding \
        --precisions fp32 fp16 bf16 int8 --out benchmarks/results/export_parity_families.md

Each cell is the parity gate's own measurement (the exported graph in onnxruntime against the
PyTorch reference on the built-in text set: 12 texts, queries and documents, right- and
left-padded batches of mixed lengths, 64 rows). Models: tiny random Llama / Qwen3 / Qwen2 /
Mistral (hidden 64, 4 layers, 4 query / 2 KV heads, randomised norm weights so the norms matter)
and the real stories260k, or the models named by ``--models`` (aliases, folders, GGUF files), or
random checkpoints shaped as a real model of each family named by ``--families`` (``shape_alike.py``;
``--layers`` of them). One trace per (model, method), written at every precision; each cell is the
gate's worst cosine, then the held-out texts' (the export measures them at every precision);
``--sizes`` adds each artifact's bytes and int8's recipe, and a failed gate its worst cosine. The
cells also go to a record (``record.py``), one figure per cell and text set.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import warnings
from pathlib import Path

from record import figure, write_record
from shape_alike import FAMILY_SHAPES, build

METHODS = ("kv-embedding", "va", "aligned-wva", "token-prepending", "last-token", "mean", "prompteol", "echo")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
DEFAULT_PRECISIONS = ("fp32", "fp16", "int8")


def tiny_model(arch: str, folder: Path, seed: int = 0) -> Path:
    import torch
    import transformers

    from kvembed.methods import demo_model_path

    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "qwen3": lambda: transformers.Qwen3Config(head_dim=16, **common),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "mistral": lambda: transformers.MistralConfig(head_dim=16, **common),
    }[arch]()
    torch.manual_seed(seed)
    model = transformers.AutoModel.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_path() / name, folder / name)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/export_parity.md"))
    parser.add_argument("--models", nargs="*", help="models to export instead of the tiny ones and stories260k")
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    parser.add_argument("--families", nargs="*", choices=sorted(FAMILY_SHAPES),
                        help="random checkpoints shaped as each family's real model (shape_alike.py)")
    parser.add_argument("--layers", type=int, default=4, help="layers of each --families checkpoint")
    parser.add_argument("--precisions", nargs="*", default=list(DEFAULT_PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--sizes", action="store_true", help="add artifact bytes and int8's recipe to each cell")
    args = parser.parse_args()
    if args.layers < 1:
        parser.error(f"--layers must be >= 1, got {args.layers}")
    import torch

    from kvembed.export.core import Exporter, load_embedder

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    root = Path(tempfile.mkdtemp(prefix="kvembed-parity-"))
    # a seed per architecture: Llama and Mistral share a layout, the same seed would give equal weights
    archs = ("llama", "qwen3", "qwen2", "mistral")
    if args.models or args.families:
        models = {Path(m).name: m for m in args.models or ()}
        models.update({family: str(build(family, root / family, args.layers)) for family in args.families or ()})
    else:
        models = {arch: str(tiny_model(arch, root / arch, seed=i)) for i, arch in enumerate(archs)}
        models["stories260k"] = "stories260k"
    table: dict[str, dict[str, str]] = {}
    figures: dict[str, dict] = {}
    start = time.monotonic()
    for method in args.methods:
        row = table.setdefault(method, {})
        for name, model in models.items():
            with Exporter(load_embedder(model, method)) as exporter:
                for precision in args.precisions:
                    out = root / "out" / f"{name}-{method}-{precision}"
                    try:
                        result = exporter.write(out, precision)
                        cell = f"{result.parity.worst_cosine:.7f}"
                        figures[f"{name} {method} {precision} gate"] = figure(result.parity.worst_cosine, "cosine")
                        held = result.report.held_out
                        if held is not None:
                            cell += f" / {held.worst_cosine:.7f}"
                            figures[f"{name} {method} {precision} held-out"] = figure(held.worst_cosine, "cosine")
                        if args.sizes:
                            recipe = result.manifest.raw["graph"].get("precision_conversion", {}).get("recipe")
                            size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
                            cell += f" ({recipe + ', ' if recipe else ''}{size / 1e6:.1f} MB)"
                        row[f"{name} {precision}"] = cell
                    except Exception as err:  # a failed gate is a result too
                        worst = getattr(getattr(err, "report", None), "worst_cosine", None)
                        row[f"{name} {precision}"] = f"FAILED ({type(err).__name__}{f', {worst:.5f}' if worst else ''})"
                    shutil.rmtree(out, ignore_errors=True)
            print(method, name, {k: v for k, v in row.items() if k.startswith(name)}, flush=True)
    columns = [f"{name} {p}" for name in models for p in args.precisions]
    lines = [
        f"Worst-row cosine, exported graph on the gate's first target (onnxruntime; OpenVINO bf16 for bf16) "
        f"vs PyTorch reference, 64 rows per cell "
        f"({time.monotonic() - start:.0f} s); a cell is the gate's texts / the held-out texts. "
        "Gates: fp32 >= 0.99999 (and max abs <= 1e-4), fp16 and bf16 >= 0.999, int8 >= 0.99.",
        "",
        "| method | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    lines += [f"| {m} | " + " | ".join(table[m].get(c, "") for c in columns) + " |" for m in args.methods]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if figures:
        shapes = {family: FAMILY_SHAPES[family][0] for family in args.families or ()}
        write_record("export_parity", figures, layers=args.layers if shapes else None, shaped_as=shapes or None,
                     source=str(args.out))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
