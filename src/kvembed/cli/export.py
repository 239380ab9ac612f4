"""``kvembed export`` (alias ``kvembed-export``): turn a model + method into a portable ONNX embedding artifact."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Optional

from ..extras import install_hint

try:
    import typer
    from rich.console import Console
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
except ImportError as err:  # pragma: no cover - only without the cli extra
    raise SystemExit(f"kvembed-export needs typer and rich: {install_hint('export')} ({err})")

from ..artifact import MANIFEST, SIGNATURE, HeldOut, Manifest
from ..methods.registry import DEFAULT_METHOD
from ..export.gate.targets import TARGETS
from ..backends.cpu import HINT_NEEDS
from ..status import waiting
from . import options as opt
from .status import Waits
from .sign import TrustKey, check_trusted
from .tables import fitted_tables
from .support import DEBUG_HELP, EXIT_FAILED, default_command_group, guard_app, run_app

console = Console()
errors = Console(stderr=True)
VERIFY_HINT = "kvembed export verify DIR (or kvembed-export verify DIR) re-checks an artifact."

class StageDisplay:
    """The pipeline's stages (``progress(stage, detail)``) as steps of the command's status display
    (:class:`~kvembed.cli.status.Waits`: a spinner on a terminal with the time left of a long
    stage, a whole line on stderr when piped), and after each stage a line with its time in the
    command's report on stdout. Stage details are text, never rich markup (an install hint's
    ``[openvino]`` stays)."""

    def __init__(self) -> None:
        self.own: Waits | None = None
        self.waits: Waits | None = None
        self.current: str | None = None
        self.stage_start = time.monotonic()

    def __enter__(self) -> "StageDisplay":
        self.waits = Waits.active()
        if self.waits is None:  # called outside a kvembed command (a test, a script)
            self.own = self.waits = Waits().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._finish_stage(ok=exc[0] is None)
        if self.own is not None:
            self.own.__exit__(*exc)

    def __call__(self, stage: str, detail: str) -> None:
        self._finish_stage(ok=True)
        self.current = f"{stage}: {detail}"
        self.stage_start = time.monotonic()
        if self.waits is not None:
            self.waits.begin(self.current)

    def advance(self, done: int, total: int) -> None:
        """A long stage's share done: the spinner gets the percentage and the time left,
        estimated from the stage's pace so far."""
        if self.waits is None or self.current is None or total <= 0 or done <= 0:
            return
        took = time.monotonic() - self.stage_start
        left = took / done * max(total - done, 0)
        self.waits.update(self.current, f"{100 * done / total:.0f}%, about {_duration(left)} left")

    def _finish_stage(self, ok: bool) -> None:
        if self.current is None:
            return
        if self.waits is not None:
            self.waits.end(self.current, ok, quiet=True)
        mark = "[green]done[/]" if ok else "[red]stopped[/]"
        console.print(f"  {mark} {escape(self.current)} [dim]({time.monotonic() - self.stage_start:.1f}s)[/]",
                      highlight=False, soft_wrap=True)
        self.current = None


def _int8_recipe_help() -> str:
    from ..export.precision.convert import int8_recipe_help  # torch-free

    return int8_recipe_help()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def parity_table(report: Any, title: str) -> Group:
    """A parity report's worst cosine and largest difference per case, then over all rows with the
    bars they had to meet; every number whole at any width (:func:`~kvembed.cli.tables.fitted_tables`)."""
    rows = [[case, f"{values['worst_cosine']:.7f}", f"{values['max_abs_diff']:.3g}"] for case, values in report.by_case.items()]
    need = f">= {report.min_cosine_required}"
    limit = "" if report.max_abs_allowed is None else f"<= {report.max_abs_allowed:g}"
    state = "[green]passed[/]" if report.passed else "[red]FAILED[/]"
    summary = [f"all ({report.rows} rows) {state}", f"{report.worst_cosine:.7f} ({need})", f"{report.max_abs_diff:.3g} {limit}".strip()]
    return Group(*fitted_tables(title, ["case"], ["worst cosine", "max abs diff"], rows, console.width, summary=summary))


def held_out_line(held_out: HeldOut, gate_cosine: float) -> str:
    """The held-out figure beside the gate's: texts the calibration never saw, which decide with the
    gate's where the precision says so (int8) and are reported only elsewhere."""
    bar = "meets" if held_out.meets_bar else "[bold yellow]misses[/]"
    figure = f"held out: worst cosine {held_out.worst_cosine:.7f} over {held_out.rows} rows of {held_out.texts} texts"
    if held_out.decides:
        return f"{figure} the calibration never saw (gate: {gate_cosine:.7f}; {bar} the gate's bar, deciding with the gate)"
    return f"{figure} the gate never decided on (gate: {gate_cosine:.7f}; {bar} the gate's bar, reported only)"


