"""The export's report, typed: what the parity gate found, as the manifest's ``parity`` stores it.

The exporter assembles one :class:`ExportReport` (the gate's report on its first target, the other
targets' and the extra outputs', the held-out texts', each advisory check, the stages' timings)
and the manifest keeps it typed (:attr:`~.manifest.Manifest.parity`): the CLI prints it, eval
and verify read it, nobody reads the JSON back by key. The JSON form is the one the manifest has
always had: the gate's report flat at the top of ``parity``, the rest beside it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from ..errors import InvalidInput, shown
from .jsonform import checked_field, field_keys, over_raw

#: a ParityReport's fields that every record holds, with their JSON types
_REPORT_REQUIRED: Mapping[str, type | tuple[type, ...]] = {
    "precision": str, "passed": bool, "worst_cosine": (float, int), "max_abs_diff": (float, int),
    "min_cosine_required": (float, int), "rows": int, "batches": int, "texts": int,
}


@dataclass
class ParityReport:
    """One comparison of a graph with the PyTorch reference: the worst row's cosine and largest
    difference over all rows and per case (``kind/side``), against the bar of ``precision``."""

    precision: str
    passed: bool
    worst_cosine: float
    max_abs_diff: float
    min_cosine_required: float
    max_abs_allowed: float | None
    rows: int
    batches: int
    texts: int
    worst_row: dict[str, Any] = field(default_factory=dict)
    pooled_worst_cosine: float = 1.0
    by_case: dict[str, dict[str, float]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    reference: dict[str, Any] = field(default_factory=dict)
    #: tokens of the longest input compared, prompt included: the gate vouches for lengths up to it
    longest_tokens: int = 0
    #: the comparison stopped at the first batch that decided a miss (``stop_at_miss``): the figures
    #: are those of the batches compared before it, the rest were never run
    stopped_early: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "a parity report") -> "ParityReport":
        """A report from its :meth:`to_dict` form, checked (a manifest is hostile input); keys a
        record adds beside it (an advisory check's ``graph`` and ``held_out``) are not the report's
        and are left out."""
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} must be an object, got {shown(data)}")
        for key, kind in _REPORT_REQUIRED.items():
            checked_field(data, key, kind, where)
        checked_field(data, "max_abs_allowed", (float, int), where, optional=True)
        for key, kind in (("worst_row", dict), ("by_case", dict), ("problems", list), ("reference", dict),
                          ("pooled_worst_cosine", (float, int)), ("longest_tokens", int), ("stopped_early", bool)):
            if key in data:
                checked_field(data, key, kind, where)
        names = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})

    def summary(self) -> str:
        limit = f"cosine >= {self.min_cosine_required}"
        if self.max_abs_allowed is not None:
            limit += f", max abs <= {self.max_abs_allowed:g}"
        state = "passed" if self.passed else "FAILED"
        over = f"{self.rows} rows"
        if self.stopped_early:
            over += f" of the {self.batches} batches compared before the gate stopped at the first miss"
        text = (
            f"parity {state} ({self.precision}): worst cosine {self.worst_cosine:.7f}, max abs diff "
            f"{self.max_abs_diff:.3g} over {over} (needs {limit})"
        )
        if self.problems:
            text += "; " + "; ".join(self.problems)
        return text


@dataclass(frozen=True)
class HeldOut:
    """The graph against PyTorch on texts that neither the int8 calibration nor the gate's own texts
    hold, run on ``backend`` (a target name). Beside the gate's worst cosine (``meets_bar``: whether
    it met the gate's bar); ``decides``: whether it was part of the verdict (int8) or a figure only.
    ``raw`` keeps the record's other figures (max abs diff, worst row, per case) as written."""

    worst_cosine: float
    rows: int
    texts: int
    meets_bar: bool
    backend: str | None = None
    decides: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, report: ParityReport, backend: str, decides: bool = False) -> "HeldOut":
        """``report`` (the graph on the held-out texts) as the record the manifest keeps: its figures
        beside the gate's, a verdict too where ``decides`` (docs/methods.md, "What the same means")."""
        keys = ("worst_cosine", "max_abs_diff", "pooled_worst_cosine", "rows", "batches", "texts", "worst_row", "by_case",
                "min_cosine_required", "problems", "stopped_early")
        record = {**{key: getattr(report, key) for key in keys}, "meets_bar": report.passed, "decides": decides,
                  "backend": backend}
        return cls.from_dict(record, "held_out")

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "HeldOut":
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} must be an object, got {shown(data)}")
        return cls(float(checked_field(data, "worst_cosine", (float, int), where)), checked_field(data, "rows", int, where),
                   checked_field(data, "texts", int, where), checked_field(data, "meets_bar", bool, where),
                   checked_field(data, "backend", str, where, optional=True),
                   bool(checked_field(data, "decides", bool, where, optional=True)), raw=dict(data))

    def to_dict(self) -> dict[str, Any]:
        return over_raw(self, field_keys(HeldOut), lambda d: HeldOut.from_dict(d, "held_out"), skip_none=("backend",))


