"""``run_bench``: export (or take) artifacts, build the inputs, measure every cell, write reports.

A *cell* is one backend x precision x batch size x sequence length. Each backend/precision runs
in a fresh spawned process (:mod:`kvembed.bench.worker`) on the very same padded batches, built
here once from the artifact's own tokenizer, so the runtime and PyTorch rows compare like for
like and their outputs can be checked against each other.

The orchestrator imports torch only to export; with ``artifact=`` and ``backends=("runtime",)``
the whole benchmark is torch-free.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..artifact import MODEL, Manifest, check_intact, load_manifest
from ..runtime.artifact import encoder_from_manifest
from .measure import SUBJECTS, Timing, cosine_rows, default_subjects, served_problem
from .peak import gemm_peak, model_shape, probe_for
from .report import SCHEMA, machine_info, usable_cores, write_json, write_markdown, write_plots
from .worker import CellInput, WorkerSpec, run_isolated
from .workload import Batch, exact_rows, make_batch
from ..errors import InvalidInput, shown, with_hint

DEFAULT_MODEL = "stories260k"
DEFAULT_METHOD = "kv-embedding"
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
DEFAULT_PRECISIONS = ("fp32", "int8")
#: the subjects that time ``Embedder.encode`` end to end (``end_to_end``): the runtime's, in process
END_TO_END = ("runtime", "openvino", "auto")

#: ``--quick``: the demo model's grid, a few calls per cell; seconds on two cores. The lengths
#: clear every method's prompt (kv-embedding's is 46 tokens on the byte-level demo tokenizer).
QUICK: dict[str, Any] = {
    "precisions": ("fp32", "int8"),
    "batch_sizes": (1, 4),
    "seq_lens": (64, 128),
    "warmup": 1,
    "min_repeats": 5,
    "min_seconds": 0.1,
    "max_repeats": 50,
    "gemm_size": 1024,
}


@dataclass
class BenchConfig:
    """What to measure. ``None`` for model/method/precisions means the default (or, with
    ``artifact``, whatever the artifact fixes)."""

    out: Path
    model: str | None = None
    method: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """Method options (``layers``, ``bias``, ...) for the export."""
    artifact: Path | None = None
    precisions: tuple[str, ...] | None = None
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    seq_lens: tuple[int, ...] = (32, 128, 512)
    backends: tuple[str, ...] = field(default_factory=default_subjects)
    threads: int | None = None
    """Intra-op threads for both backends (default: every usable core)."""
    warmup: int = 1
    min_repeats: int = 5
    min_seconds: float = 1.0
    max_repeats: int = 1000
    rounds: int = 1
    """Times every backend's process runs, in turn: interleaved rounds, so that a ratio between
    backends (``speedup_vs_baseline``: the median of the rounds' ratios) is measured under the
    machine's same drift."""
    kind: str = "document"
    force: bool = False
    quick: bool = False
    gemm_size: int = 2048
    """The largest side of the square MatMuls that measure each GEMM peak (smaller sides are tried too)."""
    profile: bool = False
    """Also profile the runtime's largest cell per precision (onnxruntime profiler, by op type)."""
    end_to_end: bool = False
    """Time ``Embedder.encode`` of each cell's texts (tokenizer, batch plan, padding, the graph,
    normalisation) as a user calls it, instead of the graph call on the pre-built batch: where a
    call's fixed cost around the graph shows (short inputs). The in-process runtime subjects only."""
    seed: int = 0
    scenario: str | None = None
    """The scenario file's name this config came from (``--scenario``), with ``[smoke]`` when its smoke size ran."""

    @classmethod
    def create(cls, out: Path | str, quick: bool = False, **given: Any) -> "BenchConfig":
        """A config from user input: ``quick`` defaults first, then every value not None."""
        values = dict(QUICK) if quick else {}
        if given.get("artifact") is not None:
            values.pop("precisions", None)  # an artifact has its own
        values.update({name: value for name, value in given.items() if value is not None})
        if values.get("end_to_end") and "backends" not in values:  # the defaults that have an end-to-end path
            values["backends"] = tuple(subject for subject in default_subjects() if subject in END_TO_END)
        return cls(out=Path(out), quick=quick, **values)

    def check(self) -> Manifest | None:
        """Cheap validation (no model loading): ValueError naming the bad option. The artifact's
        manifest (read here, once: hand it to :func:`run_bench`), or None when there is no artifact."""

        for name, values in (("--batch-sizes", self.batch_sizes), ("--seq-lens", self.seq_lens)):
            if not values:
                raise InvalidInput(f"{name}: give at least one value")
            for value in values:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise InvalidInput(f"{name}: {value!r} is not a positive integer")
        if not self.backends:
            raise InvalidInput(f"--backends: give at least one of {', '.join(SUBJECTS)}")
        for backend in self.backends:
            if backend not in SUBJECTS:
                raise InvalidInput(with_hint(f"--backends: unknown backend {shown(backend)}; choose from {', '.join(SUBJECTS)}",
                                             backend, SUBJECTS))
        for precision in self.precisions or ():
            if precision not in PRECISIONS:
                raise InvalidInput(f"--precision: unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
        if self.precisions is not None and not self.precisions:
            raise InvalidInput("--precision: give at least one precision")
        if self.threads is not None and self.threads < 1:
            raise InvalidInput(f"--threads must be >= 1, got {self.threads}")
        if self.warmup < 0:
            raise InvalidInput(f"--warmup must be >= 0, got {self.warmup}")
        if self.min_repeats < 1:
            raise InvalidInput(f"--min-repeats must be >= 1, got {self.min_repeats}")
        if self.max_repeats < self.min_repeats:
            raise InvalidInput(f"max_repeats ({self.max_repeats}) must be >= --min-repeats ({self.min_repeats})")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise InvalidInput(f"--rounds must be a positive integer, got {self.rounds!r}")
        if self.min_seconds < 0:
            raise InvalidInput(f"--min-seconds must be >= 0, got {self.min_seconds}")
        if isinstance(self.gemm_size, bool) or not isinstance(self.gemm_size, int) or self.gemm_size < 1:
            raise InvalidInput(f"gemm_size must be a positive integer (the side of the GEMM probe), got {self.gemm_size!r}")
        if self.end_to_end:
            graph_only = [backend for backend in self.backends if backend not in END_TO_END]
            if graph_only:
                raise InvalidInput(f"end_to_end times Embedder.encode, which only {', '.join(END_TO_END)} run in process; "
                                   f"drop {', '.join(graph_only)} from the backends")
        if self.kind not in ("query", "document"):
            raise InvalidInput(f"--kind must be query or document, got {self.kind!r}")
        if self.artifact is not None:
            if self.model is not None or self.method is not None or self.options:
                raise InvalidInput("an artifact fixes its model, method and options; drop --model/--method/method options")
            if Path(self.out).expanduser().resolve() == Path(self.artifact).expanduser().resolve():
                raise InvalidInput("--out must not be the --artifact directory")
            manifest = load_manifest(Path(self.artifact).expanduser())  # not an artifact: one line before any progress bar
            problem = served_problem(manifest.method, self.kind) if "served" in self.backends else None
            if problem:
                raise InvalidInput(f"--backends served: {problem}")
            return manifest
        # model, method and options checked against config.json before any weights load
        from ..modeling.sources import preflight

        preflight(self.model or DEFAULT_MODEL, self.method or DEFAULT_METHOD, self.options or {})
        return None


class BenchProgress:
    """Progress sink of :func:`run_bench` (silent); the CLI's subclass draws a rich bar."""

    def stage(self, message: str) -> None:
        """A step before or between measurements (loading, exporting, ...)."""

    def start_cells(self, total: int) -> None:
        """Measurements start: ``total`` cells over all backends."""

    def cell_done(self, label: str) -> None:
        """One cell was measured."""

    def finish(self) -> None:
        """All measurements are done."""


# -- steps --------------------------------------------------------------------------------------


def check_lengths(seq_lens: Sequence[int], max_length: int, what: str) -> None:
    too_long = [n for n in seq_lens if n > max_length]
    if too_long:
        raise InvalidInput(f"--seq-lens: {too_long[0]} is longer than {what}'s max_length ({max_length})")


def export_artifacts(
    config: BenchConfig, directory: Path, precisions: Sequence[str], progress: BenchProgress
) -> tuple[dict[str, Path], dict[str, Any]]:
    """Export every precision from one trace; returns the artifact dirs and the model's config
    facts (heads, head_dim) for the FLOP count. Imports torch."""
    from ..export.core import Exporter, load_embedder

    model, method = config.model or DEFAULT_MODEL, config.method or DEFAULT_METHOD
    progress.stage(f"loading {model} ({method})")
    embedder = load_embedder(model, method, **config.options)
    check_lengths(config.seq_lens, int(embedder.max_length), "the model")
    hf_config = embedder.model.decoder.config
    facts = {
        "hidden_size": int(hf_config.hidden_size),
        "num_attention_heads": int(hf_config.num_attention_heads),
        "head_dim": int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads),
    }
    current = {"precision": precisions[0]}

    def relay(stage: str, detail: str) -> None:
        progress.stage(f"export {current['precision']}: {stage}: {detail}")

    artifacts: dict[str, Path] = {}
    with Exporter(embedder, progress=relay) as exporter:
        for index, precision in enumerate(precisions):
            current["precision"] = precision
            last = index == len(precisions) - 1
            artifacts[precision] = exporter.write(directory / precision, precision, force=True, keep_trace=not last).path
    del embedder, exporter
    gc.collect()
    return artifacts, facts


def build_batches(
    encoder: Any, config: BenchConfig, padding_side: str
) -> tuple[dict[tuple[int, int], Batch], dict[int, Any]]:
    """(seq_len, batch_size) -> padded batch; all batch sizes of one length share their rows."""
    batches: dict[tuple[int, int], Batch] = {}
    rows_by_len = {}
    for seq_len in config.seq_lens:
        rows = exact_rows(encoder, seq_len, max(config.batch_sizes), config.kind, config.seed)
        rows_by_len[seq_len] = rows
        for batch_size in config.batch_sizes:
            batches[(seq_len, batch_size)] = make_batch(encoder, rows, batch_size, padding_side)
    return batches, rows_by_len


def cell_key(seq_len: int, batch_size: int) -> str:
    return f"b{batch_size}-s{seq_len}"


def _smallest(artifacts: Mapping[str, Path]) -> Path:
    return min(artifacts.values(), key=lambda path: (Path(path) / MODEL).stat().st_size)


# -- the benchmark ------------------------------------------------------------------------------


def run_bench(config: BenchConfig, progress: BenchProgress | None = None, checked: Manifest | None = None) -> dict[str, Any]:
    """Run the benchmark ``config`` describes, write its reports into ``config.out``, return the
    results (the content of ``results.json``). ``checked``: what ``config.check()`` returned where
    the caller ran it (the artifact's manifest, not read again); else it runs here."""
    from ..artifact.staging import check_output

    progress = progress or BenchProgress()
    started = time.perf_counter()
    given_manifest = checked if checked is not None else config.check()
    out = check_output(config.out, config.force)
    threads = int(config.threads or usable_cores())
    notes: list[str] = []

    # 1. the artifacts
    torch_facts: dict[str, Any] | None = None
    if config.artifact is not None:
        assert given_manifest is not None
        manifest = given_manifest
        artifact = manifest.artifact_directory()
        given = manifest.precision
        if config.precisions is not None and tuple(config.precisions) != (given,):
            raise InvalidInput(f"the artifact is {given}; drop --precision (an artifact has one precision)")
        check_lengths(config.seq_lens, manifest.max_length, "the artifact")
        progress.stage(f"checking {artifact}")
        check_intact(manifest)
        out.mkdir(parents=True, exist_ok=True)
        artifacts = {given: artifact}
        manifests = {given: manifest}
    else:
        precisions = tuple(dict.fromkeys(config.precisions or DEFAULT_PRECISIONS))
        # no mkdir first: a bad model or option leaves no empty --out behind
        artifacts, torch_facts = export_artifacts(config, out / "artifacts", precisions, progress)
        manifests = {precision: load_manifest(path) for precision, path in artifacts.items()}
    main_precision = next(iter(artifacts))
    manifest = manifests[main_precision]

    # 2. the inputs, from the artifact's own tokenizer (torch-free)
    progress.stage("building inputs of exact token lengths")
    encoder = encoder_from_manifest(artifacts[main_precision], manifest)
    padding_side = manifest.padding_side
    batches, rows_by_len = build_batches(encoder, config, padding_side)
    for seq_len, rows in rows_by_len.items():
        if not rows.exact:
            got = sorted(set(rows.lengths))
            notes.append(
                f"seq {seq_len}: rows have {', '.join(map(str, got))} tokens (the prompt alone is "
                f"{len(encoder.encode_one('', config.kind).ids)} tokens; some counts cannot be hit)"
            )

    # 3. the machine's peak and the model's FLOPs
    progress.stage(f"measuring the fp32 GEMM peak (squares up to {config.gemm_size}, {threads} threads)")
    try:
        peak: dict[str, Any] | None = gemm_peak(threads, size=config.gemm_size)
    except ImportError as err:  # onnx is an export-extra dependency
        peak = None
        notes.append(f"fp32 GEMM peak not measured ({err})")
    shape = model_shape(manifest, _smallest(artifacts), torch_facts)

    # 4. the measurements, one process per backend/precision
    cells_in = [CellInput(cell_key(s, b), batch.inputs, rows_by_len[s].texts[:b], config.kind)
                for (s, b), batch in batches.items()]
    timing = dict(warmup=config.warmup, min_repeats=config.min_repeats, min_seconds=config.min_seconds,
                  max_repeats=config.max_repeats, end_to_end=config.end_to_end)
    specs = []
    if "runtime" in config.backends:
        for precision, path in artifacts.items():
            specs.append(WorkerSpec("runtime", str(path), threads, cells_in,
                                    label=f"runtime {precision}", **timing))
    if "openvino" in config.backends:  # on the fp32 artifact where there is one: bf16 is its fast path
        precision = "fp32" if "fp32" in artifacts else main_precision
        specs.append(WorkerSpec("openvino", str(artifacts[precision]), threads, cells_in,
                                label=f"openvino {precision}", **timing))
    for subject in ("auto", "served"):  # every artifact as Embedder.load(dir) runs it, in process and served
        if subject in config.backends:
            for precision, path in artifacts.items():
                specs.append(WorkerSpec(subject, str(path), threads, cells_in, label=f"{subject} {precision}", **timing))
    if "torch" in config.backends:
        specs.append(WorkerSpec("torch", str(artifacts[main_precision]), threads, cells_in,
                                label="torch fp32", **timing))
    progress.start_cells(len(specs) * len(cells_in) * config.rounds)
    runs: dict[str, list[dict[str, Any]]] = {spec.label: [] for spec in specs}
    for turn in range(config.rounds):
        for spec in specs:
            label = spec.label if config.rounds == 1 else f"{spec.label} (round {turn + 1}/{config.rounds})"
            progress.stage(f"{label}: loading")

            def on_event(kind: str, payload: Any, label: str = label) -> None:
                if kind == "cell":
                    progress.cell_done(f"{label} {payload}")
                elif kind == "loaded":
                    progress.stage(f"{label}: loaded in {payload['load_seconds']:.1f}s, measuring")

            runs[spec.label].append(run_isolated(spec, on_event))
    processes = [merge_rounds(done) for done in runs.values()]
    progress.finish()
    profiles: dict[str, Any] = {}
    if config.profile and "runtime" in config.backends:
        from .profile import op_breakdown

        largest = max(batches, key=lambda key: (key[0] * key[1], key))
        for precision, path in artifacts.items():
            progress.stage(f"profiling runtime {precision} at {cell_key(*largest)}")
            profiles[precision] = {"cell": cell_key(*largest),
                                   **op_breakdown(Path(path) / MODEL, batches[largest].inputs, threads)}
    floors: dict[str, float] = {}
    if config.profile and "fp32" in artifacts:
        from .profile import weight_gemm_floors

        progress.stage("timing the fp32 weight GEMMs alone at each cell's padded tokens")
        padded = {key: batch.batch_size * batch.width for key, batch in batches.items()}
        timed = weight_gemm_floors(Path(artifacts["fp32"]) / MODEL, padded.values(), threads,
                                   warmup=config.warmup, min_repeats=config.min_repeats,
                                   min_seconds=config.min_seconds, max_repeats=config.max_repeats)
        floors = {cell_key(*key): timed[n] for key, n in padded.items()}

    # 5. the peak of every other arithmetic the cells ran, then cells, comparisons, reports
    peaks = {"onnxruntime fp32": peak} if peak is not None else {}
    for process in processes:  # the arithmetic it ran: its backend, precision, and whether the graph is weight-only
        ran = manifests.get(process["precision"].partition("/")[0])
        process["probe"] = probe_for(process["backend"], process["precision"], ran is not None and ran.graph.weight_only)
    for probe in sorted({p["probe"] for p in processes} - set(peaks)):
        progress.stage(f"measuring the {probe} GEMM peak (squares up to {config.gemm_size}, {threads} threads)")
        try:
            peaks[probe] = gemm_peak(threads, size=config.gemm_size, probe=probe)
        except (ImportError, RuntimeError) as err:  # openvino absent or refusing a hint
            notes.append(f"{probe} GEMM peak not measured ({type(err).__name__}: {err})")
    cells = assemble_cells(processes, batches, shape, peaks, config.warmup)
    for cell in cells:  # the same cell's fp32 weight GEMMs alone (--profile), else None
        cell["weight_gemms_ms"] = floors.get(cell_key(cell["seq_len"], cell["batch_size"]))
    from .report import noisy_note

    noisy = noisy_note(cells)
    if noisy:
        notes.append(noisy)
    plot_seq = sorted(config.seq_lens)[len(config.seq_lens) // 2]
    plot_batch = max(config.batch_sizes)
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "machine": machine_info(threads),
        "setup": {
            "scenario": config.scenario,
            "model": config.model or manifest.source.model or DEFAULT_MODEL,
            "method": manifest.method.name,
            "method_options": dict(manifest.method.options),
            "kind": config.kind,
            "precisions": list(artifacts),
            "batch_sizes": list(config.batch_sizes),
            "seq_lens": list(config.seq_lens),
            "backends": list(config.backends),
            "threads": threads,
            "warmup": config.warmup,
            "min_repeats": config.min_repeats,
            "min_seconds": config.min_seconds,
            "max_repeats": config.max_repeats,
            "rounds": config.rounds,
            "end_to_end": config.end_to_end,
            "quick": config.quick,
            "exported": config.artifact is None,
            "torch_precision": "fp32",
            "baseline": baseline_of(processes),
        },
        "artifacts": {precision: str(path) for precision, path in artifacts.items()},
        "model": {
            **shape.to_dict(),
            "dim": manifest.dim,
            "max_length": manifest.max_length,
            "source": dict(manifest.source.raw),
        },
        "peak": peak,
        "peaks": peaks,
        "processes": [{k: v for k, v in p.items() if k != "cells"} for p in processes],
        "workload": {
            str(seq_len): {"lengths": list(rows.lengths), "exact": rows.exact}
            for seq_len, rows in rows_by_len.items()
        },
        "plots": {"seq_len": plot_seq, "batch_size": plot_batch, "files": {}},
        "notes": notes,
        "cells": cells,
        "profile": profiles,
    }
    progress.stage("writing reports")
    results["plots"]["files"] = write_plots(results, out)
    if not results["plots"]["files"]:
        notes.append("plots skipped: matplotlib is not installed")
    results["seconds"] = time.perf_counter() - started
    write_json(results, out)
    write_markdown(results, out)
    return results


def merge_rounds(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One backend's processes, a round each, as one: every round's samples of a cell in turn
    (``rounds_s``: each round's median), the highest peak, the first round's outputs and load."""
    first = dict(runs[0])
    first["cells"] = {
        key: {**cell, "samples": [s for run in runs for s in run["cells"][key]["samples"]],
              "rounds_s": [float(np.median(run["cells"][key]["samples"])) for run in runs]}
        for key, cell in runs[0]["cells"].items()
    }
    peaks = [run["peak_rss_mb"] for run in runs if run["peak_rss_mb"] is not None]
    first["peak_rss_mb"] = max(peaks) if peaks else None
    first["load_seconds_rounds"] = [run["load_seconds"] for run in runs]
    return first


def baseline_of(processes: Sequence[Mapping[str, Any]]) -> str | None:
    """The label of the process every other cell is compared with: the PyTorch reference where it
    was timed, else onnxruntime fp32 (the artifact as users load it on the default provider), else none."""
    for wanted in ({"backend": "torch"}, {"backend": "runtime", "precision": "fp32"}):
        for process in processes:
            if all(process.get(k) == v for k, v in wanted.items()):
                return process["label"]
    return None


def assemble_cells(
    processes: Sequence[Mapping[str, Any]],
    batches: Mapping[tuple[int, int], Batch],
    shape: Any,
    peaks: Mapping[str, Mapping[str, Any]],
    warmup: int,
) -> list[dict[str, Any]]:
    """One JSON-ready dict per cell, with throughput, FLOP efficiency against the GEMM peak of the
    arithmetic it ran (``peaks``: probe -> :func:`~kvembed.bench.peak.gemm_peak`; ``peak_of``
    names it) and, for every cell but the baseline's (:func:`baseline_of`), cosine and speedup
    against the baseline's cell of the same batch."""
    cells: list[dict[str, Any]] = []
    labels: list[str] = []  # the process each cell came from, parallel to cells
    outputs: dict[tuple[str, str], Any] = {}
    for process in processes:
        for (seq_len, batch_size), batch in batches.items():
            key = cell_key(seq_len, batch_size)
            measured = process["cells"][key]
            timing = Timing(tuple(measured["samples"]), batch_size, batch.real_tokens, warmup)
            flops = shape.flops(batch.lengths)
            gflops = flops / (timing.mean_ms / 1e3) / 1e9
            summary = timing.to_dict()
            samples = summary.pop("samples_s")
            probe = process["probe"]
            peak = peaks.get(probe)
            cells.append({
                "backend": process["backend"],
                "precision": process["precision"],
                "batch_size": batch_size,
                "seq_len": seq_len,
                "tokens_per_row": batch.real_tokens / batch_size,
                "min_tokens_per_row": min(batch.lengths),
                "max_tokens_per_row": max(batch.lengths),
                "exact_length": all(n == seq_len for n in batch.lengths),
                "padded_width": batch.width,
                "real_tokens": batch.real_tokens,
                **summary,
                "peak_rss_mb": process["peak_rss_mb"],
                "load_rss_mb": process["load_rss_mb"],
                "flops_per_batch": flops,
                "gflops": gflops,
                "peak_of": probe if peak else None,
                "pct_of_peak": None if not peak else 100.0 * gflops / peak["gflops"],
                "baseline": None,
                "cosine_vs_baseline": None,
                "speedup_vs_baseline": None,
                "stages_ms": measured.get("stages_ms"),
                "samples_s": samples,
                "rounds_p50_ms": [1e3 * s for s in measured["rounds_s"]],
            })
            labels.append(process["label"])
            outputs[(process["label"], key)] = measured["output"]
    base = baseline_of(processes)
    if base is None:
        return cells
    base_rounds = {
        cell_key(c["seq_len"], c["batch_size"]): c["rounds_p50_ms"] for c, label in zip(cells, labels) if label == base
    }
    base_noisy = {cell_key(c["seq_len"], c["batch_size"]): c["noisy"] for c, label in zip(cells, labels) if label == base}
    for cell, label in zip(cells, labels):
        if label == base:
            continue
        key = cell_key(cell["seq_len"], cell["batch_size"])
        cell["baseline"] = base
        cell["cosine_vs_baseline"] = float(cosine_rows(outputs[(label, key)], outputs[(base, key)]).min())
        # the median of the rounds' ratios: each round's baseline and this backend ran in the same turn
        cell["speedup_vs_baseline"] = float(np.median([b / c for b, c in zip(base_rounds[key], cell["rounds_p50_ms"])]))
        cell["speedup_noisy"] = bool(cell["noisy"] or base_noisy[key])
    return cells


__all__ = ["QUICK", "BenchConfig", "BenchProgress", "assemble_cells", "merge_rounds", "run_bench"]
