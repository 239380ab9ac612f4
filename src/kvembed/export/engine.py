"""TensorRT engines from an artifact, built with polygraphy's Python API.

``build_engine(ARTIFACT, OUT)`` parses ``model.onnx`` (``NetworkFromOnnxPath``), adds one
optimization profile per shape range (``Profile``: batch x sequence, min/opt/max), configures
precision and memory (``CreateConfig``), builds (``EngineFromNetwork``) and saves
(``SaveEngine``) ``engine.plan`` beside a copy of the artifact's ``tokenizer.json`` and
``kvembed.json`` plus ``engine.json`` (what the plan was built from and for), so the engine
directory is itself loadable. Then the plan is checked before the directory is renamed into
place: :func:`engine_parity` runs the gate's texts through the engine directory and through
onnxruntime on the artifact's ``model.onnx`` (same padded batches), held to METHODS.md's tolerance
for the engine's precision, like polygraphy's ``run --trt --onnxrt`` but per row cosine; the report
goes into engine.json (``parity``).

Everything but the build itself (shape rules, the version-dependent precision choice, the
engine.json schema, refusals) is plain Python and runs without TensorRT; tensorrt and polygraphy
are imported only inside :func:`build_engine`. None of the GPU path has run on this project's
CPU-only machines (README says so).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..errors import CheckFailed, InvalidInput
from ..artifact import MANIFEST, MODEL, TOKENIZER, Manifest, load_manifest, sha256_file
from ..artifact.staging import check_output, staged
from ..artifact.engine import ENGINE_JSON, ENGINE_SCHEMA_VERSION, PLAN
from ..backends.catalogue import BACKENDS
from ..sizes import parse_size
from .graph.ops import version_key
from .gate.parity import ParityReport, compare_runs

DEFAULT_SHAPES = "1x16:8x128:32x512"
PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class ShapeRange:
    """One optimization profile: (batch, sequence) at min, opt and max."""

    min: tuple[int, int]
    opt: tuple[int, int]
    max: tuple[int, int]

    def to_dict(self) -> dict[str, list[int]]:
        return {key: list(value) for key, value in asdict(self).items()}


def parse_shapes(spec: str, max_length: int) -> ShapeRange:
    """``"1x16:8x128:32x512"`` -> a :class:`ShapeRange`, checked against the artifact's ``max_length``.

    Each of min, opt and max is ``BATCHxSEQUENCE``; min <= opt <= max on both axes; the max
    sequence may not pass ``max_length`` (the runtime truncates there, so a longer profile only
    wastes workspace and tactic time).
    """
    parts = str(spec).strip().split(":")
    pattern = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$", re.IGNORECASE)
    points = [pattern.match(part) for part in parts]
    if len(parts) != 3 or not all(points):
        raise InvalidInput(f"--shapes {spec!r}: expected MIN:OPT:MAX, each BATCHxSEQUENCE, e.g. {DEFAULT_SHAPES}")
    low, mid, high = ((int(m.group(1)), int(m.group(2))) for m in points)  # type: ignore[union-attr]
    if min(low) < 1:
        raise InvalidInput(f"--shapes {spec!r}: batch and sequence must be >= 1")
    for axis, name in ((0, "batch"), (1, "sequence")):
        if not low[axis] <= mid[axis] <= high[axis]:
            raise InvalidInput(f"--shapes {spec!r}: {name} must grow min <= opt <= max "
                             f"(got {low[axis]}, {mid[axis]}, {high[axis]})")
    if high[1] > max_length:
        raise InvalidInput(f"--shapes {spec!r}: max sequence {high[1]} is past the artifact's max_length "
                         f"{max_length}; use at most {high[0]}x{max_length}")
    return ShapeRange(low, mid, high)


def default_shapes(max_length: int) -> ShapeRange:
    """:data:`DEFAULT_SHAPES` with every sequence clipped to ``max_length``."""
    (b0, s0), (b1, s1), (b2, s2) = (1, 16), (8, 128), (32, 512)
    return ShapeRange((b0, min(s0, max_length)), (b1, min(s1, max_length)), (b2, min(s2, max_length)))


@dataclass(frozen=True)
class PrecisionPlan:
    """How to get ``precision`` out of TensorRT ``tensorrt_version`` from an artifact of
    ``artifact_precision``: builder flags (TensorRT 10) or a strongly typed network (TensorRT 11+,
    which has no fp16/bf16 builder flags: the ONNX types decide)."""

    precision: str
    strongly_typed: bool
    fp16: bool
    bf16: bool


def choose_precision(precision: str, tensorrt_version: str, artifact_precision: str) -> PrecisionPlan:
    """The build recipe for ``precision``, or a ValueError saying which artifact to build from."""
    if precision not in PRECISIONS:
        raise InvalidInput(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if artifact_precision == "int8":
        raise InvalidInput("an int8 artifact (kvembed's int8 recipes are for CPUs) cannot become a TensorRT engine: "
                         "build from the fp32 or fp16 artifact (kvembed-export --precision fp32|fp16)")
    major = version_key(tensorrt_version)[:1] or (0,)
    if major[0] < 10:
        raise InvalidInput(f"TensorRT {tensorrt_version} is too old: kvembed builds engines with TensorRT >= 10")
    if major[0] >= 11:  # strongly typed only: the graph's own types are the precision
        if precision != artifact_precision:
            source = "kvembed's bf16 artifacts hold the fp32 graph (bf16 is how OpenVINO runs them), so no " \
                     "bf16-typed graph exists" if precision == "bf16" else f"export one with kvembed-export --precision {precision}"
            raise InvalidInput(
                f"TensorRT {tensorrt_version} builds only strongly typed networks: a {precision} engine needs a "
                f"{precision} artifact, this one is {artifact_precision} ({source})"
            )
        return PrecisionPlan(precision, True, False, False)
    if artifact_precision != "fp32" and precision != artifact_precision:
        raise InvalidInput(f"a {artifact_precision} artifact builds only a {artifact_precision} engine "
                         f"(asked for {precision}); use the fp32 artifact")
    if artifact_precision != "fp32":  # an fp16 graph already says where fp32 stays: keep its types
        return PrecisionPlan(precision, True, False, False)
    return PrecisionPlan(precision, False, precision == "fp16", precision == "bf16")


def check_tensorrt_supports(manifest: Manifest, tensorrt_version: str) -> None:
    """Refuse a graph whose ops this TensorRT's parser lacks (the manifest's minimum: Attention needs
    10.14, Causal2Vec's Gelu 10.15)."""
    graph = manifest.graph
    needed = graph.min_versions.get("tensorrt")
    if needed and version_key(tensorrt_version) < version_key(needed):
        form = graph.attention_form or "fused"
        fix = "re-export with kvembed-export --attention decomposed" if form == "fused" else "upgrade TensorRT"
        raise InvalidInput(f"this artifact's graph ({form} attention) needs TensorRT >= {needed} "
                         f"(installed: {tensorrt_version}); {fix}")


