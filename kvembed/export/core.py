"""The export pipeline: load -> trace -> optimise -> convert -> check -> parity gate -> commit.

Everything is written into a hidden staging directory beside ``out`` and renamed into place only
after the parity gate passes, so an interrupted or failed export never leaves a directory that
looks like a valid artifact.

Memory: :func:`export_result` holds one copy of the weights at a time. The PyTorch reference runs
the gate's texts first and keeps only its outputs; the trace writes the weights to external data
as it goes (transposed on the way, not in memory); then the PyTorch weights are freed, before
onnxruntime opens any session (offline optimisation, calibration, the gate). Conversions read
and write one weight at a time (:func:`~kvembed.export.graph.stream_initializers`).
"""

from __future__ import annotations

import datetime as _dt
import gc
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from .. import __version__
from ..runtime.artifact import (
    ENCODER_TOKENIZER, MODEL, SCHEMA_VERSION, TOKENIZER, check_files, encoder_from_manifest, file_records,
)
from ..runtime.artifact import read_manifest, write_manifest
from ..staging import OutputExistsError, check_output, staged  # noqa: F401  (the exporter's, re-exported)
from ..methods.sharing import AlsoRequest, output_names
from .graph import DATA_FILE, ExportError, decoder_layers_in_graph, input_axes, input_names, optimize_with_onnxruntime
from .graph import resolve_attention
from .graph import rms_norm_as_div, settle_layout, weight_matmuls
from .graph import trace as trace_graph
from .ops import ALLOWED_OPS, non_portable_ops, op_types
from .parity import ParityReport, reference_runs, run_parity
from .precision import INT8_RECIPES, SameGraphError, check_int8_recipe, check_precision, convert, int8_plan
from .smoothing import calibration_feeds

Progress = Callable[[str, str], None]

#: pipeline stages, in order, as reported to ``progress(stage, detail)`` ("reference" and "release"
#: only where the exporter frees the PyTorch weights after the trace: :func:`export_result`)
STAGES = ("load", "reference", "trace", "release", "optimize", "convert", "check", "parity", "write")


class ParityError(ExportError):
    """The exported graph does not match the PyTorch reference within METHODS.md's tolerances."""

    def __init__(self, report: ParityReport, output: str | None = None) -> None:
        prefix = "" if output is None else f"extra output {output!r}: "
        super().__init__(prefix + report.summary())
        self.report = report
        self.output = output


def _silent(stage: str, detail: str) -> None:
    return None


def advance_of(progress: Progress) -> Callable[[int, int], None] | None:
    """``progress.advance(done, total)`` where the progress display has one (the CLI's shows the
    time left of a long stage), else None."""
    return getattr(progress, "advance", None)


# -- loading ------------------------------------------------------------------------------------


def load_embedder(
    model: Any,
    method: str = "kv-embedding",
    *,
    max_length: int | None = None,
    padding_side: str = "right",
    **options: Any,
) -> Any:
    """A :class:`~kvembed.reference.TorchEmbedder` (fp32) for ``model`` and ``method``."""
    from transformers.utils import logging as hf_logging

    from ..reference import TorchEmbedder

    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    hf_logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TorchEmbedder.from_pretrained(
            model, method, max_length=max_length, padding_side=padding_side, **options
        )


def source_record(embedder: Any) -> dict[str, Any]:
    """Where the model came from, and a hash of its config, for the manifest."""
    from ..methods import resolve_model

    given = embedder.source if embedder.source is not None else ""
    location, preset_id = getattr(embedder, "location", None), getattr(embedder, "preset_id", None)
    if location is None and given:  # built without from_pretrained
        location, preset_id = resolve_model(given)
    config = embedder.model.decoder.config
    record: dict[str, Any] = {
        "model": given, "location": None, "preset_id": preset_id, "revision": getattr(embedder, "revision", None)
    }
    if location is not None and Path(location).is_dir():
        record["location"] = str(Path(location).resolve())
    elif location is not None:
        record["location"] = location  # a hub id
    record["model_type"] = config.model_type
    record["config_sha256"] = config_hash(location, config)
    record["num_layers"] = int(config.num_hidden_layers)
    record["hidden_size"] = int(config.hidden_size)
    # the dtype the checkpoint's weights are stored in (bfloat16 for most 4B-8B releases); the
    # export itself traces and checks in float32
    record["dtype"] = getattr(embedder, "source_dtype", None)
    if getattr(embedder, "gguf", None):
        record["gguf"] = dict(embedder.gguf)  # file name, sha256, quantization type, architecture
    if getattr(embedder, "causal2vec", None):
        record["causal2vec"] = dict(embedder.causal2vec)  # encoder, projector sha256, adapter merged
    return record


