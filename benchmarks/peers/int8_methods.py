"""int8 (``--int8-recipe auto``) for every method on real models, against each method's fp32
artifact (issue 49, item 3): the recipe auto wrote, its gate and held-out worst cosines, and the
worst cosine on the head-to-head's texts (three draws) on each provider.

    python benchmarks/peers/int8_methods.py WORK --models smollm2-135m gemma3-270m

Each (model, method) is traced once and written at fp32 and int8 into ``WORK/<model>-<method>/``;
an artifact already there is reused (delete it to export again). A method that cannot be
exported for a model is recorded with its error, not skipped silently. The record goes to
``benchmarks/results/peers/``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from int8_texts import BAR, compare  # noqa: E402
from record import RESULTS, figure, write_record  # noqa: E402


def export_pair(model: str, method: str, where: Path) -> dict[str, Path]:
    """``where/fp32`` and ``where/int8`` for ``model`` and ``method`` (one trace), reusing either if written."""
    from kvembed.export.core import Exporter
    from kvembed.export.source import load_embedder

    paths = {precision: where / precision for precision in ("fp32", "int8")}
    missing = [p for p, path in paths.items() if not (path / "kvembed.json").is_file()]
    if missing:
        with Exporter(load_embedder(model, method)) as exporter:
            for precision in missing:
                exporter.write(paths[precision], precision)
    return paths


def main(argv: list[str] | None = None) -> int:
    from kvembed.artifact import load_manifest
    from kvembed.methods import METHODS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="where the artifacts are written (and reused)")
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--providers", nargs="+", default=["auto", "cpu"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=RESULTS / "peers")
    args = parser.parse_args(argv)

    figures, rows, exports = {}, [], []
    for model in args.models:
        for method in args.methods:
            name = f"{model} {method}"
            try:
                paths = export_pair(model, method, args.work / f"{Path(model).name}-{method}")
            except Exception as err:  # recorded: a method this model cannot take is a finding
                exports.append({"model": model, "method": method, "error": f"{type(err).__name__}: {err}"[:500]})
                print(f"{name}: not exported: {type(err).__name__}: {err}", flush=True)
                continue
            manifest = load_manifest(paths["int8"])
            conversion = manifest.raw["graph"]["precision_conversion"]
            held = manifest.parity.held_out
            exports.append({"model": model, "method": method, "recipe": conversion["recipe"],
                            "tried": [t["recipe"] for t in conversion["recipes_tried"]],
                            "gate_worst": manifest.parity.gate.worst_cosine,
                            "held_out_worst": held.worst_cosine if held is not None else None})
            figures[f"{name} gate worst cos"] = figure(round(manifest.parity.gate.worst_cosine, 5), "cosine")
            if held is not None:
                figures[f"{name} held-out worst cos"] = figure(round(held.worst_cosine, 5), "cosine")
            print(f"{name}: recipe {conversion['recipe']}, gate {manifest.parity.gate.worst_cosine:.5f}, held-out "
                  f"{held.worst_cosine if held is not None else float('nan'):.5f}", flush=True)
            more, ran = compare(paths["fp32"], [("int8", paths["int8"])], args.providers, args.seeds, prefix=f"{name} ")
            figures.update(more)
            rows += ran
    if not figures:  # nothing exported: no record, one line naming why
        parser.exit(2, f"int8_methods.py: error: nothing exported ({'; '.join(e['error'] for e in exports)[:400]})\n")
    write_record("peers_int8_methods", figures, directory=args.out, bar=BAR, exports=exports, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
