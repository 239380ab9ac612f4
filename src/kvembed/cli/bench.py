"""``kvembed bench``: measure an artifact (onnxruntime) against the PyTorch reference.

Importing this module loads only typer and rich (it is imported by every ``kvembed`` call).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional, Sequence

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import InvalidInput, shown, with_hint
from . import options as opt
from .status import Waits
from .tables import fitted_tables

console = Console()
errors = Console(stderr=True)

def parse_ints(option: str, text: str | None) -> tuple[int, ...] | None:
    """``"1,8,32"`` -> ``(1, 8, 32)``; anything but positive integers is an InvalidInput naming it."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise InvalidInput(f"{option}: give a comma-separated list of positive integers")
    values = []
    for item in items:
        if not item.isdigit() or int(item) < 1:
            raise InvalidInput(f"{option}: {item!r} is not a positive integer")
        values.append(int(item))
    return tuple(dict.fromkeys(values))


def parse_names(option: str, text: str | None, choices: Sequence[str]) -> tuple[str, ...] | None:
    """``"fp32,int8"`` -> ``("fp32", "int8")``, each checked against ``choices``."""
    if text is None:
        return None
    items = [item.strip().lower() for item in text.split(",") if item.strip()]
    if not items:
        raise InvalidInput(f"{option}: give a comma-separated list of {', '.join(choices)}")
    for item in items:
        if item not in choices:
            raise InvalidInput(with_hint(f"{option}: unknown value {shown(item)}; choose from {', '.join(choices)}", item, choices))
    return tuple(dict.fromkeys(items))


def print_cells(cells: Sequence[Any]) -> None:
    """The measured cells: results.md's table where it fits the console (a pipe's is 80 columns
    unless COLUMNS says otherwise), else stacked tables that fit it, every number whole (results.md
    in --out keeps the one wide table)."""
    from ..bench.report import COLUMNS, markdown_table, table_rows

    text = markdown_table(cells)
    if max(len(line) for line in text.splitlines()) <= console.width:
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        return
    keys = 4  # backend, precision, batch, seq: what identifies a cell
    rows = [[escape(cell) for cell in row] for row in table_rows(cells)]
    for table in fitted_tables("kvembed bench", COLUMNS[:keys], COLUMNS[keys:], rows, console.width):
        console.print(table)


def _progress_class() -> type:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..bench.runner import BenchProgress

    class RichProgress(BenchProgress):
        """Stage lines with elapsed time, and a progress bar over the measured cells."""

        def __init__(self) -> None:
            self.start = time.monotonic()
            self.bar = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=console, transient=False,
            )
            self.task: Any = None
            self.bar.start()

        def stage(self, message: str) -> None:
            self.bar.console.print(f"[dim]{time.monotonic() - self.start:6.1f}s[/] {escape(message)}", highlight=False, soft_wrap=True)

        def start_cells(self, total: int) -> None:
            self.task = self.bar.add_task("measuring", total=total)

        def cell_done(self, label: str) -> None:
            if self.task is not None:
                self.bar.update(self.task, advance=1, description=label)

        def finish(self) -> None:
            if self.task is not None:
                self.bar.update(self.task, description="measured")
            self.bar.stop()

    return RichProgress


