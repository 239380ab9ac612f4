"""The record (``record.py``) of a scenario run: ``kvembed bench --scenario FILE --out DIR`` writes
``DIR/results.json``; this turns it into ``results/records/scenario-<name>-<UTC time>.json`` with
one figure per cell and measure (median ms, texts/s, % of the GEMM peak of what the cell ran,
cosine against PyTorch where it ran), the probes' peaks, and the scenario's command.

    kvembed bench --scenario benchmarks/scenarios/cpu-paths.toml --out bench-cpu/
    python benchmarks/scenario_record.py bench-cpu/results.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from record import figure, write_record


def figures_of(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``cell.measure -> figure`` for every cell of a ``kvembed bench`` results.json, and each probe's peak."""
    found: dict[str, dict[str, Any]] = {}
    for name, peak in (results.get("peaks") or {}).items():
        found[f"peak.{name.replace(' ', '-')}"] = figure(round(peak["gflops"], 1), "GFLOP/s")
    for cell in results["cells"]:
        key = f"{cell['backend']}.{cell['precision']}.{cell['batch_size']}x{cell['seq_len']}"
        found[f"{key}.p50"] = figure(round(cell["p50_ms"], 3), "ms")
        found[f"{key}.texts_per_s"] = figure(round(cell["texts_per_s"], 2), "texts/s")
        if cell.get("pct_of_peak") is not None:
            found[f"{key}.pct_of_peak"] = figure(round(cell["pct_of_peak"], 1), f"% of {cell['peak_of']}")
        if cell.get("cosine_vs_baseline") is not None:
            found[f"{key}.cosine_vs_baseline"] = figure(round(cell["cosine_vs_baseline"], 6), f"cosine to {cell['baseline']}")
            found[f"{key}.speedup_vs_baseline"] = figure(round(cell["speedup_vs_baseline"], 3), f"x {cell['baseline']}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="results.json of a kvembed bench --scenario run")
    args = parser.parse_args()
    results = json.loads(args.results.read_text(encoding="utf-8"))
    scenario = (results.get("setup") or {}).get("scenario")
    if not scenario:
        raise SystemExit(f"{args.results} is not from a scenario run (kvembed bench --scenario FILE)")
    name = scenario.replace(" [smoke]", "-smoke")
    command = f"kvembed bench --scenario benchmarks/scenarios/{scenario.split(' ')[0]}.toml" + (" --smoke" if "[smoke]" in scenario else "")
    write_record(f"scenario-{name}", figures_of(results), command=command, source=str(args.results),
                 threads=results["machine"]["threads"])


if __name__ == "__main__":
    main()
