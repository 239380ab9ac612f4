"""The export pipeline: load -> trace -> optimise -> convert -> check -> parity gate -> commit.

Everything is written into a hidden staging directory beside ``out`` and renamed into place only
after the parity gate passes, so an interrupted or failed export never leaves a directory that
looks like a valid artifact.

Memory: :func:`export_result` holds one copy of the weights at a time. The PyTorch reference runs
the gate's texts first and keeps only its outputs; the trace writes the weights to external data
as it goes (transposed on the way, not in memory); then the PyTorch weights are freed, before
onnxruntime opens any session (offline optimisation, calibration, the gate). Conversions read
and write one weight at a time (:func:`~kvembed.artifact.external_data.stream_initializers`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..artifact import ENCODER_TOKENIZER, MODEL, OPENVINO_MODEL, TOKENIZER, Manifest, file_records
from ..artifact.report import Advisory, ExportReport, HeldOut
from ..artifact.staging import OutputExistsError, check_output, claimed_workdir, staged, warn_leftovers  # noqa: F401  (the exporter's, re-exported)
from ..methods.sharing import output_names
from ..runtime.artifact import encoder_from_manifest
from .gate.certify import GATES, HELD_OUT_DECIDES, advisory_checks, held_out_decides, advisory_problem, certificate, gate_graph, gate_session, ran_precision
from .graph.checks import check_graph
from ..artifact.external_data import keep_external, settle_layout
from .graph.trace import ExportError, resolve_attention
from .graph.trace import trace as trace_graph
from .manifest import build_manifest, measured_ranges
from .source import load_embedder, source_record
from .graph.openvino_graph import write_openvino_graph
from .gate.parity import ParityReport, held_out_texts, model_gate_texts, parity_reports, reference_runs, run_parity
from .precision.convert import INT8_RECIPES, SameGraphError, convert
from .progress import Progress, StageClock, advance_of, silent
from .request import ExportRequest
from .graph.rewrites import optimize_with_onnxruntime, rms_norm_as_div
from .precision.smoothing import calibration_feeds
from ..errors import InvalidInput

#: the traced fp32 graph's work directory, beside the output (hidden: a dot first)
TRACE_PREFIX = ".kvembed-trace-"


class ParityError(ExportError):
    """The exported graph does not match the PyTorch reference within METHODS.md's tolerances, on the
    gate's texts or (``held_out``, where they decide: :data:`~kvembed.export.gate.certify.HELD_OUT_DECIDES`)
    on the held-out texts."""

    def __init__(self, report: ParityReport, output: str | None = None, backend: str | None = None,
                 held_out: bool = False) -> None:
        prefix = ("" if backend is None else f"on {backend}: ") + ("" if output is None else f"extra output {output!r}: ")
        prefix += "on the held-out texts (they decide for this precision): " if held_out else ""
        super().__init__(prefix + report.summary())
        self.report = report
        self.output = output
        self.backend = backend
        self.held_out = held_out


# -- output directory ---------------------------------------------------------------------------


def _guard_source(out: Path, embedder: Any) -> None:
    location = source_record(embedder).get("location")
    if location and Path(location).is_dir():
        src, dst = Path(location).resolve(), out.resolve()
        if dst == src or dst in src.parents:
            raise InvalidInput(f"output {str(out)!r} would replace the model folder {str(src)!r}")


# -- the exporter -------------------------------------------------------------------------------


@dataclass
class ExportResult:
    """What an export wrote: the artifact directory, its typed manifest (built once and written
    once, its ``parity`` the :class:`~kvembed.artifact.report.ExportReport`), and the file records."""

    path: Path
    manifest: Manifest
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def report(self) -> ExportReport:
        """The export's report, as the manifest stores it."""
        return self.manifest.parity

    @property
    def parity(self) -> ParityReport:
        """The gate's report on the main output, on the gate's first target."""
        return self.manifest.parity.gate


