"""Writing a benchmark's results: ``results.json``, ``results.md`` and two PNG plots.

Everything here works from the plain result dict that :func:`kvembed.bench.runner.run_bench`
builds, so reports can be regenerated from a saved ``results.json``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from ..artifact.staging import write_text_atomic

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
LATENCY_PLOT = "latency_vs_batch.png"
COST_PLOT = "cost_vs_seqlen.png"
SCHEMA = "kvembed-bench/1"


# -- machine ------------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what platform reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, which containers and taskset narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info(threads: int) -> dict[str, Any]:
    """Facts that make numbers comparable across runs; versions are read without importing."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "threads": int(threads),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in ("kvembed", "onnxruntime", "torch", "transformers", "numpy")},
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


# -- JSON ---------------------------------------------------------------------------------------


def write_json(results: Mapping[str, Any], out: Path) -> Path:
    return write_text_atomic(Path(out) / RESULTS_JSON, json.dumps(results, indent=2, ensure_ascii=False) + "\n")


# -- Markdown -----------------------------------------------------------------------------------

COLUMNS = (
    "backend", "precision", "batch", "seq", "tokens/row", "p50 ms", "p95 ms", "p99 ms", "texts/s",
    "tokens/s", "peak RSS MB", "GFLOP/s", "% of peak", "cv", "cos vs baseline", "speedup vs baseline",
)


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def _cv(cell: Mapping[str, Any]) -> str:
    cv = cell.get("cv")
    if cv is None:
        return "-"
    return f"{100 * cv:.0f}%" + (" noisy" if cell.get("noisy") else "")


def noisy_note(cells: Sequence[Mapping[str, Any]]) -> str | None:
    """A warning line when some cells' repeats varied more than NOISY_CV, else None."""
    from .measure import NOISY_CV

    noisy = [c for c in cells if c.get("noisy")]
    if not noisy:
        return None
    return (
        f"{len(noisy)} of {len(cells)} cells are noisy (their repeats vary by more than {100 * NOISY_CV:.0f}%, "
        "coefficient of variation): the machine was busy, so their latencies and any speedup marked (noisy) "
        "are unreliable; rerun on a quiet machine or raise --min-seconds"
    )


def baseline_words(label: str | None) -> str:
    """What results.md calls the baseline (``setup.baseline``)."""
    if label is None:
        return "none (neither torch nor runtime fp32 was timed), so no row has a cosine or speedup"
    return f"`{label}`" + (" (the PyTorch reference)" if label.startswith("torch") else
                           " (no torch row was timed: onnxruntime fp32, the artifact as users load it)")


