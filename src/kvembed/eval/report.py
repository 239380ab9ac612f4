"""``results.json``, ``results.md`` (configuration x task table; with several models also a
configuration x model table per task) and ``results.png`` (bar chart, models side by side) of a
``kvembed eval`` run."""

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


def models_compared(results: Sequence[ConfigResult]) -> tuple[list[str], list[str]] | None:
    """The models and the configuration names of a run that sets several models side by side
    (``kvembed eval MODEL_A MODEL_B --config ...``), in command-line order; None otherwise."""
    models = list(dict.fromkeys(r.config.model for r in results if r.config.model))
    if len(models) < 2:
        return None
    return models, list(dict.fromkeys(r.config.name or r.config.label for r in results if r.config.model))


def side_by_side(results: Sequence[ConfigResult], tasks: Sequence[dict[str, Any]]) -> str:
    """Per task, one row per configuration and one column per model (best per model in bold);
    trained baselines are listed under the table. Empty unless several models are compared."""
    compared = models_compared(results)
    if compared is None:
        return ""
    models, names = compared
    score = {(r.config.model, r.config.name or r.config.label): r.scores for r in results if r.config.model}
    parts = []
    for task in tasks:
        task_name = task["name"]

        def value(model: str, name: str) -> float | None:
            return score.get((model, name), {}).get(task_name, {}).get("main_score")

        best = {m: max((v for n in names if (v := value(m, n)) is not None), default=None) for m in models}
        lines = [f"| {task_name} ({task['main_score']}) | " + " | ".join(models) + " |", "|---|" + "---:|" * len(models)]
        for name in names:
            cells = []
            for model in models:
                v = value(model, name)
                text = "—" if v is None else f"{v:.4f}"
                cells.append(f"**{text}**" if v is not None and v == best[model] and len(names) > 1 else text)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        trained = [f"{r.config.label} {r.scores[task_name]['main_score']:.4f}" for r in results
                   if r.config.baseline and task_name in r.scores]
        parts.append("\n".join(lines) + (f"\n\nTrained baseline(s): {', '.join(trained)}." if trained else ""))
    return "\n\n".join(parts) + "\n"


def _rows(results: Sequence[ConfigResult]) -> tuple[list[str], list[list[ConfigResult]]]:
    """Chart rows: one per configuration, or, when models are compared, one per configuration name
    holding every model's result (then one row per trained baseline)."""
    compared = models_compared(results)
    if compared is None:
        return [r.config.label for r in results], [[r] for r in results]
    models, names = compared
    rows = [[r for m in models for r in results if r.config.model == m and (r.config.name or r.config.label) == n]
            for n in names]
    others = [r for r in results if not r.config.model]
    return names + [r.config.label for r in others], rows + [[r] for r in others]


def chart(results: Sequence[ConfigResult], tasks: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Horizontal grouped bars, one panel per task. One bar per configuration; when several models
    are compared, one group per configuration with a bar (and colour) per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels, rows = _rows(results)
    compared = models_compared(results)
    series = compared[0] if compared else [None]
    colours = {m: f"C{i}" for i, m in enumerate(series)}
    width = 0.8 / len(series)
    bars_per_row = len(series)
    fig, axes = plt.subplots(1, len(tasks), squeeze=False, sharey=True,
                             figsize=(1.5 + 6.5 * len(tasks) ** 0.8, 1.5 + 0.16 * len(labels) * (1 + bars_per_row)))
    low = min([0.0, *(r.scores[t["name"]]["main_score"] for r in results for t in tasks if t["name"] in r.scores)])
    for ax, task in zip(axes[0], tasks):
        for y, row in enumerate(rows):
            for k, r in enumerate(row):
                value = r.scores.get(task["name"], {}).get("main_score", np.nan)
                offset = (k - (len(row) - 1) / 2) * width
                style = {"color": "0.6", "hatch": "//"} if r.config.baseline else {"color": colours.get(r.config.model, "C0")}
                bar = ax.barh(y + offset, value, height=width, **style)[0]
                if np.isfinite(value):
                    ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:.3f}", va="center", fontsize=7)
        ax.set_xlim(low - 0.05 if low < 0 else 0.0, 1.1)
        ax.axvline(0.0, color="black", linewidth=0.6)
        ax.set_xlabel(f"{task['name']}: {task['main_score']}", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    ax = axes[0][0]
    ax.set_yticks(np.arange(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    for tick, row in zip(ax.get_yticklabels(), rows):
        if row[0].config.baseline:  # trained models stand apart from the training-free methods
            tick.set_fontstyle("italic")
    ax.invert_yaxis()
    from matplotlib.patches import Patch

    handles = [Patch(color=colours[m], label=m) for m in series if m is not None]
    if any(r.config.baseline for r in results) and handles:
        handles.append(Patch(facecolor="0.6", hatch="//", label="trained baseline"))
    if handles:
        axes[0][-1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the legend stands right of the bars
    plt.close(fig)
    return path


def write(results: Sequence[ConfigResult], tasks: Sequence[dict[str, Any]], environment: dict[str, Any],
          mteb_files: Sequence[Path], out: Path, title: str) -> dict[str, Path]:
    """Write the three report files into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "results.md", "chart": out / CHART}
    report = to_json(results, tasks, environment, mteb_files, out)
    paths["json"].write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    compared = side_by_side(results, tasks)
    text = f"# {title}\n\n" + to_markdown(results, tasks) + (f"\n## Models side by side\n\n{compared}" if compared else "")
    paths["markdown"].write_text(text, encoding="utf-8")
    chart(results, tasks, paths["chart"], title)
    return paths