def decided_line(target: str, sets: Mapping[str, Mapping[str, Any]]) -> str:
    """Which texts decided ``target``'s verdict, each set with its worst cosine."""
    from ..artifact.certificates import decided_phrase

    return f"{target} decided by {decided_phrase(sets)}"


def lengths_line(manifest: Manifest) -> str:
    """How long the gate's inputs were: a certificate says nothing about longer ones."""
    longest, window = manifest.parity.gate.longest_tokens, manifest.source.raw.get("sliding_window")
    past = f", past the model's {window}-token sliding window" if window and longest > window else ""
    return f"gate lengths: inputs up to {longest} tokens (prompt included) of max_length {manifest.max_length}{past}"


def advisory_line(target: str, advised: Any, graph: str | None, held_out_missed: float | None = None) -> str:
    """One advisory check (an int8 artifact's OpenVINO graph, an fp16 artifact under the f16 or bf16 hint):
    its figure and whether it certified a faster path, or why it did not run; it never decides pass or fail.
    ``held_out_missed``: the held-out texts' worst cosine where they decided and missed the bar."""
    if isinstance(advised, str):
        return f"advisory {target}: not run ({escape(advised)})"
    needs = HINT_NEEDS.get(TARGETS[target].setting)
    where = f"on a CPU with {needs.upper()}" if needs else "where no faster path is certified"
    verdict = ("[bold yellow]below the bar[/]: not certified" if not advised.passed else
               f"[bold yellow]below the bar on the held-out texts[/] ({held_out_missed:.5f}): not certified"
               if held_out_missed is not None else f"certified: auto runs it {where}")
    return (f"advisory {target} on {graph}: worst cosine {advised.worst_cosine:.7f} vs PyTorch "
            f"(bar {advised.min_cosine_required}); {verdict}")


def print_extra_parity(reports: Any) -> None:
    """The parity table of every ``--also`` output (label -> ParityReport), and its problems."""
    for label, report in reports.items():
        console.print(parity_table(report, f"parity of extra output {label!r} vs its own PyTorch pass"))
        for problem in report.problems:
            errors.print(f"[bold red]problem:[/] {label}: {problem}", highlight=False)


