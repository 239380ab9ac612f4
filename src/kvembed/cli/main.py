"""The kvembed command line: export training-free LLM embedding methods as ONNX artifacts, then
embed, verify, evaluate, benchmark and serve them (kvembed embed tries a method by hand)."""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

from ..extras import install_hint

try:
    import typer
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
except ImportError as err:  # pragma: no cover - only without the cli extra
    raise SystemExit(f"the kvembed command line needs typer and rich: {install_hint('cli')} ({err})")

from ..artifact.layout import ARTIFACT_FILES, is_artifact
from ..backends.catalogue import PROVIDER_HELP
from ..status import waiting
from ..errors import InvalidInput
from . import options as opt
from .status import STATUS_HELP, runtime_of
from .sign import TRUST_KEY_ENV, TrustKey, check_trusted, trusted
from .support import DEBUG_HELP, errors, guard_app, run_app, version_option
from .tables import fitted_tables

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, epilog=f"{DEBUG_HELP}\n\n{STATUS_HELP}")
console = Console()


@app.callback()
def _group(version: bool = version_option()) -> None:
    """kvembed: training-free LLM text embeddings."""


def check_artifact_argument(first: str | None) -> str:
    """The artifact directory named by the first positional argument, or an InvalidInput saying what
    an artifact is and how to embed with a PyTorch model instead."""
    if first is None:
        raise InvalidInput("give an artifact directory and texts (kvembed embed ARTIFACT TEXT...) or a model "
                           "with --model (kvembed embed --model stories260k TEXT...)")
    if is_artifact(first):
        return first
    where = Path(first).expanduser()
    if where.is_dir():
        raise InvalidInput(f"{first!r} is a directory but not a kvembed artifact (no kvembed.json); an artifact "
                           f"directory holds {ARTIFACT_FILES}; to embed with the PyTorch model in a model "
                           f"folder, use --model {first}")
    if where.exists() or os.sep in first or "/" in first or first.startswith((".", "~")):
        raise InvalidInput(f"no kvembed artifact at {first!r}; an artifact directory holds {ARTIFACT_FILES}")
    raise InvalidInput(f"{first!r} is not an artifact directory: kvembed embed ARTIFACT TEXT... embeds with an "
                       f"exported artifact; to embed texts with a PyTorch model, name it with --model "
                       f"(e.g. kvembed embed --model stories260k {first!r})")


