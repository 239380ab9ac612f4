"""``kvembed verify``: re-run an artifact's parity gate against a freshly built PyTorch reference,
after checking its file hashes and whether the source model's config changed since the export.
Where the held-out texts decide at export (int8, and every advisory check:
:func:`~kvembed.export.gate.certify.held_out_decides`), they decide here too.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...methods.sharing import AlsoRequest, output_names
from ...artifact import Manifest, check_files, load_manifest
from ...runtime.artifact import encoder_from_manifest
from ..source import load_embedder, source_record
from .certify import GATES, HELD_OUT_DECIDES, advisory_checks, held_out_decides, advisory_problem, certificate, decided_by, gate_graph, gate_session, ran_precision
from .parity import ParityReport, model_gate_texts, parity_reports, reference_runs, run_parity
from .texts import held_out_texts
from ..progress import Progress, advance_of, silent
from ...errors import InvalidInput


@dataclass
class VerifyResult:
    directory: Path
    manifest: Manifest
    report: ParityReport | None
    file_problems: list[str]
    source_problems: list[str]
    also: dict[str, ParityReport] = field(default_factory=dict)
    """Parity of each extra method's outputs (``--also``), by label."""
    backend: str = "onnxruntime-cpu"
    """Where :attr:`report` ran (the first of the gate's targets, :data:`~kvembed.export.gate.certify.GATES`)."""
    gates: dict[str, ParityReport] = field(default_factory=dict)
    """The main output's parity on the gate's other targets (bf16: onnxruntime at fp32)."""
    advisory: dict[str, ParityReport | str] = field(default_factory=dict)
    """The advisory checks (:data:`~kvembed.export.gate.certify.ADVISORY_GATES`: an int8 artifact's
    OpenVINO graph): each report, or why it could not run here; they certify, never fail."""
    certificates: list[dict[str, Any]] = field(default_factory=list)
    """A certificate (:mod:`kvembed.artifact.certificates`) for each target whose gate passed,
    when the files and the source model are those of the export (``kvembed verify --record``)."""
    held_out: dict[str, ParityReport] = field(default_factory=dict)
    """The main output on the held-out texts, by target, where they decide (int8); a gate target's
    miss fails the verification, an advisory target's costs its certificate."""

    def decided_by(self, target: str | None = None) -> dict[str, dict[str, Any]]:
        """Which texts decided ``target``'s verdict (default: :attr:`backend`'s), each set with its
        worst cosine (:func:`~kvembed.export.gate.certify.decided_by`); empty when nothing ran there."""
        target = target or self.backend
        gate = self.report if target == self.backend else self.gates.get(target, self.advisory.get(target))
        return {} if not isinstance(gate, ParityReport) else decided_by(gate, self.held_out.get(target))

    @property
    def passed(self) -> bool:
        return (
            self.report is not None and self.report.passed and all(r.passed for r in self.also.values())
            and all(r.passed for r in self.gates.values()) and not self.file_problems and not self.source_problems
            and all(self.held_out[target].passed for target in [self.backend, *self.gates] if target in self.held_out)
        )


def reference_for(manifest: Manifest) -> Any:
    """Rebuild the PyTorch reference an artifact was exported from (model, options, max_length)."""
    location = manifest.source.location
    candidates = []
    if location and Path(location).is_dir():
        candidates.append(location)
    if manifest.source.model:
        candidates.append(manifest.source.model)
    if location and location not in candidates:
        candidates.append(location)
    if not candidates:
        raise InvalidInput("the manifest does not say which model the artifact came from")
    method = manifest.method
    also = [AlsoRequest(method=extra.name, options=dict(extra.options), label=label) for label, extra in manifest.also.items()]
    last_error: Exception | None = None
    for candidate in candidates:
        try:
            return load_embedder(
                candidate, method.name, max_length=manifest.max_length,
                padding_side=manifest.padding_side, also=also, **dict(method.options),
            )
        except FileNotFoundError as err:
            last_error = err
    raise FileNotFoundError(f"cannot load the source model of this artifact ({', '.join(candidates)}): {last_error}")


def verify(directory: str | os.PathLike[str], progress: Progress | None = None) -> VerifyResult:
    """Re-run the parity gate of an existing artifact against a freshly built PyTorch reference."""
    progress = progress or silent
    directory = Path(directory).expanduser()
    manifest = load_manifest(directory)
    progress("check", "checking file hashes")
    file_problems = check_files(directory, manifest)
    if file_problems:  # a damaged graph or tokenizer cannot be run meaningfully: report, don't crash
        return VerifyResult(directory, manifest, None, file_problems, [])
    progress("load", f"loading the reference {manifest.source.model}")
    reference = reference_for(manifest)
    source_problems = []
    now = source_record(reference)
    if now["config_sha256"] != manifest.source.config_sha256:
        source_problems.append("the source model's config changed since export (config_sha256 differs)")
    # as at export: the reference runs the gate's batches first and its weights are freed before
    # onnxruntime opens the artifact, so the model is never in memory twice
    progress("reference", "running the PyTorch reference on the parity texts")
    references, cache, texts = reference.references(), {}, model_gate_texts(reference)
    unseen = held_out_texts(manifest.precision in HELD_OUT_DECIDES)  # the set the export ran, int8's the wider
    checks = [(target, bar, None) for target, bar in GATES[manifest.precision]]  # group None: the gate's own
    checks += advisory_checks(manifest.precision)
    ever_decides = any(held_out_decides(manifest.precision, group is not None) for _, _, group in checks)
    for label, single in references.items():
        run_on = {**texts, **unseen} if ever_decides and label is None else texts
        reference_runs(single, cache, texts=run_on, outputs=output_names(label), advance=advance_of(progress))
    reference.model.to("meta")
    gc.collect()
    encoder = encoder_from_manifest(directory, manifest)
    gates: list[tuple[str, str, dict[str | None, ParityReport]]] = []
    advisory: dict[str, ParityReport | str] = {}
    certificates, passed, held_out = [], {}, {}
    for target, bar, group in checks:
        advised = group is not None
        problem = advisory_problem(target, manifest, passed.get(group)) if advised else None
        if problem is not None:
            advisory[target] = problem
            continue
        graph = gate_graph(directory, manifest, target)
        progress("parity", f"running {graph.name} on {target} against PyTorch ({bar} bar)")
        session = gate_session(target, graph)
        ran = ran_precision(session, manifest.graph_precision)
        gated = parity_reports(session, encoder, references, bar, cache=cache, advance=advance_of(progress), texts=texts)
        deciding = held_out_decides(manifest.precision, advised)
        if deciding and gated[None].passed:
            held_out[target] = run_parity(session, encoder, references[None], bar, texts=unseen, cache=cache)
        del session
        held = held_out[target].passed if target in held_out else not deciding
        if advised:
            advisory[target] = gated[None]
        else:
            gates.append((target, ran, gated))
        if advised and held and all(r.passed for r in gated.values()):
            passed[group] = target  # the later alternatives of its group are not needed
        # only a check of the exported files against the exported model's reference certifies anything
        if not source_problems and held and all(r.passed for r in gated.values()):
            certificates.append(certificate(target, ran, gated[None], extra={"graph": graph.name} if advised else None,
                                            held_out=held_out.get(target)))
    first, _, reports = gates[0]
    reports = dict(reports)
    report = reports.pop(None)
    return VerifyResult(directory, manifest, report, file_problems, source_problems, reports, first,
                        {target: gated[None] for target, _, gated in gates[1:]}, advisory, certificates, held_out)
