"""``kvembed-layers``: choose kv-embedding's re-routing layers by intrinsic dimension.

Writes ``OUT/layers.json`` (the per-layer TwoNN ID of the final-token states, the chosen set
and how it was obtained) and ``OUT/layers.png`` (the curve with the chosen window shaded).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional

from ..extras import install_hint

try:
    import typer
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table
except ImportError as err:  # pragma: no cover - only without the cli extra
    raise SystemExit(f"kvembed-layers needs typer and rich: {install_hint('cli')} ({err})")

from ..errors import InvalidInput
from .support import DEBUG_HELP, guard_app, run_app

app = typer.Typer(add_completion=False, help=__doc__)
console = Console()
errors = Console(stderr=True)

@app.command(epilog=DEBUG_HELP)
def layers(
    model: str = typer.Option(..., "--model", "-m", help="Model folder, alias (qwen3-4b, stories260k) or hub id."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder for layers.json and layers.png."),
    calibration: Optional[Path] = typer.Option(
        None, "--calibration", "-c", help="Text file, one text per line (default: the built-in 1,000 sentences)."
    ),
    num_texts: int = typer.Option(1000, "--num-texts", "-n", help="Use the first N distinct texts (>= 20)."),
    prompt: str = typer.Option(
        "document", "--prompt", help="Inputs: document / query (kv-embedding's prompts), raw, or a template with {text}."
    ),
    batch_size: int = typer.Option(32, "--batch-size", help="Texts per forward pass."),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="Truncate inputs to this many tokens."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or table."),
) -> None:
    """Compute the per-layer intrinsic dimension of MODEL and pick kv-embedding's re-routing set."""
    from ..modeling.layers.report import write_report
    from ..modeling.layers.selection import compute_layer_selection

    started = time.perf_counter()
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=errors, transient=True, disable=quiet,
    )
    tasks: dict[str, Any] = {}

    def report(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            label = "forward passes (texts)" if stage == "forward" else "TwoNN per layer"
            tasks[stage] = progress.add_task(label, total=total)
        progress.update(tasks[stage], completed=done)

    def run() -> Any:
        if batch_size < 1:
            raise InvalidInput(f"--batch-size must be >= 1, got {batch_size}")
        from ..modeling.sources import locate_model

        locate_model(model)  # a wrong --model fails before any progress bar
        with progress:
            selection = compute_layer_selection(
                model, calibration, num_texts, prompt=prompt, batch_size=batch_size, max_length=max_length,
                progress=report,
            )
        return selection, write_report(selection, out)

    selection, (json_path, png_path) = run()
    if selection.num_texts < num_texts and not quiet:
        source = calibration or "the built-in set"
        errors.print(f"note: {source} has {selection.num_texts} distinct non-empty texts; used all of them", highlight=False)
    if not quiet:
        table = Table(title=f"{model}: TwoNN intrinsic dimension of the final token ({selection.num_texts} texts)")
        table.add_column("layer", justify="right")
        table.add_column("ID", justify="right")
        table.add_column("")
        start = int(0.2 * selection.num_layers)
        for layer, value in enumerate(selection.intrinsic_dimension):
            note = "l*" if layer == selection.l_star else ("selected" if layer in selection.layers else "")
            if layer < start:
                note = "ignored (first 20%)"
            table.add_row(str(layer), f"{value:.2f}", note, style="bold" if layer in selection.layers else None)
        console.print(table)
    spec = selection.to_dict()["layers_spec"]
    console.print(f"layers: {spec}  (--layers {spec})", highlight=False)
    console.print(f"wrote {json_path} and {png_path} in {time.perf_counter() - started:.1f} s", highlight=False)


guard_app(app)


def main() -> None:
    run_app(app, prog_name="kvembed-layers")


if __name__ == "__main__":
    sys.exit(main())