@app.command()
@opt.method_flags
def embed(
    texts: Optional[list[str]] = typer.Argument(None, help="ARTIFACT TEXT... (torch-free runtime), or TEXT... with --model."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Embed with the PyTorch reference of this model folder, alias (stories260k) or hub id; all arguments are then texts."),
    method: Optional[str] = typer.Option(None, "--method", help=f"Embedding method with --model: {opt.METHOD_NAMES} (default kv-embedding); an artifact fixes it."),
    kind: str = typer.Option("document", "--kind", help="The prompt: query, document, or a named prompt of the artifact (a trained embedder's, e.g. sts_query)."),
    options: opt.MethodOptions = opt.METHOD_FLAGS,
    max_length: Optional[int] = typer.Option(None, help="Truncate inputs to this many tokens (with --model)."),
    input: Optional[Path] = typer.Option(None, "--input", "-i", help="Read texts from a .txt (one per line) or .jsonl file, or - for standard input."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write embeddings to a .npy or .jsonl file."),
    batch_size: int = typer.Option(32, help="Rows per batch."),
    provider: str = typer.Option("auto", help=f"Runtime provider: {PROVIDER_HELP}."),
    ov_precision: opt.OvPrecision = None,
    threads: Optional[int] = typer.Option(None, help="Runtime intra-op threads."),
    similarity: bool = typer.Option(False, "--similarity", help="Print the cosine similarity matrix."),
    use: Optional[str] = typer.Option(None, "--use", help="Artifact output to embed with: an --also label (default: the main method)."),
    trust_key: TrustKey = None,
    windows: bool = typer.Option(False, "--windows", help="Embed a text longer than the artifact's max_length whole, as windows that each fit, averaged into one vector (default: cut it, with a warning)."),
    precision: str = typer.Option("float32", "--precision", help="Vector type, as sentence-transformers names it: float32, int8 or uint8 (levels of the artifact's vector ranges), binary or ubinary (one bit per dimension, packed into bytes)."),
) -> None:
    """Embed texts with an exported artifact (torch-free runtime) or a model's PyTorch reference.

    kvembed embed ARTIFACT "text" ... | kvembed embed --model stories260k --method va "text" ...
    | kvembed embed ARTIFACT --input texts.txt --output vectors.npy
    """
    import numpy as np

    from ..runtime.quantize import check_vector_type, width_of
    from ..runtime.textio import TextRecords, check_input_path, check_output_path, count_lines, is_stdin, write_embeddings

    items = list(texts or [])
    opt.check_ov_precision(provider, ov_precision)
    vector_type = check_vector_type(precision, "--precision")
    if vector_type != "float" and similarity:
        raise InvalidInput("--similarity prints the cosines of float vectors: leave out --precision")
    if model is not None:
        source = model
    else:
        source = check_artifact_argument(items.pop(0) if items else None)
    artifact = is_artifact(source)
    if not artifact and trusted(trust_key) is not None:
        raise InvalidInput(f"--trust-key (or {TRUST_KEY_ENV}) admits only signed artifacts; {source!r} is not an "
                           "artifact directory (a PyTorch model carries no kvembed signature)")
    if (input is None) == (not items):
        raise InvalidInput("give texts as arguments or one --input file (not both, not neither)")
    if input is not None:
        check_input_path(input)
        if output is None and is_stdin(input):
            raise InvalidInput("--input - (standard input) needs --output FILE (.npy or .jsonl)")
    if output is not None:
        check_output_path(output)
    if artifact:
        from ..artifact import check_artifact_options, load_manifest

        check_trusted(source, trust_key)  # before the manifest is read: an untrusted artifact is not parsed
        manifest = load_manifest(source)  # read once: every step below is handed it
        check_artifact_options(manifest, method, options, max_length)
        from ..backends.catalogue import hint_options
        from ..runtime import Embedder

        embedder: Any = Embedder.load(manifest, provider=provider, threads=threads, options=hint_options(ov_precision))
        embedder.dim_of(use)  # an unknown label fails here, naming the artifact's outputs
        errors.print(escape(embedder.runtime_line()), highlight=False, soft_wrap=True)
    else:
        if use is not None:
            raise InvalidInput("--use picks an output of an artifact exported with --also; give the artifact directory")
        if windows:
            raise InvalidInput("--windows runs with an artifact (the torch-free runtime); give the artifact directory")
        if vector_type != "float":
            raise InvalidInput("--precision runs with an artifact (its vector ranges are in its manifest); give the artifact directory")
        from ..modeling.sources import preflight

        preflight(source, method or "kv-embedding", options)  # a bad option fails now, not after loading
        with waiting(f"loading {source} with PyTorch"):
            from ..modeling.reference import TorchEmbedder

            embedder = TorchEmbedder.from_pretrained(source, method or "kv-embedding", max_length=max_length, **options)
        errors.print(escape(runtime_of(embedder, f"reference of {source}")), highlight=False, soft_wrap=True)
    title = f"{use or embedder.method.name} on {source}"
    extra: dict[str, Any] = {} if use is None else {"output": use}
    if windows:
        extra["windows"] = True
    dtype = "float32" if vector_type == "float" else vector_type
    if vector_type != "float":
        extra["precision"] = vector_type
    if input is not None:
        target = output if output is not None else input.with_suffix(".npy")
        if output is None:
            errors.print(f"no --output given: writing {target}", highlight=False, soft_wrap=True)
        total = count_lines(input)
        records = TextRecords(input, track_ids=target.suffix == ".jsonl")
        bar = sys.stderr.isatty()  # a progress bar on a terminal; piped, a status line
        if hasattr(embedder, "encode_stream"):
            chunks = embedder.encode_stream(records, kind=kind, batch_size=batch_size, show_progress_bar=bar, **extra)
        else:
            chunks = (embedder.encode(chunk, kind=kind, batch_size=batch_size) for chunk in _chunked(records, 4096))
        lines = "" if total is None else f"{total:,} lines of "
        with nullcontext() if bar else waiting(f"embedding the {lines}{input}"):
            rows, dim = write_embeddings(target, chunks, width_of(vector_type, embedder.dim_of(use)), ids=records)
        read = "standard input" if total is None else f"{total} input lines"
        console.print(f"{title}: wrote {rows} x {dim} {dtype} embeddings of {read} to {target}", highlight=False)
        return
    with waiting(f"embedding {len(items)} text(s)"):
        vectors = embedder.encode(items, kind=kind, batch_size=batch_size, **extra)
    if output is not None:
        rows, dim = write_embeddings(output, [vectors], vectors.shape[1])
        console.print(f"wrote {rows} x {dim} {dtype} to {output}")
    table = Table(title=f"{title}: {vectors.shape[0]} x {vectors.shape[1]}")
    table.add_column("#", justify="right")
    table.add_column("text")
    table.add_column("norm", justify="right")
    table.add_column("first values")
    for i, (text, vector) in enumerate(zip(items, vectors)):
        short = text if len(text) <= 40 else text[:37] + "..."
        if vector.dtype.kind == "f":
            table.add_row(str(i), short, f"{np.linalg.norm(vector):.4f}", " ".join(f"{x:+.4f}" for x in vector[:6]))
        else:  # a quantized vector type: integers, no norm to speak of
            table.add_row(str(i), short, "-", " ".join(f"{int(x):+d}" for x in vector[:8]))
    console.print(table)
    if similarity:
        sim = vectors @ vectors.T
        rows = [[str(i), *(f"{x:.4f}" for x in row)] for i, row in enumerate(sim)]
        for matrix in fitted_tables("cosine similarity", [""], [str(i) for i in range(len(items))], rows, console.width):
            console.print(matrix)


def _chunked(items: Any, size: int) -> Any:
    chunk: list[str] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


#: commands that live in their own modules: (command name, module, attribute). Each module imports
#: only typer/rich at the top (heavy imports happen inside the command), so ``kvembed --help`` stays fast.
#: An attribute that is a ``typer.Typer`` becomes a command group (``kvembed NAME SUBCOMMAND``).
SUBCOMMANDS: tuple[tuple[str, str, str], ...] = (
    ("verify", "kvembed.cli.export", "verify_command"),
    ("bench", "kvembed.cli.bench", "bench_command"),
    ("serve", "kvembed.cli.serve", "serve_command"),
    ("triton", "kvembed.cli.triton", "app"),
    ("embed-corpus", "kvembed.cli.corpus", "embed_corpus_command"),
    ("eval", "kvembed.cli.eval", "eval_command"),
    ("export", "kvembed.cli.export", "app"),
    ("layers", "kvembed.cli.layers", "layers"),
    ("build-engine", "kvembed.cli.engine", "build_engine_command"),
    ("causal2vec", "kvembed.cli.causal2vec", "app"),
    ("bundle", "kvembed.cli.bundle", "bundle_command"),
    ("sign", "kvembed.cli.sign", "sign_command"),
)


def _register_subcommands() -> None:
    import importlib

    for name, module_name, attribute in SUBCOMMANDS:
        target = getattr(importlib.import_module(module_name), attribute)
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=name)
        else:
            app.command(name, help=target.__doc__)(target)


_register_subcommands()
guard_app(app)  # every command: one-line errors, exit 2 (1 for a failed check), --debug for tracebacks


def main() -> None:
    run_app(app, prog_name="kvembed")


if __name__ == "__main__":
    sys.exit(main())