class Exporter:
    """Exports one loaded :class:`~kvembed.modeling.reference.TorchEmbedder`, tracing it at most once.

    ``write(out, precision)`` may be called several times (fp32, fp16, int8 from one trace).
    Use as a context manager, or call :meth:`close`, to delete the cached trace.

    ``release_weights=True`` runs the gate's reference before tracing and frees the PyTorch
    weights right after it (the model's modules stay, on the ``meta`` device), so that no
    onnxruntime session is ever built beside them; the embedder cannot embed afterwards.
    """

    def __init__(
        self,
        embedder: Any,
        *,
        opset: int | None = None,
        optimize: bool = True,
        progress: Progress | None = None,
        attention: str | None = None,
        release_weights: bool = False,
    ) -> None:
        attention, opset = resolve_attention(attention, opset)  # an entry: checked here
        self._start(embedder, attention, opset, optimize, progress, release_weights)

    @classmethod
    def of_request(cls, embedder: Any, request: ExportRequest, progress: Progress | None = None,
                   release_weights: bool = False) -> "Exporter":
        """An exporter tracing as ``request`` (already checked) says."""
        exporter = cls.__new__(cls)
        exporter._start(embedder, request.attention, request.opset, request.optimize, progress, release_weights,
                        held_out_decides=request.precision in HELD_OUT_DECIDES)
        return exporter

    def _start(self, embedder: Any, attention: str, opset: int, optimize: bool, progress: Progress | None,
               release_weights: bool, held_out_decides: bool = True) -> None:
        self.attention, self.opset = attention, opset
        #: whether a write may need the held-out texts that only decide (int8): the reference runs
        #: before the weights are released, so it runs them unless the one precision asked is known
        self.held_out_decides = held_out_decides
        self.release_weights = release_weights
        self.weights_released = False
        self.embedder = embedder
        self.optimize = optimize
        self.progress = progress or silent
        self._workdir: Path | None = None
        self._claim = contextlib.ExitStack()  # the trace directory's lock, held while it lives
        self._graph: dict[str, Any] | None = None
        self._reference_outputs: dict[Any, Any] = {}  # the traced embedder's parity outputs
        self._references: dict[str | None, Any] | None = None  # output label -> its single-method reference
        self._texts: dict[str, str] | None = None  # what the gate decides on (model_gate_texts)

    @property
    def progress(self) -> StageClock:
        """Where the exporter reports its stages, timed (:class:`StageClock`): the report's ``timings``."""
        return self._progress

    @progress.setter
    def progress(self, progress: Progress) -> None:
        self._progress = progress if isinstance(progress, StageClock) else StageClock(progress)

    def __enter__(self) -> "Exporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._workdir is not None:
            self._claim.close()  # removes the directory, then its lock
            self._workdir = None
            self._graph = None

    @property
    def traced_path(self) -> Path | None:
        return None if self._graph is None or self._workdir is None else self._workdir / MODEL

    def trace(self, workdir: Path | None = None) -> Path:
        """Trace (once) to an fp32 graph in a private work directory; returns its path."""
        if self._graph is not None and self._workdir is not None and (self._workdir / MODEL).exists():
            return self._workdir / MODEL
        self.close()
        self._workdir = self._claim.enter_context(claimed_workdir(Path(workdir or tempfile.gettempdir()), TRACE_PREFIX))
        path = self._workdir / MODEL
        try:
            if self.release_weights:
                self._run_references()
            self.progress("trace", f"tracing {self.embedder.method.name} with torch.onnx (dynamo)")
            graph = trace_graph(self.embedder, path, self.opset, attention=self.attention)
            if self.release_weights:
                self._release()
            optimizations = [{"name": name, "applied": True} for name in graph.pop("optimizations")]
            if self.optimize:
                self.progress("optimize", "onnxruntime basic graph optimisation (offline)")
                optimizations.append(optimize_with_onnxruntime(path))
                optimizations.append(rms_norm_as_div(path))
            graph["optimizations"] = optimizations
            self._graph = graph
        except BaseException:
            self.close()
            raise
        return path

    def _run_references(self) -> None:
        """Run every reference the gate compares against (one per output) on the gate's batches
        now, keeping only the outputs."""
        self.progress("reference", "running the PyTorch reference on the parity texts")
        if self._references is None:
            self._references = self.embedder.references()
        for label, reference in self._references.items():
            # the main output also on the held-out texts (beside the gate; deciding for int8):
            # their batches are their own, so each is cached as the held-out run will ask for it
            texts = {**self.gate_texts, **held_out_texts(self.held_out_decides)} if label is None else self.gate_texts
            reference_runs(reference, self._reference_outputs, texts=texts, outputs=output_names(label),
                           advance=advance_of(self.progress))

    @property
    def gate_texts(self) -> dict[str, str]:
        """The texts the gate decides on (one more past a sliding window: :func:`model_gate_texts`)."""
        if self._texts is None:
            self._texts = model_gate_texts(self.embedder)
        return self._texts

    def _release(self) -> None:
        """Free the PyTorch weights: every parameter and buffer moves to the ``meta`` device (no
        storage), and the trace's cycles are collected so nothing else keeps them."""
        self.progress("release", "freeing the PyTorch weights")
        self.embedder.model.to("meta")
        gc.collect()
        self.weights_released = True

    def write(
        self,
        out: str | os.PathLike[str],
        precision: str = "fp32",
        *,
        force: bool = False,
        reference: Any | None = None,
        reference_options: Mapping[str, Any] | None = None,
        keep_trace: bool = True,
        int8_recipe: str = "auto",
        certify_emulated: bool = False,
    ) -> ExportResult:
        """Write an artifact for ``precision`` to ``out`` after it passes the parity gate: an entry
        of its own (the values are checked here, into an :class:`ExportRequest`), then
        :meth:`write_request`.

        ``int8_recipe``: a name of :data:`~kvembed.export.precision.convert.INT8_RECIPES`, or ``"auto"``
        (the first of :data:`~kvembed.export.precision.convert.INT8_AUTO` that passes the gate); a recipe
        passes only where the held-out texts hold int8's bar too (:data:`HELD_OUT_DECIDES`).
        ``reference``, ``reference_options`` and ``keep_trace``: see :meth:`write_request`.
        """
        request = ExportRequest.checked(out, precision, force=force, int8_recipe=int8_recipe,
                                        certify_emulated=certify_emulated, attention=self.attention, opset=self.opset,
                                        reference_options=reference_options)
        return self.write_request(request, reference=reference, keep_trace=keep_trace)

    def write_request(self, request: ExportRequest, *, reference: Any | None = None, keep_trace: bool = True) -> ExportResult:
        """Write the artifact ``request`` (checked where it entered) asks for, after it passes the
        parity gate.

        The gate runs where :data:`~kvembed.export.gate.certify.GATES` says (bf16: OpenVINO under the
        bf16 hint and onnxruntime at fp32; refused on a CPU without BF16 unless ``certify_emulated``),
        and each pass is recorded in the manifest's ``certified`` list.

        ``reference`` (a TorchEmbedder) or the request's ``reference_options`` (method options for a
        second reference built from the same model) replace the gate's reference; the default is the
        embedder that was traced. They exist to prove the gate catches a wrong graph.
        ``keep_trace=False`` moves the traced fp32 graph instead of copying it (last write).
        """
        out, precision, reference_options = request.out, request.precision, request.reference_options
        _guard_source(out, self.embedder)
        embedder = self.embedder
        if reference is None and reference_options:
            options = {**dict(embedder.method.options), **dict(reference_options)}
            reference = load_embedder(
                embedder.source, embedder.method.name, max_length=embedder.max_length,
                padding_side=embedder.padding_side, **options,
            )
        reference = reference or embedder
        warn_leftovers(out, prefixes=(TRACE_PREFIX,))  # a killed export's gigabytes, seen before more are written
        with staged(out) as staging:
            traced = self.trace(workdir=out.parent)
            assert self._graph is not None
            embedder.tokenizer.save(str(staging / TOKENIZER), pretty=False)
            if embedder.encoder.context_tokenizer is not None:  # Causal2Vec's encoder tokenizer
                embedder.context.tokenizer.save(str(staging / ENCODER_TOKENIZER), pretty=False)
            recipes: list[str | None] = list(request.int8_recipes) if precision == "int8" else [None]
            calibration = calibration_feeds(embedder.encoder) if any(r and INT8_RECIPES[r].calibrated for r in recipes) else None
            tried: list[dict[str, Any]] = []
            model_path = staging / MODEL
            ranges: dict[str, Any] = {}  # calibration ranges, measured once for every recipe tried
            failure: ParityError | None = None
            for attempt, recipe in enumerate(recipes, 1):
                try:
                    conversion = self._convert(traced, model_path, precision, recipe, calibration, keep_trace, ranges)
                except SameGraphError as same:
                    tried.append({"recipe": recipe, "same_graph_as": same.same_as, "passed": False})
                    if attempt == len(recipes):  # the recipe it repeats was tried and failed
                        raise failure if failure is not None else ExportError(str(same))
                    self.progress("fallback", f"{same}; trying {recipes[attempt]}")
                    continue
                self.progress("check", "checking operators and layers")
                facts = check_graph(model_path, precision, embedder)
                # int8: OpenVINO's graph, its own beside the integer one or model.onnx itself
                graphs = {"openvino": OPENVINO_MODEL if (staging / OPENVINO_MODEL).exists() else MODEL} if precision == "int8" else {}
                draft = build_manifest(embedder, self._graph, self.opset, precision, facts, conversion, graphs)
                # another recipe to fall back to: a miss needs no full measurement, only a verdict
                stop = attempt < len(recipes)
                gates, held_out = self._gates(staging, draft, precision, reference, stop_at_miss=stop)
                reports = dict(gates[0][2])
                report = reports.pop(None)
                failure = None
                for target, _, gated in gates:
                    for label, checked in gated.items():
                        if failure is None and not checked.passed:
                            failure = ParityError(checked, label, None if target == gates[0][0] else target)
                if failure is None and held_out is not None and precision in HELD_OUT_DECIDES and not held_out.passed:
                    failure = ParityError(held_out, held_out=True)
                # the miss left something uncompared: batches of the output that missed, or the outputs after it
                stopped = failure is not None and (failure.report.stopped_early or len(gates[0][2]) < len(self._references or {}))
                if recipe is not None:
                    tried.append({"recipe": recipe, "worst_cosine": report.worst_cosine, "passed": failure is None,
                                  "stopped_early": stopped,
                                  "held_out_worst_cosine": None if held_out is None else held_out.worst_cosine})
                if failure is None:
                    break
                if attempt == len(recipes):
                    raise failure
                how = ", stopped at the first miss" if stopped else ""
                missed = "the held-out texts" if failure.held_out else "the gate"
                self.progress("fallback", f"int8 recipe {recipe} missed {missed} ({failure.report.worst_cosine:.5f}{how}); "
                                          f"trying {recipes[attempt]}")
                for stale in (model_path, model_path.with_name(model_path.name + ".data"), staging / OPENVINO_MODEL):
                    stale.unlink(missing_ok=True)
            advisory, advised = self._advise(staging, draft, precision, reference)
            parity = export_report(report, reports, gates, held_out, precision,
                                   None if reference is embedder else reference.method.to_dict(), advisory)
            deciding = held_out if precision in HELD_OUT_DECIDES else None  # run on the first target only
            certified = [certificate(target, ran, gated[None], held_out=deciding if index == 0 else None)
                         for index, (target, ran, gated) in enumerate(gates)]
            # the vectors' ranges (int8 / uint8 vectors are their levels), from the graph that passed
            self.progress("ranges", "measuring the vector ranges on the calibration texts")
            vector_ranges = measured_ranges(staging, draft)
            self.progress("write", f"writing {out}")
            graph = draft.to_dict()["graph"]
            if tried:
                graph["precision_conversion"]["recipes_tried"] = tried
            files = file_records(staging)
            parity = dataclasses.replace(parity, timings=self.progress.seconds())
            manifest = draft.updated(graph=graph, parity=parity.to_dict(), certified=certified + advised, files=files,
                                     vector_ranges=vector_ranges)
            manifest.write(staging)
        return ExportResult(out, manifest, files)

    # -- steps ------------------------------------------------------------------------------

    def _convert(self, traced: Path, model_path: Path, precision: str, recipe: str | None,
                 calibration: Any, keep_trace: bool, ranges: dict[str, Any]) -> dict[str, Any]:
        """Write the graph for ``precision`` (int8: by ``recipe``) as ``model_path``; what was done."""
        if precision in ("fp32", "bf16"):  # bf16: the fp32 graph, run at bf16 by OpenVINO
            self.progress("convert", f"{precision}: no conversion")
            _copy_graph(traced, model_path, move=not keep_trace)
            settle_layout(model_path)
            return {}
        self.progress("convert", f"converting to {precision}" + (f" (recipe {recipe})" if recipe else ""))
        conversion = convert(traced, model_path, precision, int8_recipe=recipe or "plain", calibration=calibration,
                             ranges=ranges, step=lambda detail: self.progress("convert", detail),
                             advance=advance_of(self.progress))
        if precision == "int8":  # the same weights as OpenVINO runs them fast: a graph file reading the same data
            keep_external(model_path)
            conversion["openvino_graph_matmuls"] = write_openvino_graph(model_path, model_path.with_name(OPENVINO_MODEL))
        return conversion

    def _advise(self, directory: Path, manifest: Manifest, precision: str,
                reference: Any) -> tuple[dict[str, Advisory], list[dict[str, Any]]]:
        """The advisory checks (:func:`advisory_checks`) of the artifact that passed its gate: the
        report's ``advisory`` (each check's figures, or why it was skipped) and a certificate for
        each pass; none fails."""
        advisory: dict[str, Advisory] = {}
        certified: list[dict[str, Any]] = []
        passed: dict[int, str] = {}  # group -> the alternative that certified
        for target, bar, group in advisory_checks(precision):
            problem = advisory_problem(target, manifest, passed.get(group))
            if problem is not None:
                advisory[target] = Advisory(skipped=problem)
                self.progress("parity", f"no {target} certificate: {problem}")
                continue
            try:
                [(_, ran, gated)], held_out = self._gates(directory, manifest, precision, reference, targets=((target, bar),))
            except InvalidInput as err:  # the backend could not open the graph here (e.g. no disk for a bf16 copy)
                advisory[target] = Advisory(skipped=str(err))
                self.progress("parity", f"no {target} certificate: {err}")
                continue
            graph = gate_graph(directory, manifest, target).name
            extra: dict[str, Any] = {"graph": graph}
            decides = held_out_decides(precision, advisory=True)
            advisory[target] = Advisory(report=gated[None], graph=graph,
                                        held_out=None if held_out is None else HeldOut.of(held_out, target, decides))
            if held_out is not None:  # what ran on the held-out texts (deciding: an advisory check)
                extra["held_out_worst_cosine"] = held_out.worst_cosine
            held = held_out is None or not decides or held_out.passed
            if all(r.passed for r in gated.values()) and held:
                certified.append(certificate(target, ran, gated[None], extra=extra, held_out=held_out if decides else None))
                passed[group] = target
            verdict = ("certified" if passed.get(group) == target else "below the bar: not certified" if not gated[None].passed
                       else "below the bar on the held-out texts: not certified")
            self.progress("parity", f"{target} ran {ran} on {graph}: worst cosine {gated[None].worst_cosine:.5f} ({verdict})")
        return advisory, certified

    def _gates(
        self, directory: Path, manifest: Manifest, precision: str, reference: Any,
        targets: tuple[tuple[str, str], ...] | None = None, stop_at_miss: bool = False,
    ) -> tuple[list[tuple[str, str, dict[str | None, ParityReport]]], ParityReport | None]:
        """``(target, precision it ran, reports)`` for each backend of the gate (``targets``,
        default :data:`GATES`), each on the graph file its backend runs: reports for the main output
        (key None) and each extra one, each against a reference that computes only that method in
        a forward pass of its own; and the main output on the held-out texts on the first backend,
        when its gate passed (None otherwise): they decide too where the precision is in
        :data:`HELD_OUT_DECIDES`, and ``stop_at_miss`` then stops them at their first miss as well.

        ``stop_at_miss`` (a recipe with another to fall back to): the gate stops at its first miss
        (:func:`~kvembed.export.gate.parity.parity_reports`): no later batch, output or backend runs,
        nor the held-out texts, once any output missed."""
        encoder = encoder_from_manifest(directory, manifest)
        if self._references is None:
            self._references = self.embedder.references()
        references = self._references if reference is self.embedder else {**self._references, None: reference}
        cache = self._reference_outputs if reference is self.embedder else None
        graph_precision = "fp32" if precision == "bf16" else precision
        gates = []
        held_out_report: ParityReport | None = None
        for target, bar in GATES[precision] if targets is None else targets:
            self.progress("parity", f"running the graph on {target} against PyTorch ({bar} bar)")
            session = gate_session(target, gate_graph(directory, manifest, target))
            try:
                reports = parity_reports(session, encoder, references, bar, cache=cache, advance=advance_of(self.progress),
                                         texts=self.gate_texts, stop_at_miss=stop_at_miss)
                gates.append((target, ran_precision(session, graph_precision), reports))
                missed = stop_at_miss and not all(r.passed for r in reports.values())
                if held_out_report is None and reports[None].passed and len(gates) == 1 and not missed:  # part of the parity stage
                    held_out_report = run_parity(session, encoder, references[None], bar, cache=cache,
                                                 texts=held_out_texts(precision in HELD_OUT_DECIDES),
                                                 stop_at_miss=stop_at_miss and precision in HELD_OUT_DECIDES)
            finally:
                del session
            if missed:
                break
        return gates, held_out_report


