"""``results.json``, ``results.md`` (configuration x task table) and ``results.png`` (bar chart)
of a ``kvembed eval`` run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ..methods.layers import format_layers
from .runner import ConfigResult

CHART = "results.png"


def to_json(results: Sequence[ConfigResult], tasks: Sequence[dict[str, Any]], environment: dict[str, Any],
            mteb_files: Sequence[Path], out: Path) -> dict[str, Any]:
    """The JSON report: tasks, configurations (as asked and as resolved), scores, mteb's files."""
    return {
        "tasks": list(tasks),
        "configurations": [
            {**r.config.describe(), "resolved": r.method, "dim": r.dim, "seconds": round(r.seconds, 3), **r.precision}
            for r in results
        ],
        "scores": {r.config.label: r.scores for r in results},
        "mteb_result_files": [str(p.relative_to(out)) for p in mteb_files],
        "environment": environment,
    }


def _options(result: ConfigResult) -> str:
    """The method, its resolved layer set (when it has one) and the options the user set."""
    method = result.method
    if result.config.baseline:
        return f"{method['name']}: {method['options'].get('architecture', '?')}"
    parts = [method["name"]]
    if "layers" in method["options"]:
        parts.append(f"layers={format_layers(method['layers'])}")
    parts += [f"{k}={v}" for k, v in result.config.options.items() if k != "layers"]
    return " ".join(parts)


def precision_cells(result: ConfigResult) -> list[str]:
    """The precision (and the backend that ran it), the gate's and the held-out worst cosine."""
    record = result.precision

    def cosine(key: str) -> str:
        value = record.get(key)
        return "—" if value is None else f"{value:.5f}"

    ran = record.get("precision") or "—"
    if record.get("backend"):
        ran += f" ({record['backend']})"
    return [ran, cosine("gate_worst_cosine"), cosine("held_out_worst_cosine")]


#: the columns of :func:`precision_cells`
PRECISION_COLUMNS = ("precision (backend)", "gate worst cos", "held-out worst cos")


def to_markdown(results: Sequence[ConfigResult], tasks: Sequence[dict[str, Any]]) -> str:
    """One row per configuration, one column per task (mteb's main score), best per task in bold."""
    names = [task["name"] for task in tasks]
    best = {name: max((r.scores[name]["main_score"] for r in results if name in r.scores), default=None) for name in names}
    header = ["configuration", "method (resolved)", *PRECISION_COLUMNS, *(f"{t['name']} ({t['main_score']})" for t in tasks)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 3 + "---:|" * (len(names) + 2)]
    for r in results:
        cells = []
        for name in names:
            score = r.scores.get(name, {}).get("main_score")
            text = "—" if score is None else f"{score:.4f}"
            cells.append(f"**{text}**" if score is not None and score == best[name] and len(results) > 1 else text)
        lines.append(f"| {r.config.label} | {_options(r)} | " + " | ".join([*precision_cells(r), *cells]) + " |")
    sizes = "; ".join(f"{t['name']}: {t['size']}" for t in tasks)
    trained = [r.config.label for r in results if r.config.baseline]
    note = (f" {', '.join(trained)}: trained embedder(s) run by sentence-transformers, for comparison with the "
            f"training-free methods." if trained else "")
    return "\n".join(lines) + (f"\n\nTasks: {sizes}. Scores by mteb (main score of the test split). Gate worst cos: the "
                               f"artifact's parity gate against PyTorch; held-out: the same on texts the gate never "
                               f"decided on.{note}\n")


def chart(results: Sequence[ConfigResult], tasks: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Horizontal grouped bars: one group per configuration, one bar per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [task["name"] for task in tasks]
    rows = len(results)
    height = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(8.5, 1.2 + 0.32 * rows * max(1, len(names)) ** 0.7 + 0.3 * rows))
    positions = np.arange(rows)
    for i, name in enumerate(names):
        values = [r.scores.get(name, {}).get("main_score", np.nan) for r in results]
        bars = ax.barh(positions + (i - (len(names) - 1) / 2) * height, values, height=height,
                       label=f"{name} ({tasks[i]['main_score']})")
        for bar, value in zip(bars, values):
            if np.isfinite(value):
                ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:.3f}", va="center", fontsize=7)
    ax.set_yticks(positions)
    ax.set_yticklabels([r.config.label for r in results], fontsize=8)
    for tick, r in zip(ax.get_yticklabels(), results):
        if r.config.baseline:  # trained models stand apart from the training-free methods
            tick.set_fontstyle("italic")
    ax.invert_yaxis()
    low = min([0.0, *(r.scores[n]["main_score"] for r in results for n in names if n in r.scores)])
    ax.set_xlim(low - 0.05 if low < 0 else 0.0, 1.08)
    ax.axvline(0.0, color="black", linewidth=0.6)
    ax.set_xlabel("mteb main score")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="best")  # a trained baseline fills the lower right corner
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(results: Sequence[ConfigResult], tasks: Sequence[dict[str, Any]], environment: dict[str, Any],
          mteb_files: Sequence[Path], out: Path, title: str) -> dict[str, Path]:
    """Write the three report files into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "chart": out / CHART}
    report = to_json(results, tasks, environment, mteb_files, out)
    paths["json"].write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    paths["markdown"].write_text(f"# {title}\n\n" + to_markdown(results, tasks), encoding="utf-8")
    chart(results, tasks, paths["chart"], title)
    return paths