@opt.method_flags
def bench_command(
    out: Path = typer.Option(..., "--out", "-o", help="Directory for results.json, results.md, plots and exported artifacts."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model folder, alias or hub id to export (default: stories260k)."),
    method: Optional[str] = typer.Option(None, "--method", help="Embedding method to export (default: kv-embedding)."),
    options: opt.MethodOptions = opt.METHOD_FLAGS,
    artifact: Optional[Path] = typer.Option(None, "--artifact", help="Benchmark this exported artifact (no export; its precision only)."),
    precision: Optional[str] = typer.Option(None, "--precision", help="Comma list of fp32, fp16, bf16, int8 (default: fp32,int8)."),
    batch_sizes: Optional[str] = typer.Option(None, "--batch-sizes", help="Comma list (default: 1,8,32; --quick: 1,4)."),
    seq_lens: Optional[str] = typer.Option(None, "--seq-lens", help="Tokens per text, prompt included (default: 32,128,512; --quick: 64,128)."),
    backends: Optional[str] = typer.Option(None, "--backends", help="Comma list of runtime (onnxruntime), torch, openvino, auto (provider auto: what Embedder.load(dir) runs; a certified bf16 artifact on OpenVINO bf16), served (kvembed serve of the artifact, each row its own concurrent request; raw-text methods) (default: runtime and torch, plus openvino where installed)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="Intra-op threads of both backends (default: all usable cores)."),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Untimed calls per cell (default: 1)."),
    min_repeats: Optional[int] = typer.Option(None, "--min-repeats", help="Timed calls per cell, at least (default: 5)."),
    min_seconds: Optional[float] = typer.Option(None, "--min-seconds", help="Timed seconds per cell, at least (default: 1.0; --quick: 0.1)."),
    max_repeats: Optional[int] = typer.Option(None, "--max-repeats", help="Timed calls per cell, at most (default: 1000; --quick: 50)."),
    rounds: Optional[int] = typer.Option(None, "--rounds", help="Times every backend's process runs, in turn, so ratios between backends share the machine's drift (default: 1)."),
    kind: Optional[str] = typer.Option(None, "--kind", help="query or document: which prompt the inputs use (default: document)."),
    scenario: Optional[Path] = typer.Option(None, "--scenario", help="A scenario file (TOML: BenchConfig's keys, e.g. benchmarks/scenarios/*.toml); flags given beside it override its values."),
    smoke: bool = typer.Option(False, "--smoke", help="With --scenario: its [smoke] size (the demo model, seconds), as CI runs every scenario."),
    quick: bool = typer.Option(False, "--quick", help="Small grid and few calls on the demo model: a smoke run of a few minutes on 2 cores (export + parity gate, then a fresh process per backend)."),
    profile: bool = typer.Option(False, "--profile", help="Also profile the runtime's largest cell per precision (onnxruntime profiler, time by op type)."),
    end_to_end: bool = typer.Option(False, "--end-to-end", help="Time Embedder.encode of each cell's texts (tokenizer, batching, padding, the graph, normalisation), as a user calls it, instead of the graph call alone; backends runtime, openvino and auto."),
    force: bool = typer.Option(False, "--force", help="Write into a non-empty --out (replacing earlier results)."),
) -> None:
    """Benchmark an artifact (onnxruntime) against the PyTorch reference on identical inputs.

    Per backend, precision, batch size and length: p50/p95/p99 ms, texts/s, tokens/s, peak RSS.
    Writes results.json, results.md and PNG plots into --out.

    kvembed bench --quick --out bench/ | kvembed bench --model DIR --method va --out bench/
    | kvembed bench --artifact ARTIFACT_DIR --backends runtime --out bench/
    | kvembed bench --scenario benchmarks/scenarios/short-inputs.toml --out bench/
    """

    def configure() -> Any:
        from ..bench.runner import PRECISIONS, BenchConfig
        from ..bench.measure import SUBJECTS
        from ..bench.scenario import read_scenario, scenario_values

        if smoke and scenario is None:
            raise InvalidInput("--smoke runs a scenario's [smoke] size: add --scenario FILE")
        if scenario is not None and quick:
            raise InvalidInput("--quick is its own small grid; a scenario has its [smoke] size: drop --quick or --scenario")
        given = dict(
            model=model, method=method, options=options or None, artifact=artifact,
            precisions=parse_names("--precision", precision, PRECISIONS),
            batch_sizes=parse_ints("--batch-sizes", batch_sizes), seq_lens=parse_ints("--seq-lens", seq_lens),
            backends=parse_names("--backends", backends, SUBJECTS), threads=threads, warmup=warmup,
            min_repeats=min_repeats, min_seconds=min_seconds, max_repeats=max_repeats, rounds=rounds, kind=kind,
            profile=profile or None, end_to_end=end_to_end or None,
        )
        base = scenario_values(read_scenario(scenario), smoke) if scenario is not None else {}
        # an artifact given here fixes what the scenario's model, method and precisions said; a model replaces its artifact
        for key in (("artifact", "model", "method", "options", "precisions") if artifact is not None else
                    ("artifact", "model") if model is not None else ()):
            base.pop(key, None)
        if scenario is not None:
            base["scenario"] = f"{scenario.stem}{' [smoke]' if smoke else ''}"
            named = base.get("artifact")
            try:
                missing = named is not None and not Path(named).is_dir()  # a path the scenario names, relative to where it runs
            except OSError:  # a name the OS refuses (too long)
                missing = True
            if missing:
                raise InvalidInput(f"scenario {shown(scenario.stem)} benchmarks the artifact {shown(str(named))}, which is not here: "
                                   "give --artifact DIR (its description says how to make one)")
        config = BenchConfig.create(out, quick=quick, force=force, **{**base, **{k: v for k, v in given.items() if v is not None}})
        checked = config.check()
        from ..export.core import check_output

        check_output(config.out, config.force)
        return config, checked

    config, checked = configure()
    started = time.monotonic()

    def job() -> Any:
        import logging
        import warnings

        from ..bench.runner import run_bench

        logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
        progress = _progress_class()()
        try:  # steps announced below print as stage lines above the progress bar (one live display)
            with warnings.catch_warnings(), Waits(spinner=False, show=progress.stage):
                warnings.simplefilter("ignore")
                return run_bench(config, progress, checked)
        finally:
            progress.bar.stop()

    results = job()
    from ..bench.report import COST_PLOT, LATENCY_PLOT, RESULTS_JSON, RESULTS_MD

    print_cells(results["cells"])
    for note in results["notes"]:
        console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    written = [RESULTS_JSON, RESULTS_MD] + ([LATENCY_PLOT, COST_PLOT] if results["plots"]["files"] else [])
    base = Path(config.out)
    console.print("wrote " + ", ".join(str(base / name) for name in written), markup=False, highlight=False, soft_wrap=True)
    if results["setup"]["exported"]:
        console.print(f"artifacts in {base / 'artifacts'}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"benchmark took {time.monotonic() - started:.1f}s", highlight=False)