def export_report(report: ParityReport, reports: Mapping[str | None, ParityReport], gates: list[tuple[str, str, Any]],
                  held_out: ParityReport | None, precision: str, reference: Mapping[str, Any] | None,
                  advisory: Mapping[str, Advisory]) -> ExportReport:
    """The export's report: the gate's report on its first target, the extra outputs' (``also``),
    the other targets' (``gates``: bf16's onnxruntime at fp32), the held-out texts', the advisory
    checks', and in the gate's ``reference`` the method of a reference other than the exported one
    (which only tests of the gate use)."""
    if reference is not None:
        report = dataclasses.replace(report, reference={"note": "a different reference than the exported method was used",
                                                        "method": dict(reference)})
    return ExportReport(
        gate=report, target=gates[0][0], also={str(label): r for label, r in reports.items()},
        gates={target: gated[None] for target, _, gated in gates[1:]},
        held_out=None if held_out is None else HeldOut.of(held_out, gates[0][0], precision in HELD_OUT_DECIDES),
        advisory=dict(advisory),
    )


def _copy_graph(source: Path, target: Path, move: bool = False) -> None:
    transfer = os.replace if move else shutil.copyfile
    data = source.with_name(source.name + ".data")
    if data.exists():
        transfer(data, target.with_name(target.name + ".data"))
    transfer(source, target)