def config_hash(location: str | None, config: Any) -> str:
    """sha256 of the model folder's ``config.json`` bytes, else of the config as canonical JSON."""
    if location is not None:
        path = Path(location) / "config.json"
        if path.is_file():
            return hashlib.sha256(path.read_bytes()).hexdigest()
    data = config.to_dict()
    data.pop("transformers_version", None)
    data.pop("_attn_implementation_autoset", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


# -- output directory ---------------------------------------------------------------------------


def _guard_source(out: Path, embedder: Any) -> None:
    location = source_record(embedder).get("location")
    if location and Path(location).is_dir():
        src, dst = Path(location).resolve(), out.resolve()
        if dst == src or dst in src.parents:
            raise ValueError(f"output {str(out)!r} would replace the model folder {str(src)!r}")


# -- the exporter -------------------------------------------------------------------------------


@dataclass
class ExportResult:
    path: Path
    manifest: dict[str, Any]
    parity: ParityReport
    files: dict[str, dict[str, Any]] = field(default_factory=dict)


class Exporter:
    """Exports one loaded :class:`~kvembed.reference.TorchEmbedder`, tracing it at most once.

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
        self.attention, self.opset = resolve_attention(attention, opset)
        self.release_weights = release_weights
        self.weights_released = False
        self.embedder = embedder
        self.optimize = optimize
        self.progress = progress or _silent
        self._workdir: Path | None = None
        self._graph: dict[str, Any] | None = None
        self._reference_outputs: dict[Any, Any] = {}  # the traced embedder's parity outputs
        self._references: dict[str | None, Any] | None = None  # output label -> its single-method reference

    def __enter__(self) -> "Exporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
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
        self._workdir = Path(tempfile.mkdtemp(prefix=".kvembed-trace-", dir=workdir))
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
            reference_runs(reference, self._reference_outputs, outputs=output_names(label),
                           advance=advance_of(self.progress))

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
    ) -> ExportResult:
        """Write an artifact for ``precision`` to ``out`` after it passes the parity gate.

        ``reference`` (a TorchEmbedder) or ``reference_options`` (method options for a second
        reference built from the same model) replace the gate's reference; the default is the
        embedder that was traced. They exist to prove the gate catches a wrong graph.
        ``keep_trace=False`` moves the traced fp32 graph instead of copying it (last write).
        ``int8_recipe``: a name of :data:`~kvembed.export.precision.INT8_RECIPES`, or ``"auto"``
        (the first of :data:`~kvembed.export.precision.INT8_AUTO` that passes the gate).
        """
        precision = check_precision(precision)
        out = check_output(out, force)
        _guard_source(out, self.embedder)
        embedder = self.embedder
        if reference is None and reference_options:
            options = {**dict(embedder.method.options), **dict(reference_options)}
            reference = load_embedder(
                embedder.source, embedder.method.name, max_length=embedder.max_length,
                padding_side=embedder.padding_side, **options,
            )
        reference = reference or embedder
        with staged(out) as staging:
            traced = self.trace(workdir=out.parent)
            assert self._graph is not None
            embedder.tokenizer.save(str(staging / TOKENIZER))
            if embedder.encoder.context_tokenizer is not None:  # Causal2Vec's encoder tokenizer
                embedder.context.tokenizer.save(str(staging / ENCODER_TOKENIZER))
            recipes: list[str | None] = list(int8_plan(int8_recipe)) if precision == "int8" else [None]
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
                manifest = self._manifest(precision, self._check_graph(model_path, precision), conversion)
                self.progress("parity", "running the graph in onnxruntime against PyTorch")
                reports = self._parity(staging, manifest, precision, reference)
                report = reports.pop(None)
                failure = None if report.passed else ParityError(report)
                for label, extra in reports.items():
                    if failure is None and not extra.passed:
                        failure = ParityError(extra, label)
                if recipe is not None:
                    tried.append({"recipe": recipe, "worst_cosine": report.worst_cosine, "passed": failure is None})
                    manifest["graph"]["precision_conversion"]["recipes_tried"] = tried
                if failure is None:
                    break
                if attempt == len(recipes):
                    raise failure
                self.progress("fallback", f"int8 recipe {recipe} missed the gate ({report.worst_cosine:.5f}); trying {recipes[attempt]}")
                for stale in (model_path, model_path.with_name(model_path.name + ".data")):
                    stale.unlink(missing_ok=True)
            manifest["parity"] = report.to_dict()
            if reference is not embedder:
                manifest["parity"]["reference"] = {
                    "note": "a different reference than the exported method was used",
                    "method": reference.method.to_dict(),
                }
            if reports:
                manifest["parity"]["also"] = {label: r.to_dict() for label, r in reports.items()}
            self.progress("write", f"writing {out}")
            manifest["files"] = file_records(staging)
            write_manifest(staging, manifest)
        return ExportResult(out, manifest, report, manifest["files"])

    # -- steps ------------------------------------------------------------------------------

    def _convert(self, traced: Path, model_path: Path, precision: str, recipe: str | None,
                 calibration: Any, keep_trace: bool, ranges: dict[str, Any]) -> dict[str, Any]:
        """Write the graph for ``precision`` (int8: by ``recipe``) as ``model_path``; what was done."""
        if precision == "fp32":
            self.progress("convert", "fp32: no conversion")
            _copy_graph(traced, model_path, move=not keep_trace)
            settle_layout(model_path)
            return {}
        self.progress("convert", f"converting to {precision}" + (f" (recipe {recipe})" if recipe else ""))
        return convert(traced, model_path, precision, int8_recipe=recipe or "plain", calibration=calibration,
                       ranges=ranges, step=lambda detail: self.progress("convert", detail),
                       advance=advance_of(self.progress))

    def _context_matmuls(self) -> int:
        """Weight matrix products of Causal2Vec's encoder and projector (one per ``nn.Linear``)."""
        from torch import nn

        encoder = self.embedder.model.context_encoder
        return 0 if encoder is None else sum(isinstance(m, nn.Linear) for m in encoder.modules())

    def _check_graph(self, model_path: Path, precision: str) -> dict[str, Any]:
        import onnx

        model = onnx.load(str(model_path), load_external_data=False)
        counts = op_types(model)
        bad = non_portable_ops(model, ALLOWED_OPS)
        if bad and precision != "int8":
            raise ExportError(
                f"the {precision} graph contains operators outside the portable allow-list: {', '.join(bad)}"
            )
        layers = decoder_layers_in_graph(model, self._context_matmuls())
        needed = self.embedder.model.layers_needed
        if layers != needed:
            raise ExportError(f"the graph holds the weights of {layers} decoder layers, the method needs {needed}")
        onnx.checker.check_model(str(model_path), full_check=False)
        return {
            "op_types": dict(sorted(counts.items())),
            "nodes": len(model.graph.node),
            "decoder_layers": int(layers),
            "weight_matmuls": weight_matmuls(model),
            "tensorrt_ready": not bad,
            "non_portable_ops": bad,
            "external_data": (model_path.parent / DATA_FILE).exists(),
        }

    def _manifest(self, precision: str, graph_facts: Mapping[str, Any], conversion: Mapping[str, Any]) -> dict[str, Any]:
        import onnx
        import onnxruntime
        import torch
        import transformers

        embedder = self.embedder
        encoder = embedder.encoder
        names = input_names(embedder)
        model = embedder.model
        assert self._graph is not None
        graph = {
            "exporter": self._graph["exporter"],
            # fused (one Attention op per layer, opset 23) or decomposed, and the oldest
            # onnxruntime / TensorRT that run this graph
            "attention": self._graph["attention"],
            "optimizations": self._graph["optimizations"],
            **graph_facts,
            "precision_conversion": dict(conversion),
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__,
            },
        }
        return {
            "schema_version": SCHEMA_VERSION,
            "kvembed_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "source": source_record(embedder),
            "method": embedder.method.to_dict(),
            # layers="auto": the intrinsic-dimension curve and the set it chose (else null)
            "layer_selection": getattr(embedder, "layer_selection", None),
            "dim": int(embedder.dim),
            "max_length": int(embedder.max_length),
            "opset": self.opset,
            "precision": precision,
            "padding_side": embedder.padding_side,
            "placeholder_id": encoder.placeholder_id,
            "pad_id": encoder.pad_id,
            "fallback_id": encoder.fallback_id,
            "inputs": [{"name": n, "dtype": "int64", "shape": list(input_axes(n))} for n in names],
            # Causal2Vec: the context encoder's tokenizer file, length limit and pad id (else null)
            "context_encoder": None if encoder.context_tokenizer is None else {
                "tokenizer": ENCODER_TOKENIZER, "max_length": encoder.context_max_length, "pad_id": encoder.context_pad_id,
            },
            # extra methods read from the same forward pass (--also): label -> method
            "also": {label: method.to_dict() for label, method in model.also.items()},
            "outputs": [
                {
                    "name": name, "dtype": "float32", "shape": ["batch", model.readout_dim(method)],
                    "normalized": normalized, "method": method.name if label is None else label,
                }
                for label, method in model.readouts
                for name, normalized in zip(output_names(label), (True, False))
            ],
            "graph": graph,
            "files": {},
            "parity": {},
        }

    def _parity(
        self, directory: Path, manifest: Mapping[str, Any], precision: str, reference: Any
    ) -> dict[str | None, ParityReport]:
        """Reports for the main output (key None) and each extra one, each against a reference
        that computes only that method in a forward pass of its own."""
        encoder = encoder_from_manifest(directory, manifest)
        session = parity_session(directory / MODEL)
        if self._references is None:
            self._references = self.embedder.references()
        references = self._references if reference is self.embedder else {**self._references, None: reference}
        cache = self._reference_outputs if reference is self.embedder else None
        try:
            return parity_reports(session, encoder, references, precision, cache=cache,
                                  advance=advance_of(self.progress))
        finally:
            del session


