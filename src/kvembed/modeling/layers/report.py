"""``layers.json`` and ``layers.png``: the record of a layer selection."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .selection import LayerSelection


def write_json(selection: LayerSelection, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(selection.to_dict(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return path


def plot_curve(selection: LayerSelection, path: str | Path) -> Path:
    """The ID curve with the ignored early layers greyed and the chosen window shaded (Agg, PNG)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    L = selection.num_layers
    xs = list(range(L))
    ys = [v if math.isfinite(v) else float("nan") for v in selection.intrinsic_dimension]
    fig = Figure(figsize=(7.0, 4.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    start = math.floor(0.2 * L)
    if start > 0:
        ax.axvspan(-0.5, start - 0.5, color="0.85", label=f"ignored: layers < floor(0.2 L) = {start}")
    lo, hi = selection.layers[0], selection.layers[-1]
    ax.axvspan(lo - 0.5, hi + 0.5, color="tab:orange", alpha=0.3, label=f"selected R = {lo}..{hi}" if hi > lo else f"selected R = {{{lo}}}")
    ax.plot(xs, ys, marker="o", color="tab:blue", label="TwoNN intrinsic dimension")
    ax.plot([selection.l_star], [ys[selection.l_star]], marker="*", markersize=14, color="tab:red", linestyle="none", label=f"l* = {selection.l_star}")
    ax.set_xlabel("decoder layer (output of layer l)")
    ax.set_ylabel("intrinsic dimension (TwoNN)")
    ax.set_xlim(-0.5, L - 0.5)
    ax.set_xticks(xs if L <= 40 else list(range(0, L, max(1, L // 20))))
    ax.set_title(f"{selection.model or 'model'}: final-token ID over {selection.num_texts} texts", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def write_report(selection: LayerSelection, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``out_dir/layers.json`` and ``out_dir/layers.png`` (creating ``out_dir``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_json(selection, out / "layers.json"), plot_curve(selection, out / "layers.png")