# -- public API ---------------------------------------------------------------------------------


def export(
    model: Any, method: str = "kv-embedding", out: str | os.PathLike[str] = "kvembed-artifact",
    precision: str = "fp32", **kwargs: Any,
) -> Path:
    """Export ``model`` (folder, alias or hub id) computing ``method`` to the directory ``out``.

    Keyword arguments are those of :func:`export_result` (``max_length``, ``opset``, ``attention``
    (``"fused"`` | ``"decomposed"``; unset: decomposed for an ``opset`` below 23, else fused where
    onnxruntime runs it), ``force``,
    ``padding_side``, ``optimize``, ``progress``) plus the method's options (``layers``, ``bias``,
    ``num_prefix``, ``prefix_rope``, ``pooling``, ``prompt``, ``wva``, ``tp_start``, ``tp_stop``,
    ``exit_layer``). Raises ValueError/TypeError/FileNotFoundError/OutputExistsError for bad input
    (before any heavy work where possible), :class:`ParityError` if the graph misses the
    tolerances and :class:`ExportError` if tracing fails; ``out`` is untouched in every failure.
    """
    return export_result(model, method, out, precision, **kwargs).path


def export_result(
    model: Any,
    method: str = "kv-embedding",
    out: str | os.PathLike[str] = "kvembed-artifact",
    precision: str = "fp32",
    *,
    max_length: int | None = None,
    opset: int | None = None,
    attention: str | None = None,
    force: bool = False,
    padding_side: str = "right",
    optimize: bool = True,
    progress: Progress | None = None,
    reference_options: Mapping[str, Any] | None = None,
    int8_recipe: str = "auto",
    check_memory: bool = True,
    certify_emulated: bool = False,
    **options: Any,
) -> ExportResult:
    """:func:`export`, returning the manifest and parity report too: the values are checked once,
    here (:meth:`ExportRequest.checked`), then :func:`run_export` runs the request."""
    request = ExportRequest.checked(
        out, precision, force=force, int8_recipe=int8_recipe, certify_emulated=certify_emulated, attention=attention,
        opset=opset, model=model, method=method, max_length=max_length, padding_side=padding_side, optimize=optimize,
        check_memory=check_memory, reference_options=reference_options, **options,
    )
    return run_export(request, progress)