def parity_reports(
    session: Any,
    encoder: Any,
    references: Mapping[str | None, Any],
    precision: str,
    cache: dict[Any, Any] | None = None,
    advance: Callable[[int, int], None] | None = None,
) -> dict[str | None, ParityReport]:
    """Parity of every output pair of the graph (label None: the main one) against its
    single-method reference (:meth:`TorchEmbedder.references`)."""
    return {
        label: run_parity(session, encoder, reference, precision, cache=cache, outputs=output_names(label),
                          advance=advance)
        for label, reference in references.items()
    }


def parity_session(path: Path) -> Any:
    """An onnxruntime CPU session for the gate (no thread spinning: torch runs in between).

    No MatMul weight pre-packing: a packed copy of every weight would sit beside the (memory-mapped)
    weights for a session that runs a dozen calls, whose batches of hundreds to thousands of rows
    make packing on the fly a small part of each product. No memory arena or memory pattern: the
    gate's batches differ in shape, and the arena would keep (and round up to powers of two) the
    activations of the largest one for the rest of the export."""
    import onnxruntime as ort

    from ..backends.onnxruntime import open_session

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    return open_session(path, options, ["CPUExecutionProvider"])


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
    **options: Any,
) -> ExportResult:
    """:func:`export`, returning the manifest and parity report too."""
    precision = check_precision(precision)
    check_int8_recipe(int8_recipe, precision)
    check_output(out, force)
    attention, opset = resolve_attention(attention, opset)
    if check_memory:  # before any weight loads: refuse in one line rather than meet the OOM killer
        from .memory import export_memory_check

        export_memory_check(model, method, precision, **options)
    progress = progress or _silent
    progress("load", f"loading {model} ({method})")
    embedder = load_embedder(model, method, max_length=max_length, padding_side=padding_side, **options)
    with Exporter(embedder, opset=opset, optimize=optimize, progress=progress, attention=attention,
                  release_weights=True) as exporter:
        return exporter.write(out, precision, force=force, reference_options=reference_options, keep_trace=False,
                              int8_recipe=int8_recipe)


