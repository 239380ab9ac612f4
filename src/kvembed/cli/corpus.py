"""``kvembed embed-corpus``: embed files of documents into Parquet shards, locally or on Ray.

Importing this module loads only typer and rich (it is imported by every ``kvembed`` call).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from ..corpus.options import CorpusOptions
from ..signals import sigterm_as_interrupt
from . import options as opt
from .status import print_corpus_runtime
from .sign import TrustKey, check_trusted
from .support import fail, interrupted, run_guarded

console = Console()


@opt.dataclass_flags(CorpusOptions, "settings")
def embed_corpus_command(
    artifact: Optional[Path] = typer.Argument(None, show_default=False, help="Artifact directory written by kvembed-export (with --resume: the recorded one)."),
    input: Optional[list[str]] = typer.Option(None, "--input", "-i", show_default=False, help="Input file, directory or glob (repeatable); .parquet, .jsonl or .txt (with --resume: the recorded ones)."),
    output: Path = typer.Option(..., "--output", "-o", help="Directory for the Parquet shards, _manifest.json and _SUCCESS."),
    settings: opt.Given = opt.GIVEN,
    trust_key: TrustKey = None,
) -> None:
    """Embed a corpus (Parquet, JSONL or TXT files) into Parquet shards of (id, embedding).

    kvembed embed-corpus ARTIFACT --input 'docs/*.parquet' --output vectors/
    | kvembed embed-corpus ARTIFACT -i docs.jsonl -o vectors/ --runner ray --workers 4 --threads-per-worker 2
    | kvembed embed-corpus --resume -o vectors/
    """

    def run() -> dict[str, Any]:
        try:
            from ..corpus import embed_corpus
            from ..corpus.resume import REQUIRED, flag, resume_options
        except ImportError as err:
            from ..errors import MissingDependency
            from ..extras import install_hint

            raise MissingDependency(f"kvembed embed-corpus needs pyarrow: {install_hint('corpus')} ({err})") from None

        # only the options given on this command line: the rest are the defaults, or with --resume the recorded ones
        given = dict(settings)
        resume, overwrite, progress = (given.pop(name, getattr(CorpusOptions, name)) for name in ("resume", "overwrite", "progress"))
        if artifact is not None:
            given["artifact"] = artifact
        if input:
            given["inputs"] = tuple(input)
        if resume:
            if overwrite:
                raise fail("--resume keeps an earlier run and --overwrite deletes it: pass one of them")
            options = resume_options(output, given, progress)
        else:
            missing = [flag(name) for name in REQUIRED if name not in given]
            if missing:
                raise fail(f"give {' and '.join(missing)} (or --resume to finish the run recorded in --output)")
            options = CorpusOptions(**given, output=output, overwrite=overwrite, progress=progress)
        check_trusted(options.artifact, trust_key)  # the artifact given or recorded, before any worker loads it
        try:
            with sigterm_as_interrupt():  # a scheduler's stop is handled like Ctrl-C
                return embed_corpus(options)
        except KeyboardInterrupt as err:
            from ..corpus.output import interrupted_advice

            raise interrupted(err, interrupted_advice(output)) from None

    manifest = run_guarded(run)
    print_corpus_runtime(manifest)  # what the workers ran the artifact on, and why
    seconds = manifest["wall_time_s"]
    resumed = f", {manifest['shards_resumed']} shards from an earlier run" if manifest["shards_resumed"] else ""
    resumed += f", {manifest['shards_replaced']} shards of an earlier run deleted" if manifest["shards_replaced"] else ""
    windowed = f"{manifest['windowed']:,} as windows, " if manifest.get("windowed") else ""
    console.print(
        f"embedded {manifest['rows']:,} rows ({manifest['tokens']:,} tokens, {windowed}{manifest['truncated']:,} truncated, "
        f"{manifest['skipped']['count']:,} skipped) into {len(manifest['shards'])} shards in {output}{resumed}; "
        f"{seconds:.1f}s",
        highlight=False, soft_wrap=True,
    )
    repeated = manifest.get("duplicate_ids") or {}
    if repeated.get("count"):
        examples = ", ".join(repr(value) for value in repeated["examples"])
        typer.echo(f"warning: {repeated['count']:,} ids are on more than one row ({repeated['rows']:,} rows in all; e.g. "
                   f"{examples}): --id-column is not unique in the input", err=True)