@dataclass(frozen=True)
class Advisory:
    """One advisory check of the export (a faster path tried on the graph that passed): its report,
    the graph file it ran and its held-out figure, or ``skipped``: why it did not run."""

    skipped: str | None = None
    report: ParityReport | None = None
    graph: str | None = None
    held_out: HeldOut | None = None

    @property
    def held_out_missed(self) -> float | None:
        """The held-out worst cosine where those texts decided and missed the bar, else None."""
        held = self.held_out
        return held.worst_cosine if held is not None and held.decides and not held.meets_bar else None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> "Advisory":
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} must be an object, got {shown(data)}")
        if "skipped" in data:
            return cls(skipped=str(checked_field(data, "skipped", str, where)))
        held = data.get("held_out")
        return cls(report=ParityReport.from_dict(data, where), graph=checked_field(data, "graph", str, where, optional=True),
                   held_out=None if held is None else HeldOut.from_dict(held, f"{where}: held_out"))

    def to_dict(self) -> dict[str, Any]:
        if self.report is None:
            return {"skipped": self.skipped or ""}
        out: dict[str, Any] = {**self.report.to_dict(), "graph": self.graph}
        if self.held_out is not None:
            out["held_out"] = self.held_out.to_dict()
        return out


def _reports(data: Any, key: str, where: str) -> dict[str, ParityReport]:
    value = checked_field(data, key, dict, where, optional=True) or {}
    return {str(name): ParityReport.from_dict(report, f"{where}: {key}[{shown(name)}]") for name, report in value.items()}


@dataclass(frozen=True)
class ExportReport:
    """The manifest's ``parity``: what the export's parity gate found (see the module docstring).

    ``gate``: the main output on the first target of the gate, ``target``; ``gates``: the other
    targets of the gate (bf16's onnxruntime at fp32); ``also``: each extra output (``--also``);
    ``held_out``: the main output on the held-out texts; ``advisory``: target -> each advisory
    check (the gate's ``reference`` names a reference other than the exported method, which only
    the gate's own tests use); ``timings``: seconds per export stage (:data:`~kvembed.export.progress.STAGES`)."""

    gate: ParityReport
    target: str = "onnxruntime-cpu"
    gates: Mapping[str, ParityReport] = field(default_factory=dict)
    also: Mapping[str, ParityReport] = field(default_factory=dict)
    held_out: HeldOut | None = None
    advisory: Mapping[str, Advisory] = field(default_factory=dict)
    timings: Mapping[str, float] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """Whether the gate passed on its first target (what the export's verdict was)."""
        return self.gate.passed

    @classmethod
    def from_dict(cls, data: Any, where: str = "parity") -> "ExportReport":
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{where} must be an object, got {shown(data)}")
        held = data.get("held_out")
        advisory = checked_field(data, "advisory", dict, where, optional=True) or {}
        timings = checked_field(data, "timings", dict, where, optional=True) or {}
        for stage, seconds in timings.items():
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds):
                raise InvalidInput(f"{where}: timings[{shown(stage)}] must be a number of seconds, got {shown(seconds)}")
        return cls(
            gate=ParityReport.from_dict(data, where),
            target=checked_field(data, "backend", str, where, optional=True) or "onnxruntime-cpu",
            gates=_reports(data, "gates", where),
            also=_reports(data, "also", where),
            held_out=None if held is None else HeldOut.from_dict(held, f"{where}: held_out"),
            advisory={str(name): Advisory.from_dict(record, f"{where}: advisory[{shown(name)}]") for name, record in advisory.items()},
            timings={str(stage): float(seconds) for stage, seconds in timings.items()},
            raw=data,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: as read where nothing changed since, else the fields over what was read
        (keys a newer exporter added pass through)."""
        if self.raw and self == ExportReport.from_dict(self.raw):
            return json.loads(json.dumps(self.raw))
        built = self.gate.to_dict()
        if self.also:
            built["also"] = {label: report.to_dict() for label, report in self.also.items()}
        built["backend"] = self.target
        if self.gates:
            built["gates"] = {target: report.to_dict() for target, report in self.gates.items()}
        if self.held_out is not None:
            built["held_out"] = self.held_out.to_dict()
        if self.advisory:
            built["advisory"] = {target: record.to_dict() for target, record in self.advisory.items()}
        if self.timings:
            built["timings"] = {stage: round(seconds, 3) for stage, seconds in self.timings.items()}
        out = {key: value for key, value in json.loads(json.dumps(self.raw)).items() if key not in _OWN_KEYS}
        return {**out, **built}


#: the keys of ``parity`` that :class:`ExportReport`'s fields write
_OWN_KEYS = frozenset({*(f.name for f in fields(ParityReport)), "also", "backend", "gates", "held_out", "advisory", "timings"})