# -- verify -------------------------------------------------------------------------------------


@dataclass
class VerifyResult:
    directory: Path
    manifest: dict[str, Any]
    report: ParityReport | None
    file_problems: list[str]
    source_problems: list[str]
    also: dict[str, ParityReport] = field(default_factory=dict)
    """Parity of each extra method's outputs (``--also``), by label."""

    @property
    def passed(self) -> bool:
        return (
            self.report is not None and self.report.passed and all(r.passed for r in self.also.values())
            and not self.file_problems and not self.source_problems
        )


def reference_for(manifest: Mapping[str, Any]) -> Any:
    """Rebuild the PyTorch reference an artifact was exported from (model, options, max_length)."""
    source = manifest["source"]
    location = source.get("location")
    candidates = []
    if location and Path(location).is_dir():
        candidates.append(location)
    if source.get("model"):
        candidates.append(source["model"])
    if location and location not in candidates:
        candidates.append(location)
    if not candidates:
        raise ValueError("the manifest does not say which model the artifact came from")
    method = manifest["method"]
    also = [
        AlsoRequest(method=extra["name"], options=dict(extra["options"]), label=label)
        for label, extra in (manifest.get("also") or {}).items()
    ]
    last_error: Exception | None = None
    for candidate in candidates:
        try:
            return load_embedder(
                candidate, method["name"], max_length=int(manifest["max_length"]),
                padding_side=manifest.get("padding_side", "right"), also=also, **dict(method["options"]),
            )
        except FileNotFoundError as err:
            last_error = err
    raise FileNotFoundError(f"cannot load the source model of this artifact ({', '.join(candidates)}): {last_error}")