def engine_record(
    manifest: Manifest,
    model_sha256: str,
    ranges: Sequence[ShapeRange],
    plan: PrecisionPlan,
    *,
    tensorrt_version: str,
    gpu_name: str,
    compute_capability: str,
    build_seconds: float,
    options: Mapping[str, Any],
    plan_sha256: str | None = None,
) -> dict[str, Any]:
    """engine.json: what the plan was built from (sha256 of model.onnx) and for (TensorRT, GPU);
    ``plan_sha256`` lets the loader tell a damaged plan from a good one."""
    return {
        "schema_version": ENGINE_SCHEMA_VERSION,
        "tensorrt_version": str(tensorrt_version),
        "gpu": {"name": gpu_name, "compute_capability": str(compute_capability)},
        "profiles": [r.to_dict() for r in ranges],
        "precision": plan.precision,
        "strongly_typed": plan.strongly_typed,
        "source": {"model_sha256": model_sha256, "artifact_precision": manifest.precision,
                   "attention": manifest.graph.attention_form, "opset": manifest.opset, "max_length": manifest.max_length},
        "build": {"created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  "seconds": round(float(build_seconds), 1), **dict(options)},
        "inputs": manifest.input_names,
        **({"plan_sha256": plan_sha256} if plan_sha256 else {}),
    }


def build_engine(
    artifact: str | Path,
    out: str | Path,
    *,
    shapes: Sequence[str] = (),
    precision: str = "fp32",
    timing_cache: str | Path | None = None,
    workspace: str = "4GiB",
    opt_level: int = 3,
    force: bool = False,
    parity: bool = True,
) -> dict[str, Any]:
    """Build ``engine.plan`` for ``artifact`` into ``out``; return engine.json's record.

    Checks everything that needs no GPU first (manifest, shapes, sizes, output directory), then
    imports TensorRT (MissingDependency when absent). The directory is written beside ``out`` and
    renamed into place only when done; with ``parity`` (the default) only if the plan also passes
    :func:`engine_parity` (EngineParityError otherwise, nothing left at ``out``).
    """
    artifact = Path(artifact).expanduser()
    manifest = load_manifest(artifact)
    if manifest.context_encoder is not None:
        raise InvalidInput("Causal2Vec artifacts have a second token sequence (the encoder's), which the engine's "
                         "shape profiles do not cover yet; run them with onnxruntime (--provider cpu|cuda|tensorrt)")
    max_length = manifest.max_length
    ranges = [parse_shapes(s, max_length) for s in shapes] or [default_shapes(max_length)]
    workspace_bytes = parse_size(workspace)
    if not 0 <= int(opt_level) <= 5:
        raise InvalidInput(f"--opt-level must be 0-5 (TensorRT's builder optimization level), got {opt_level}")
    if precision not in PRECISIONS:
        raise InvalidInput(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    out = check_output(out, force)
    if out.resolve() == artifact.resolve():
        raise InvalidInput(f"--out {str(out)!r} is the artifact itself: pick another directory "
                         f"(the engine directory gets copies of its {TOKENIZER} and {MANIFEST})")
    tensorrt = BACKENDS["tensorrt"].load()  # the loader's half: the same TensorRT checks
    trt, poly = tensorrt.require_tensorrt()
    plan = choose_precision(precision, trt.__version__, manifest.graph_precision)  # a bf16 artifact's graph is fp32
    check_tensorrt_supports(manifest, trt.__version__)
    gpu_name, capability = tensorrt.gpu_identity()

    names = manifest.input_names
    profiles = []
    for r in ranges:
        profile = poly.Profile()
        for name in names:
            profile.add(name, min=r.min, opt=r.opt, max=r.max)
        profiles.append(profile)
    network = poly.NetworkFromOnnxPath(str(artifact / MODEL), strongly_typed=plan.strongly_typed or None)
    config = poly.CreateConfig(
        fp16=plan.fp16 or None, bf16=plan.bf16 or None, profiles=profiles,
        memory_pool_limits={trt.MemoryPoolType.WORKSPACE: workspace_bytes},
        builder_optimization_level=int(opt_level),
        load_timing_cache=str(timing_cache) if timing_cache and Path(timing_cache).exists() else None,
    )
    with staged(out) as staging:
        start = time.monotonic()
        engine = poly.EngineFromNetwork(network, config=config,
                                        save_timing_cache=str(timing_cache) if timing_cache else None)
        poly.SaveEngine(engine, path=str(staging / PLAN))()
        seconds = time.monotonic() - start
        for name in (TOKENIZER, MANIFEST):
            shutil.copyfile(artifact / name, staging / name)
        record = engine_record(
            manifest, sha256_file(artifact / MODEL), ranges, plan, tensorrt_version=trt.__version__,
            gpu_name=gpu_name, compute_capability=capability, build_seconds=seconds,
            options={"workspace_bytes": workspace_bytes, "opt_level": int(opt_level),
                     "timing_cache": str(timing_cache) if timing_cache else None},
            plan_sha256=sha256_file(staging / PLAN),
        )
        write_engine_json(staging, record)
        if parity:
            check_engine_parity(staging, artifact, record)
    return record


def write_engine_json(directory: Path, record: Mapping[str, Any]) -> None:
    (directory / ENGINE_JSON).write_text(json.dumps(record, indent=2) + "\n")


class EngineParityError(CheckFailed):
    """The built plan's vectors are further from the artifact's than its precision allows."""

    def __init__(self, report: ParityReport) -> None:
        self.report = report
        super().__init__(f"the engine missed its parity check against onnxruntime on the artifact: {report.summary()}; "
                         "nothing was written (rebuild at a higher precision, or pass --no-parity to keep it anyway)")


def engine_parity(engine_dir: str | Path, artifact: str | Path, precision: str) -> ParityReport:
    """An engine directory against onnxruntime's CPU run of its source ``model.onnx`` (which passed
    the PyTorch gate at export): the gate's texts, batches and padding sides, each padded batch fed
    to both through the runtime's own loaders (the engine as users load it: profile padding and
    row limits included), held to METHODS.md's tolerance for the engine's ``precision``."""
    from ..runtime import Embedder

    engine = Embedder.load(engine_dir, provider="tensorrt")
    reference = Embedder.load(artifact, provider="cpu")
    try:
        return compare_runs(engine.run, lambda batch, _case: reference.run(batch), engine.encoder, precision)
    finally:
        close = getattr(engine.session, "close", None)  # frees the execution context before the rename
        if close is not None:
            close()


def check_engine_parity(engine_dir: Path, artifact: Path, record: dict[str, Any]) -> None:
    """Run :func:`engine_parity`, record it in ``record`` and engine.json; EngineParityError on a miss."""
    report = engine_parity(engine_dir, artifact, str(record["precision"]))
    record["parity"] = {**report.to_dict(), "reference": {"runtime": "onnxruntime CPU", "graph": "the artifact's model.onnx"}}
    write_engine_json(engine_dir, record)
    if not report.passed:
        raise EngineParityError(report)
