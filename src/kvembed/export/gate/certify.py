"""Where the parity gate runs an artifact's graph, and the certificates its passes become.

Every precision is gated on onnxruntime's CPU provider, except bf16: onnxruntime's CPU provider has
no bf16 kernels, so a bf16 artifact holds the fp32 graph and bf16 is how OpenVINO runs it (its
``INFERENCE_PRECISION_HINT``). Its gate runs that graph twice against the PyTorch reference: on
OpenVINO under the bf16 hint at bf16's bar (the artifact's own precision, the report the manifest's
``parity`` holds) and on onnxruntime's CPU provider at fp32's bar (the path ``provider="auto"``
falls back to where bf16 cannot run). Each pass becomes a certificate
(:mod:`kvembed.artifact.certificates`) naming the precision the backend reports it ran: on a CPU
without BF16, OpenVINO runs the bf16 hint in f32, so the export refuses bf16 there unless told
to certify that emulation (``--certify-emulated``), and the certificate then says fp32 ran.

An int8 artifact's OpenVINO graph is its own where a dynamic recipe wrote one
(:mod:`.openvino_graph`), else ``model.onnx`` (weight-only). Once the gate passed on onnxruntime,
advisory checks (:data:`ADVISORY_GATES`) run it on OpenVINO at int8's bar: under the bf16 hint on
a CPU with BF16, and, for a weight-only graph, under the f32 hint on any CPU (int8 weights
decompressed in OpenVINO's kernels, where onnxruntime's CPU provider runs slower than fp32; a
dynamic recipe's integer kernels on onnxruntime are faster than OpenVINO f32, so that check is
skipped for it). A pass becomes one more certificate, which lets ``provider="auto"`` run the
artifact there; a miss, or a machine that cannot run it, only costs the certificate, never the
export. Every advisory check is decided by the held-out texts as well as the gate's
(:func:`held_out_decides`): it is chosen because it passes.

An fp16 artifact's graph runs on OpenVINO as it is under the f16 hint, on a CPU with FP16 (AVX-512
FP16, AMX-FP16): the weights stay fp16 there, where onnxruntime's CPU provider holds fp32 copies of
them. A model whose activations leave fp16's range (fp16 arithmetic, where onnxruntime's CPU
provider computes fp32) misses fp16's bar there. On a CPU with BF16, OpenVINO runs the same graph
under the bf16 hint with its GEMM weights retyped to bf16 and its activations f32
(:func:`kvembed.backends.openvino.write_bf16_graph`: two bytes a weight, fp32's range). Its advisory checks are alternatives, each at fp16's bar, the one this CPU runs fastest first
(AMX tiles before vector units: bf16 first on a CPU with AMX-BF16 but not AMX-FP16; f16, with more
mantissa bits, first where both run alike): the first that can run here and passes, held-out texts
included, certifies, and the rest are not run (each costs a pass over the weights).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from ...version import __version__
from ...artifact import Manifest
from ...artifact.certificates import PYTORCH, precision_name
from ...backends.catalogue import BACKENDS, open_target, session_backend, target_problem
from ...backends.cpu import cpu_features
from ...errors import InvalidInput, MissingDependency
from .targets import CPU, OV_BF16, OV_F16, OV_F32, TARGETS

#: artifact precision -> the gate's (verify target, tolerance precision), the artifact's own first
GATES: dict[str, tuple[tuple[str, str], ...]] = {
    "fp32": ((CPU, "fp32"),),
    "fp16": ((CPU, "fp16"),),
    "int8": ((CPU, "int8"),),
    "bf16": ((OV_BF16, "bf16"), (CPU, "fp32")),
}
#: artifact precision -> checks run after the gate passed, each certifying a faster or smaller path
#: where it passes and failing nothing where it does not: groups of (verify target, tolerance
#: precision); within a group, alternatives in order of preference where this CPU runs them alike
#: (:func:`advisory_checks` puts the fastest here first; the first pass ends the group). int8's
#: f32 check is a group of its own: it runs on every CPU, so an artifact certified for bf16 where it
#: was exported is ready for a CPU without BF16 as well.
ADVISORY_GATES: dict[str, tuple[tuple[tuple[str, str], ...], ...]] = {
    "int8": (((OV_BF16, "int8"),), ((OV_F32, "int8"),)),
    "fp16": (((OV_F16, "fp16"), (OV_BF16, "fp16")),),
}
#: artifact precisions whose advisory checks run a graph of their own (the manifest's ``graphs``)
OWN_GRAPHS = frozenset({"int8"})
#: artifact precisions whose held-out texts decide beside the gate's (docs/methods.md): an int8 recipe
#: is chosen because it passes, so the texts that choose it must reach past the calibration's and
#: the gate's own, or a recipe fitted to them would be chosen and miss on plain text it never saw
HELD_OUT_DECIDES = frozenset({"int8"})


def held_out_decides(precision: str, advisory: bool = False) -> bool:
    """Whether the held-out texts decide beside the gate's: for int8 (:data:`HELD_OUT_DECIDES`),
    and in every ``advisory`` check, of any precision: an advisory check is chosen because it
    passes (the path ``auto`` runs instead of the gate's, the first of its alternatives that
    passes), so, like an int8 recipe, it must hold on text its decision never saw."""
    return advisory or precision in HELD_OUT_DECIDES
#: what ``--certify-emulated`` is called in messages
EMULATED_FLAG = "--certify-emulated"


def check_gate_here(precision: str, certify_emulated: bool = False) -> None:
    """Before any heavy work: can this machine gate ``precision``? bf16 needs openvino and a CPU with
    BF16 (or ``certify_emulated``); a one-line error says why not and what to do."""
    if certify_emulated and precision != "bf16":
        raise InvalidInput(f"{EMULATED_FLAG} applies to --precision bf16 only (got {precision}); drop it")
    if precision != "bf16":
        return
    problem = BACKENDS["openvino"].probe()
    if problem is not None:
        raise MissingDependency(f"--precision bf16 is gated on OpenVINO, and {problem}")
    features = cpu_features()
    if not features.bf16 and not certify_emulated:
        raise InvalidInput(
            f"--precision bf16: this CPU has {features.describe()}, so OpenVINO would run f32 and the gate cannot "
            f"certify bf16; export on a CPU with AVX-512 BF16 or AMX, export fp32 (the same graph), or add "
            f"{EMULATED_FLAG} to gate it as it runs here (f32) and record that in its certificate"
        )


def advisory_checks(precision: str) -> list[tuple[str, str, int]]:
    """``(target, tolerance precision, group)`` of every advisory check of ``precision``, in order
    (:data:`ADVISORY_GATES`; a pass ends the rest of its group): within a group, the alternatives
    this CPU runs fastest first (:meth:`~kvembed.backends.cpu.CpuFeatures.speed_rank`), so the one
    that certifies is the one ``auto`` would rather run here."""
    rank = cpu_features().speed_rank
    return [(target, bar, group) for group, alternatives in enumerate(ADVISORY_GATES.get(precision, ()))
            for target, bar in sorted(alternatives, key=lambda alternative: rank(TARGETS[alternative[0]].setting))]


def advisory_problem(target: str, manifest: Manifest, passed: str | None = None) -> str | None:
    """Why the advisory check on ``target`` cannot certify anything for the artifact of ``manifest``
    here (an int8 artifact names no graph for the target's backend, openvino absent, or a CPU without
    BF16 / FP16 where the bf16 / f16 hint runs f32, or ``passed``: an earlier alternative that
    certified), or None."""
    if passed is not None:
        return f"not needed: {passed} certified"
    spec = TARGETS[target]
    if manifest.precision in OWN_GRAPHS and spec.backend not in manifest.graphs:
        return f"the artifact names no graph for {spec.backend} (exported before it had one: re-export it)"
    if target == OV_F32 and manifest.precision == "int8" and not manifest.graph.weight_only:
        return "a dynamic int8 recipe: onnxruntime's integer kernels run it faster than OpenVINO f32"
    problem = target_problem(target)
    features = cpu_features()
    if problem is None and not features.runs(spec.setting):
        problem = f"this CPU has {features.describe_hint(spec.setting)}: OpenVINO would run f32, which auto never picks"
    return problem


def gate_graph(directory: Path, manifest: Manifest, target: str) -> Path:
    """The graph file ``target``'s backend runs in the artifact being gated in ``directory``
    (its own where the manifest's ``graphs`` names one, else ``model.onnx``)."""
    return directory / manifest.graph_file(TARGETS[target].backend)


#: how the gate opens a graph on each backend (the fields of its options dataclass).
#: onnxruntime: no MatMul weight pre-packing (a packed copy of every weight would sit beside the
#: memory-mapped weights for a session that runs a dozen calls, whose batches of hundreds to
#: thousands of rows make packing on the fly a small part of each product); no memory arena or
#: pattern (the gate's batches differ in shape, and the arena would keep the largest one's
#: activations, rounded up, for the rest of the export); no thread spinning (torch runs in between).
#: OpenVINO: no compiled-model cache (a staging path: nothing worth keeping).
GATE_TARGETS = (CPU, OV_F32, OV_BF16, OV_F16)
GATE_OPTIONS: dict[str, dict[str, Any]] = {
    "onnxruntime": {"memory_arena": False, "prepacking": False, "spinning": False},
    "openvino": {"cache_dir": False},
}


def gate_session(target: str, path: Path) -> Any:
    """The graph at ``path`` opened as the gate runs it on ``target`` (a
    :class:`~kvembed.backends.protocol.Session`): through the target's backend entry, with
    :data:`GATE_OPTIONS` and the target's setting (onnxruntime's provider, OpenVINO's precision hint)."""
    if target not in GATE_TARGETS:
        raise InvalidInput(f"the parity gate does not run on {target}")
    backend = TARGETS[target].backend
    return open_target(target, path, BACKENDS[backend].options_type()(**GATE_OPTIONS[backend]))


def ran_precision(session: Any, graph_precision: str) -> str:
    """The precision ``session`` computes in: OpenVINO's report, or the graph's own elsewhere."""
    if session_backend(session) == "openvino":
        return precision_name(session.precision)
    return graph_precision


def decided_by(gate: Any, held_out: Any | None = None) -> dict[str, dict[str, Any]]:
    """Which texts decided a pass, each set with its size and worst cosine: the gate's (a
    :class:`~kvembed.export.gate.parity.ParityReport`) and, where they decide (:data:`HELD_OUT_DECIDES`),
    the held-out texts' report."""
    sets = {"gate": gate} if held_out is None else {"gate": gate, "held_out": held_out}
    return {name: {"texts": int(report.texts), "rows": int(report.rows), "worst_cosine": float(report.worst_cosine)}
            for name, report in sets.items()}


def certificate(
    target: str, ran: str, report: Any, *, against: str = PYTORCH, extra: dict[str, Any] | None = None,
    held_out: Any | None = None,
) -> dict[str, Any]:
    """A passed check (a :class:`~kvembed.export.gate.parity.ParityReport` or a backend pair's numbers)
    as the manifest's ``certified`` entry: which target, what ran, how close, on which CPU, and for
    a check against PyTorch which texts decided it (:func:`decided_by`; ``held_out``: the held-out
    texts' report where they decided too)."""
    spec = TARGETS[target]
    versions = {}
    if spec.backend == "openvino":
        import openvino

        versions["openvino"] = openvino.get_version()
    elif spec.backend == "onnxruntime":
        import onnxruntime

        versions["onnxruntime"] = onnxruntime.__version__
    record = {
        "target": target,
        "backend": spec.backend,
        "precision": ran,
        "hint": precision_name(spec.setting) if spec.backend == "openvino" else None,
        "against": against,
        "worst_cosine": float(report.worst_cosine),
        "min_cosine": float(getattr(report, "min_cosine_required", None) or report.tolerance["min_cosine"]),
        "max_abs_diff": float(report.max_abs_diff),
        "rows": int(getattr(report, "rows", 0)),
        "texts": int(getattr(report, "texts", 0)),
        "cpu": cpu_features().to_dict(),
        "versions": versions,
        "kvembed_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if against == PYTORCH:
        record["decided_by"] = decided_by(report, held_out)
    record.update(extra or {})
    return record