def verify(directory: str | os.PathLike[str], progress: Progress | None = None) -> VerifyResult:
    """Re-run the parity gate of an existing artifact against a freshly built PyTorch reference."""
    progress = progress or _silent
    directory = Path(directory).expanduser()
    manifest = read_manifest(directory)
    progress("check", "checking file hashes")
    file_problems = check_files(directory, manifest)
    if file_problems:  # a damaged graph or tokenizer cannot be run meaningfully: report, don't crash
        return VerifyResult(directory, manifest, None, file_problems, [])
    progress("load", f"loading the reference {manifest['source'].get('model')}")
    reference = reference_for(manifest)
    source_problems = []
    now = source_record(reference)
    if now["config_sha256"] != manifest["source"].get("config_sha256"):
        source_problems.append("the source model's config changed since export (config_sha256 differs)")
    # as at export: the reference runs the gate's batches first and its weights are freed before
    # onnxruntime opens the artifact, so the model is never in memory twice
    progress("reference", "running the PyTorch reference on the parity texts")
    references, cache = reference.references(), {}
    for label, single in references.items():
        reference_runs(single, cache, outputs=output_names(label), advance=advance_of(progress))
    reference.model.to("meta")
    gc.collect()
    progress("parity", "running the graph in onnxruntime against PyTorch")
    encoder = encoder_from_manifest(directory, manifest)
    session = parity_session(directory / MODEL)
    reports = parity_reports(session, encoder, references, manifest["precision"], cache=cache,
                             advance=advance_of(progress))
    report = reports.pop(None)
    return VerifyResult(directory, manifest, report, file_problems, source_problems, reports)


__all__ = [
    "STAGES",
    "ExportError",
    "ExportResult",
    "Exporter",
    "OutputExistsError",
    "ParityError",
    "VerifyResult",
    "check_output",
    "export",
    "export_result",
    "load_embedder",
    "reference_for",
    "verify",
]