def files_table(directory: Path, manifest: Manifest) -> Table:
    table = Table(title=f"artifact {directory}")
    table.add_column("file")
    table.add_column("size", justify="right")
    table.add_column("sha256")
    for name, record in manifest.files.items():
        table.add_row(name, _size(record.size), record.sha256[:16] + "...")
    manifest_path = directory / MANIFEST
    if manifest_path.exists():
        table.add_row(MANIFEST, _size(manifest_path.stat().st_size), "(manifest)")
    return table


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@opt.method_flags
def export_command(
    model: str = typer.Option(..., "--model", "-m", help="Model folder, alias (stories260k, qwen3-4b) or hub id."),
    method: Optional[str] = typer.Option(None, "--method", help=f"Embedding method: {opt.METHOD_NAMES} (default {DEFAULT_METHOD})."),
    out: Path = typer.Option(..., "--out", "-o", help="Artifact directory to create (must be empty unless --force)."),
    options: opt.MethodOptions = opt.METHOD_FLAGS,
    also: Optional[list[str]] = typer.Option(
        None, "--also", help="Add the outputs of another method read from the same forward pass: "
        "METHOD[:option=value...] or LABEL=METHOD[:...], e.g. 'mean', 'va:layers=8-12'; repeatable.",
    ),
    precision: str = typer.Option("fp32", "--precision", help="fp32, fp16, bf16 (the fp32 graph, gated and run on OpenVINO with the bf16 hint; needs a CPU with BF16) or int8."),
    certify_emulated: bool = typer.Option(
        False, "--certify-emulated", help="bf16 on a CPU without BF16: gate it as OpenVINO runs it there (f32) and say so in its certificate, instead of refusing.",
    ),
    int8_recipe: str = typer.Option(
        "auto", "--int8-recipe", help=_int8_recipe_help(),
    ),
    max_length: Optional[int] = typer.Option(None, help="Truncate inputs to this many tokens (default: the model's limit)."),
    opset: Optional[int] = typer.Option(None, help="ONNX opset (default: 23 with fused attention, 18 with decomposed)."),
    attention: Optional[str] = typer.Option(
        None, "--attention", help="fused (one standard Attention op per layer, opset 23; onnxruntime >= 1.23.1, "
        "TensorRT >= 10.14) or decomposed (MatMul/Softmax, opset 18). Default: decomposed with an --opset below 23, else fused where this onnxruntime runs it.",
    ),
    padding_side: str = typer.Option("right", help="Padding side the artifact's runtime uses (right or left)."),
    no_optimize: bool = typer.Option(False, "--no-optimize", help="Skip onnxruntime's offline basic graph optimisation."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --out."),
    skip_memory_check: bool = typer.Option(
        False, "--skip-memory-check", help="export even if the estimated peak memory exceeds what is available",
    ),
) -> None:
    """Export MODEL computing METHOD as an ONNX artifact in OUT, gated on parity with PyTorch."""
    from ..export.request import ExportRequest

    defaulted = method is None
    if defaulted:  # a trained embedder's folder computes its own recipe; anything else the default method
        from ..methods.models import is_trained_embedder
        from ..methods.sentence_transformers import is_folder

        method = "st" if is_folder(model) or is_trained_embedder(model) else DEFAULT_METHOD

    def preflight() -> ExportRequest:  # cheap checks before importing torch or loading weights: the request, checked once
        from ..methods import get_method
        from ..methods.sharing import parse_also
        from ..modeling.sources import preflight as check_model

        get_method(method)
        for item in also or []:
            get_method(parse_also(item).method)
        request = ExportRequest.checked(
            out, precision, force=force, int8_recipe=int8_recipe, certify_emulated=certify_emulated, attention=attention,
            opset=opset, model=model, method=method, max_length=max_length, padding_side=padding_side,
            optimize=not no_optimize, check_memory=not skip_memory_check, also=list(also or []), **options,
        )
        check_model(model, method, options, list(also or []))
        return request

    request = preflight()
    console.print(f"[bold]kvembed-export[/] {method} on {model} -> {out} ({precision})", highlight=False)

    def job() -> Any:
        import logging
        import warnings

        from ..export.core import run_export
        from ..artifact.staging import LeftoverWarning
        from ..export.memory import MemoryEstimateWarning
        from ..signals import sigterm_as_interrupt

        logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
        # a scheduler's or timeout's SIGTERM is taken like Ctrl-C: the staging directory and the traced
        # graph (several times the model's size on disk) are removed, not left behind
        with sigterm_as_interrupt(), warnings.catch_warnings(), StageDisplay() as display:
            warnings.simplefilter("ignore")
            warnings.simplefilter("default", MemoryEstimateWarning)  # "exporting unchecked" is news
            warnings.simplefilter("default", LeftoverWarning)  # so are gigabytes a killed export left
            return run_export(request, progress=display)

    start = time.monotonic()
    result = job()
    manifest = result.manifest  # typed: the Manifest the exporter wrote
    print_report(result.path, manifest)
    graph = manifest.graph.raw
    console.print(
        f"dim {manifest.dim}, {manifest.graph.decoder_layers} of {manifest.method.num_layers} "
        f"decoder layers, {graph['nodes']} nodes, attention {manifest.graph.attention_form} (opset {manifest.opset}"
        f"{'; ' + str(graph['attention']['why']) if isinstance(graph.get('attention'), dict) and graph['attention'].get('why') else ''}), "
        f"TensorRT-ready: {'yes' if graph['tensorrt_ready'] else 'no (' + (', '.join(graph['non_portable_ops']) or manifest.precision) + ')'}; "
        f"exported in {time.monotonic() - start:.1f}s",
        highlight=False,
    )
    console.print(method_line(manifest.method.name, defaulted), highlight=False)


def print_report(directory: Path, manifest: Manifest) -> None:
    """The export's report (:class:`~kvembed.artifact.report.ExportReport`) as the summary shows it:
    the files, each target's parity table, the advisory checks, the held-out figure, the lengths
    the gate vouches for, the certificates and the extra outputs."""
    report = manifest.parity
    console.print(files_table(directory, manifest))
    console.print(parity_table(report.gate, f"parity vs PyTorch ({manifest.precision} on {report.target})"))
    for target, gated in report.gates.items():
        console.print(parity_table(gated, f"parity vs PyTorch ({gated.precision} on {target})"))
    for target, advised in report.advisory.items():
        console.print(advisory_line(target, advised.skipped if advised.report is None else advised.report,
                                    advised.graph, advised.held_out_missed), highlight=False)
    if report.held_out is not None:
        console.print(held_out_line(report.held_out, report.gate.worst_cosine), highlight=False)
    console.print(lengths_line(manifest), highlight=False)
    for certified in manifest.certified:
        console.print(f"certified: {escape(certified.describe())}", highlight=False)
    print_extra_parity(report.also)
    if report.timings:
        stages = ", ".join(f"{stage} {seconds:.1f}s" for stage, seconds in report.timings.items())
        console.print(f"time by stage: {stages}", highlight=False)


def method_line(method: str, defaulted: bool) -> str:
    """The summary's last line: the method the artifact computes and, when ``--method`` was left
    out, that it was the default and how to choose another."""
    if not defaulted:
        return f"method: {method}"
    if method == "st":
        return ("method: st (the sentence-transformers folder's own pooling and prompts; --method chooses a training-free "
                "method instead, computed on the same decoder)")
    others = ", ".join(name for name in opt.METHOD_NAMES.split(", ") if name != method)
    return (f"method: {method} (the default; --method chooses another: {others}; "
            f"kvembed export --help lists them and their options)")


def verify_command(
    directory: Path = typer.Argument(..., help="Artifact directory written by kvembed-export."),
    backends: opt.Backends = "auto",
    no_compare: opt.NoCompare = False,
    record: opt.Record = False,
    trust_key: TrustKey = None,
) -> None:
    """Re-run the parity check of an existing artifact against a freshly built PyTorch reference,
    then compare the graph across the backends present (polygraphy); --record keeps what passed.
    With --trust-key the artifact's signature is checked first."""
    check_trusted(directory, trust_key)  # before the slow part: an untrusted artifact is not verified
    report_result = run_verify(directory, backends=backends, compare=not no_compare, record=record)
    if record and (directory / SIGNATURE).is_file():
        errors.print(f"note: {SIGNATURE} does not cover what --record adds to {MANIFEST}: a trust key refuses the "
                     f"artifact until it is signed again (kvembed sign {directory} --private-key KEY.pem)", highlight=False, soft_wrap=True)
    if not report_result.passed:
        raise typer.Exit(EXIT_FAILED)


class VerifyOutcome:
    """``run_verify``'s result: the parity :class:`~kvembed.export.gate.verification.VerifyResult` (its attributes
    are readable here too) and the backend comparison (None when not run); passed only if both pass."""

    def __init__(self, result: Any, comparison: Any = None) -> None:
        self.result = result
        self.comparison = comparison

    @property
    def passed(self) -> bool:
        return bool(self.result.passed) and (self.comparison is None or self.comparison.passed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.result, name)


def comparison_table(comparison: Any) -> Group:
    """Each pair of backends: worst cosine, largest difference, polygraphy's verdict and the overall one."""
    tol = comparison.tolerance
    title = (f"backends vs {comparison.backends[0]} ({comparison.precision}, polygraphy: atol {tol['atol']:g}, "
             f"rtol {tol['rtol']:g}; cosine >= {tol['min_cosine']})")
    rows = [[escape(pair.name), f"{pair.worst_cosine:.7f}", f"{pair.max_abs_diff:.3g}",
             "[green]passed[/]" if pair.polygraphy_passed else "[red]FAILED[/]",
             "[green]passed[/]" if pair.passed else "[red]FAILED[/]"] for pair in comparison.pairs]
    return Group(*fitted_tables(title, ["pair"], ["worst cosine", "max abs diff", "polygraphy", "verdict"], rows, console.width))


def _selected_backends(directory: Path, backends: str) -> list[str]:
    """Validate ``--backends`` before the slow parity run: unknown or absent backends exit 2."""
    from ..export.gate.runners import resolve_backends

    return resolve_backends(directory, backends)[0]


def run_compare(directory: Path, backends: str = "auto") -> Any:
    """The backend comparison of ``kvembed verify``: prints its table (or why nothing was compared)."""
    from ..export.gate.compare import compare_backends

    names = _selected_backends(directory, backends)
    if len(names) < 2:
        which = names[0] if names else "no backend"
        where = "is present" if "auto" in [b.strip() for b in backends.lower().split(",")] else "was selected"
        console.print(f"only {which} {where}: nothing to compare", highlight=False)
        return None
    with waiting(f"compare: running the graph on {', '.join(names)}"):
        comparison = compare_backends(directory, backends)
    if comparison.pairs:
        console.print(comparison_table(comparison))
    for pair in comparison.pairs:
        if not pair.passed and pair.worst_row:
            row = pair.worst_row
            errors.print(
                f"[bold red]problem:[/] {escape(pair.name)}: worst row is {row['text']!r} ({row['kind']}, "
                f"{row['padding_side']}-padded, batch of {row['batch_size']}) on output {row['output']!r}",
                highlight=False,
            )
    for name, reason in comparison.skipped.items():
        console.print(f"[dim]skipped {name}: {escape(reason)}[/]", highlight=False)
    for problem in comparison.problems + [p for pair in comparison.pairs for p in pair.problems]:
        errors.print(f"[bold red]problem:[/] {escape(problem)}", highlight=False)
    return comparison


def run_verify(directory: Path, backends: str = "auto", compare: bool = True, record: bool = False) -> Any:
    """Shared by ``kvembed verify`` and ``kvembed-export verify``: prints tables, returns a
    :class:`VerifyOutcome` (``.passed``: parity and, with ``compare``, the backend comparison).
    ``record``: write the certificates of what passed into the artifact's manifest."""
    if compare:
        _selected_backends(directory, backends)  # bad --backends: one line, exit 2, before the slow part

    def job() -> Any:
        import logging
        import warnings

        from ..export.gate.verification import verify

        logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
        with warnings.catch_warnings(), StageDisplay() as display:
            warnings.simplefilter("ignore")
            return verify(directory, progress=display)

    result = job()
    manifest = result.manifest  # typed: read once by verify
    console.print(
        f"{manifest.method.name} on {manifest.source.model} ({manifest.precision}, "
        f"exported with kvembed {manifest.kvembed_version})",
        highlight=False,
    )
    for problem in result.file_problems + result.source_problems:
        errors.print(f"[bold red]problem:[/] {problem}", highlight=False)
    if result.report is not None:
        console.print(parity_table(result.report, f"parity vs PyTorch ({manifest.precision} on {result.backend})"))
        for target, gated in result.gates.items():
            console.print(parity_table(gated, f"parity vs PyTorch ({gated.precision} on {target})"))
        for target in [result.backend, *result.gates, *result.advisory]:
            if result.decided_by(target):
                console.print(decided_line(target, result.decided_by(target)), highlight=False)
        if result.advisory:
            from ..export.gate.targets import TARGETS

            for target, advised in result.advisory.items():
                held = result.held_out.get(target)
                console.print(advisory_line(target, advised, manifest.graph_file(TARGETS[target].backend),
                                            held.worst_cosine if held is not None and not held.passed else None),
                              highlight=False)
        recorded = manifest.parity.gate
        console.print(f"at export: worst cosine {recorded.worst_cosine:.7f}, max abs diff {recorded.max_abs_diff:.3g}",
                      highlight=False)
        for problem in result.report.problems:
            errors.print(f"[bold red]problem:[/] {problem}", highlight=False)
    print_extra_parity(result.also)
    comparison = run_compare(directory, backends) if compare and result.report is not None else None
    outcome = VerifyOutcome(result, comparison)
    if record:
        record_passes(directory, result, comparison)
    state = "[green]verified[/]" if outcome.passed else "[bold red]verification FAILED[/]"
    console.print(f"{state} {directory}", highlight=False)
    return outcome


def record_passes(directory: Path, result: Any, comparison: Any) -> None:
    """``--record``: the certificates of every check that passed, added to the manifest (nothing
    from a damaged artifact or a changed source model), one line each."""
    from ..artifact import Certificate, record_certificates

    if result.file_problems:
        console.print("nothing recorded: the artifact's files do not match its manifest", highlight=False)
        return
    certificates = list(result.certificates) + (comparison.certificates() if comparison is not None else [])
    if not certificates:
        console.print("nothing recorded: no check passed", highlight=False)
        return
    record_certificates(directory, certificates)
    for item in certificates:
        console.print(f"recorded: {escape(Certificate.from_dict(item).describe())}", highlight=False)


#: ``kvembed export [OPTIONS]`` exports, ``kvembed export verify DIR`` re-checks an artifact;
#: ``kvembed-export`` is the same group as a program of its own
app = typer.Typer(
    add_completion=False, cls=default_command_group("export"),
    help="Export a model + method as an ONNX embedding artifact, gated on parity with PyTorch; verify DIR re-checks one.",
)
app.command("export", help=export_command.__doc__, epilog=f"{VERIFY_HINT}\n\n{DEBUG_HELP}", hidden=True)(export_command)
app.command("verify", help=verify_command.__doc__, epilog=DEBUG_HELP)(verify_command)
guard_app(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``kvembed-export``, the alias of ``kvembed export``."""
    run_app(app, argv, prog_name="kvembed-export")


if __name__ == "__main__":
    main()