def run_export(request: ExportRequest, progress: Progress | None = None) -> ExportResult:
    """Export as ``request`` (checked where it entered: :func:`export_result`, ``kvembed export``) says:
    the memory check, load, trace, convert, gate, write."""
    model, method, options = request.model, request.method, dict(request.options)
    if method == "st":  # an alias or hub id of a trained embedder: its whole folder, local
        from ..modeling.sources import sentence_transformers_folder

        model = sentence_transformers_folder(model)
    if request.check_memory:  # before any weight loads: refuse in one line rather than meet the OOM killer
        from .memory import export_memory_check

        export_memory_check(model, method, request.precision, **options)
    progress = StageClock(progress or silent)
    second = None
    if method == "st":  # a trained embedder's folder: its own library's vectors first, before kvembed's weights load
        from .gate.second_reference import compare, expected_vectors, summary

        progress("load", "sentence-transformers embeds the gate's core texts on the folder (the second reference)")
        second = expected_vectors(model, options)
    progress("load", f"loading {model} ({method})")
    embedder = load_embedder(model, method, max_length=request.max_length, padding_side=request.padding_side, **options)
    if second is not None:
        embedder.second_reference = compare(embedder, *second)
        progress("load", summary(embedder.second_reference))
    with Exporter.of_request(embedder, request, progress=progress, release_weights=True) as exporter:
        return exporter.write_request(request, keep_trace=False)


__all__ = [
    "ExportError",
    "ExportResult",
    "Exporter",
    "OutputExistsError",
    "ParityError",
    "check_output",
    "export",
    "export_result",
    "load_embedder",
    "run_export",
]
