"""``kvembed embed-corpus``: embed files of documents into Parquet shards, locally or on Ray.

Importing this module loads only typer and rich (it is imported by every ``kvembed`` call).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from ..backends.catalogue import PROVIDER_HELP
from ..corpus.signals import Terminated, die_by_signal, sigterm_as_interrupt
from .status import print_corpus_runtime
from .support import EXIT_INTERRUPTED, fail, run_guarded

console = Console()


def embed_corpus_command(
    artifact: Optional[Path] = typer.Argument(None, show_default=False, help="Artifact directory written by kvembed-export (with --resume: the recorded one)."),
    input: Optional[list[str]] = typer.Option(None, "--input", "-i", show_default=False, help="Input file, directory or glob (repeatable); .parquet, .jsonl or .txt (with --resume: the recorded ones)."),
    output: Path = typer.Option(..., "--output", "-o", help="Directory for the Parquet shards, _manifest.json and _SUCCESS."),
    text_column: Optional[str] = typer.Option(None, "--text-column", show_default="text", help="Column (Parquet) or key (JSONL) holding the text."),
    id_column: Optional[str] = typer.Option(None, "--id-column", help="Column/key holding ids (default: 'id' if every input has it, else file:line row ids)."),
    kind: Optional[str] = typer.Option(None, "--kind", show_default="document", help="document or query: which prompt the artifact's method uses."),
    format: Optional[str] = typer.Option(None, "--format", help="parquet, jsonl or txt (default: from the file suffix)."),
    runner: Optional[str] = typer.Option(None, "--runner", help="local (this process, the default) or ray (Ray Data actors)."),
    engine: Optional[str] = typer.Option(None, "--engine", hidden=True, help="Old name of --runner."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Ray cluster to join: auto or HOST:PORT (default: start a local Ray)."),
    workers: Optional[int] = typer.Option(None, "--workers", show_default="1", help="Ray actors, each with its own Embedder (--runner ray)."),
    threads_per_worker: Optional[int] = typer.Option(None, "--threads-per-worker", help="onnxruntime threads (= Ray CPUs) per worker (default: cores / workers)."),
    provider: Optional[str] = typer.Option(None, "--provider", show_default="auto", help=f"Runtime provider of every worker: {PROVIDER_HELP}."),
    max_batch_tokens: Optional[int] = typer.Option(None, "--max-batch-tokens", show_default="16384", help="Padded tokens (rows x longest row) per batch of length-sorted texts; the runtime runs a batch in graph calls of at most its per-call budget."),
    batch_tokens: Optional[int] = typer.Option(None, "--batch-tokens", hidden=True, help="Old name of --max-batch-tokens."),
    rows_per_file: Optional[int] = typer.Option(None, "--rows-per-file", show_default="100000", help="Input rows per output shard (shards never span two input files)."),
    resume: bool = typer.Option(False, "--resume", help="Finish an interrupted run in --output: finished shards are kept, and the options its _run.json records are used (an option given again must not change what the shards hold)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete an earlier run in --output (its shards and records) and start again."),
    output_dtype: Optional[str] = typer.Option(None, "--output-dtype", show_default="float32", help="float32 or float16 vectors."),
    on_error: Optional[str] = typer.Option(None, "--on-error", show_default="fail", help="fail on the first bad record, or skip and count bad records in the manifest."),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress", help="Progress bar (default: when stderr is a terminal)."),
) -> None:
    """Embed a corpus (Parquet, JSONL or TXT files) into Parquet shards of (id, embedding).

    kvembed embed-corpus ARTIFACT --input 'docs/*.parquet' --output vectors/
    | kvembed embed-corpus ARTIFACT -i docs.jsonl -o vectors/ --runner ray --workers 4 --threads-per-worker 2
    | kvembed embed-corpus --resume -o vectors/
    """

    if runner is not None and engine is not None and runner != engine:
        raise fail(f"--runner {runner} and --engine {engine} (its old name) differ: give --runner only")

    def run() -> dict[str, Any]:
        try:
            from ..corpus import CorpusOptions, embed_corpus
            from ..corpus.resume import REQUIRED, flag, resume_options
        except ImportError as err:
            from ..errors import MissingDependency
            from ..extras import install_hint

            raise MissingDependency(f"kvembed embed-corpus needs pyarrow: {install_hint('corpus')} ({err})") from None

        # only the options given on this command line: the rest are the defaults, or with --resume the recorded ones
        given = {name: value for name, value in dict(
            artifact=artifact, inputs=tuple(input) if input else None, text_column=text_column, id_column=id_column, kind=kind,
            format=format, runner=runner or engine, ray_address=ray_address, workers=workers, threads=threads_per_worker,
            provider=provider, max_batch_tokens=max_batch_tokens if max_batch_tokens is not None else batch_tokens,
            rows_per_file=rows_per_file, output_dtype=output_dtype, on_error=on_error,
        ).items() if value is not None}
        if resume:
            if overwrite:
                raise fail("--resume keeps an earlier run and --overwrite deletes it: pass one of them")
            options = resume_options(output, given, progress)
        else:
            missing = [flag(name) for name in REQUIRED if name not in given]
            if missing:
                raise fail(f"give {' and '.join(missing)} (or --resume to finish the run recorded in --output)")
            options = CorpusOptions(**given, output=output, overwrite=overwrite, progress=progress)
        try:
            with sigterm_as_interrupt():  # a scheduler's stop is handled like Ctrl-C
                return embed_corpus(options)
        except KeyboardInterrupt as err:
            from ..corpus.output import interrupted_advice

            stop = fail(f"{_stopped_by(err)}: {interrupted_advice(output)}", EXIT_INTERRUPTED)
            if isinstance(err, Terminated):
                die_by_signal(err.signum)
            raise stop from None

    manifest = run_guarded(run)
    print_corpus_runtime(manifest)  # what the workers ran the artifact on, and why
    seconds = manifest["wall_time_s"]
    resumed = f", {manifest['shards_resumed']} shards from an earlier run" if manifest["shards_resumed"] else ""
    resumed += f", {manifest['shards_replaced']} shards of an earlier run deleted" if manifest["shards_replaced"] else ""
    console.print(
        f"embedded {manifest['rows']:,} rows ({manifest['tokens']:,} tokens, {manifest['truncated']:,} truncated, "
        f"{manifest['skipped']['count']:,} skipped) into {len(manifest['shards'])} shards in {output}{resumed}; "
        f"{seconds:.1f}s",
        highlight=False, soft_wrap=True,
    )


def _stopped_by(err: KeyboardInterrupt) -> str:
    return "interrupted (SIGTERM)" if isinstance(err, Terminated) else "interrupted"