def table_rows(cells: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for cell in cells:
        cosine = cell.get("cosine_vs_baseline")
        speedup = cell.get("speedup_vs_baseline")
        rows.append([
            cell["backend"], cell["precision"], str(cell["batch_size"]), str(cell["seq_len"]),
            _num(cell["tokens_per_row"], 1), _num(cell["p50_ms"], 3), _num(cell["p95_ms"], 3),
            _num(cell["p99_ms"], 3), _num(cell["texts_per_s"], 1), _num(cell["tokens_per_s"], 0),
            _num(cell["peak_rss_mb"], 0), _num(cell.get("gflops"), 2), _num(cell.get("pct_of_peak"), 1),
            _cv(cell), "-" if cosine is None else f"{cosine:.6f}",
            "-" if speedup is None else f"{speedup:.2f}x" + (" (noisy)" if cell.get("speedup_noisy") else ""),
        ])
    return rows


#: operator types listed per profile in results.md (all of them are in results.json)
PROFILE_ROWS = 12


def markdown_table(cells: Sequence[Mapping[str, Any]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in table_rows(cells))
    return "\n".join(lines)


def markdown(results: Mapping[str, Any]) -> str:
    """The human-readable report: what ran where, the table, and how to read it."""
    machine, setup, model = results["machine"], results["setup"], results["model"]
    peaks = results.get("peaks") or ({"onnxruntime fp32": results["peak"]} if results.get("peak") else {})
    lines = [
        f"# kvembed bench: {setup['method']} on {setup['model']}",
        "",
        f"- machine: {machine['cpu']}, {machine['usable_cores']} usable cores, {machine['threads']} threads, "
        f"onnxruntime {machine['versions'].get('onnxruntime')}, torch {machine['versions'].get('torch')}, "
        f"{machine['date_utc']}",
        f"- model: {model['matmul_params']:,} matmul weights, {model['layers_run']} decoder layers run, "
        f"attention width {model['attention_width']}",
        "- GEMM peaks: " + ("; ".join(f"{name} {p['gflops']:.1f} GFLOP/s ({p['how']})" for name, p in peaks.items())
                            or "not measured"),
        "- each call: " + ("Embedder.encode of the cell's texts, end to end (tokenizer, batching, padding, the graph, "
                           "normalisation)" if setup.get("end_to_end") else "the graph on the cell's pre-built padded batch"),
        f"- timing per cell: one untimed check call (its output is compared across backends), "
        f"{setup['warmup']} warm-up call(s), then at least {setup['min_repeats']} timed calls and "
        f"{setup['min_seconds']} s of them (at most {setup['max_repeats']} calls)",
        "- artifacts: " + ", ".join(f"{p} `{path}`" for p, path in results["artifacts"].items()),
        "",
        markdown_table(results["cells"]),
        "",
        "Notes:",
        "",
        "- The torch backend is the PyTorch reference in fp32 (it has no int8/fp16 variant). The baseline is "
        f"{baseline_words(setup.get('baseline'))}: every other row's cosine and speedup compare with its row of "
        "the same batch and length.",
        "- runtime = onnxruntime's CPU provider; openvino = the runtime with provider='openvino' on the fp32 "
        "artifact, its precision written ARTIFACT/HINT (fp32/bf16: bf16 matmuls on CPUs with BF16; "
        "fp32/f32 where the CPU has none); auto = the runtime with provider='auto' (what Embedder.load runs), "
        "its precision written ARTIFACT/BACKEND (bf16/openvino-bf16 for a bf16 artifact certified on OpenVINO, "
        "on a CPU with BF16).",
        ("- Latency is one Embedder.encode call of the cell's texts, tokenisation included. " if setup.get("end_to_end")
         else "- Latency is one graph (or module) call on a pre-padded batch; tokenisation is not timed. ") +
        "texts/s = batch / mean latency, tokens/s = real tokens / mean latency; speedup = baseline p50 / the row's p50, "
        "the median over the rounds.",
        "- seq is the requested tokens per row, prompt and special tokens included; tokens/row is what "
        "was achieved (shorter when the prompt alone is longer, or the tokenizer skips that count).",
        "- GFLOP/s counts useful work (real tokens; attention as the full L x L square); % of peak is "
        "relative to the GEMM peak above of the library and arithmetic the row ran (results.json: peak_of).",
        "- Peak RSS is that backend's own process (each backend/precision runs in a fresh process).",
    ]
    for note in results.get("notes", []):
        lines.append(f"- {note}")
    for precision, profile in (results.get("profile") or {}).items():
        lines += ["", f"## Where the time goes: runtime {precision}, {profile['cell']} (onnxruntime profiler)", "",
                  f"Kernel time {profile['kernel_ms_per_run']:.1f} ms per call, over {profile['runs']} calls, "
                  "by operator type after onnxruntime's load-time fusions.", "",
                  "| op | ms per call | share | nodes |", "|---|---|---|---|"]
        lines += [f"| {op['op']} | {op['ms_per_run']:.2f} | {100 * op['share']:.1f}% | {op['nodes']} |"
                  for op in profile["ops"][:PROFILE_ROWS]]
    lines += stage_lines(results["cells"])
    lines += floor_lines(results["cells"])
    return "\n".join(lines) + "\n"


#: the end-to-end split's columns (each cell's ``stages_ms``)
STAGES = ("tokenizer", "graph", "around")


def cell_section(title: str, intro: str, columns: Sequence[str], cells: Iterable[Mapping[str, Any]],
                 values: Callable[[Mapping[str, Any]], Sequence[str]]) -> list[str]:
    """A results.md section of its own table, a row per cell (backend, precision, batch, seq, then
    ``values(cell)`` under ``columns``); empty when no cell is given."""
    cells = list(cells)
    if not cells:
        return []
    head = ["backend", "precision", "batch", "seq", *columns]
    lines = ["", f"## {title}", "", intro, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in cells:
        row = [str(cell["backend"]), str(cell["precision"]), str(cell["batch_size"]), str(cell["seq_len"]), *values(cell)]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def floor_lines(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """results.md's section on each cell against its fp32 weight GEMMs alone (``--profile``)."""
    return cell_section(
        "Against the fp32 weight GEMMs alone (onnxruntime)",
        "The graph's fp32 weight MatMuls alone at the cell's padded tokens, one onnxruntime call (median ms): "
        "what the call would cost if attention, norms and the rest were free. At few tokens it is reading "
        "every weight once. Each row's p50 as a multiple of it.",
        ("padded tokens", "weight GEMMs ms", "p50 ms", "p50 / weight GEMMs"),
        (c for c in cells if c.get("weight_gemms_ms")),
        lambda c: (str(c["batch_size"] * c["padded_width"]), f"{c['weight_gemms_ms']:.3f}", f"{c['p50_ms']:.3f}",
                   f"{c['p50_ms'] / c['weight_gemms_ms']:.2f}x"),
    )


def stage_lines(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """results.md's section on where an end-to-end call's time goes (empty without such cells)."""
    def values(cell: Mapping[str, Any]) -> list[str]:
        stages = cell["stages_ms"]
        share = stages["around"] / stages["total"] if stages["total"] > 0 else 0.0
        return [f"{stages['total']:.3f}", *(f"{stages[s]:.3f}" for s in STAGES), f"{100 * share:.1f}%"]

    return cell_section(
        "Where an end-to-end call's time goes",
        "Median ms per Embedder.encode call, over calls of its own after the timed ones: the tokenizer, "
        "the graph (every session run of the call), and around them (batch planning, padding, slicing, "
        "normalisation, the Python between).",
        ("total ms", *(f"{s} ms" for s in STAGES), "around share"),
        (c for c in cells if c.get("stages_ms")), values,
    )


def write_markdown(results: Mapping[str, Any], out: Path) -> Path:
    path = Path(out) / RESULTS_MD
    path.write_text(markdown(results), encoding="utf-8")
    return path


# -- plots --------------------------------------------------------------------------------------


def _series(cells: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for cell in cells:
        lines.setdefault(f"{cell['backend']} {cell['precision']}", []).append(cell)
    return lines


def _integer_ticks(axes: Any, values: Sequence[int]) -> None:
    """Log-log axes with the measured x values as plain tick labels."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xticks(list(values))
    axes.xaxis.set_major_formatter(ScalarFormatter())
    axes.xaxis.set_minor_formatter(NullFormatter())


def _line_plot(
    cells: Iterable[Mapping[str, Any]],
    x: Callable[[Mapping[str, Any]], float],
    y: Callable[[Mapping[str, Any]], float],
    ticks: Sequence[int],
    labels: tuple[str, str, str],
    path: Path,
) -> Path:
    """A line per backend/precision of ``y(cell)`` against ``x(cell)`` on log-log axes; ``labels`` are
    (x label, y label, title)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), dpi=110)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, series in _series(cells).items():
        series = sorted(series, key=x)
        axes.plot([x(c) for c in series], [y(c) for c in series], marker="o", label=label)
    _integer_ticks(axes, ticks)
    xlabel, ylabel, title = labels
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path


def plot_latency_vs_batch(cells: Sequence[Mapping[str, Any]], seq_len: int, path: Path) -> Path:
    """p50 latency against batch size at one sequence length, a line per backend/precision."""
    return _line_plot(
        [c for c in cells if c["seq_len"] == seq_len], lambda c: c["batch_size"], lambda c: c["p50_ms"],
        sorted({c["batch_size"] for c in cells}),
        ("batch size (texts)", "p50 latency per batch (ms)", f"latency vs batch size at {seq_len} tokens per text"), path,
    )


def plot_cost_vs_seqlen(cells: Sequence[Mapping[str, Any]], batch_size: int, path: Path) -> Path:
    """Milliseconds per text against achieved tokens per text at one batch size (log-log)."""
    chosen = [c for c in cells if c["batch_size"] == batch_size]
    return _line_plot(
        chosen, lambda c: c["tokens_per_row"], lambda c: c["p50_ms"] / c["batch_size"],
        sorted({round(c["tokens_per_row"]) for c in chosen}),
        ("tokens per text (prompt included)", "p50 ms per text", f"cost vs sequence length at batch size {batch_size}"), path,
    )


def write_plots(results: Mapping[str, Any], out: Path) -> dict[str, str]:
    """Both plots; ``{}`` with a note in ``results`` if matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return {}
    cells = results["cells"]
    plots = results["plots"]
    return {
        "latency_vs_batch": str(plot_latency_vs_batch(cells, plots["seq_len"], Path(out) / LATENCY_PLOT)),
        "cost_vs_seqlen": str(plot_cost_vs_seqlen(cells, plots["batch_size"], Path(out) / COST_PLOT)),
    }
