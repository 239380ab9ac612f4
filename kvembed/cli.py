"""``kvembed`` command line: try methods by hand (``kvembed embed``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError as err:  # pragma: no cover - only without the cli extra
    raise SystemExit(f"the kvembed command line needs typer and rich: pip install 'kvembed[cli]' ({err})")

from . import cli_options as opt
from .cli_options import method_options

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()
errors = Console(stderr=True)

#: exceptions that carry a user-facing message: printed without a traceback, exit code 2
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, NotImplementedError)


@app.callback()
def _group() -> None:
    """kvembed: training-free LLM text embeddings."""


def run_guarded(job: Callable[[], Any]) -> Any:
    try:
        return job()
    except USER_ERRORS as err:
        errors.print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def is_artifact(path: str | None) -> bool:
    return path is not None and (Path(path) / "kvembed.json").is_file()


@app.command()
def embed(
    texts: Optional[list[str]] = typer.Argument(None, help="[ARTIFACT_DIR] TEXT...: texts, optionally after an artifact directory."),
    model: str = typer.Option("stories260k", "--model", "-m", help="Artifact dir (runtime), or model folder / alias / hub id (PyTorch reference)."),
    method: str = typer.Option("kv-embedding", "--method", help="Embedding method (reference only; an artifact fixes it)."),
    kind: str = typer.Option("document", "--kind", help="query or document (selects the prompt)."),
    layers: opt.Layers = None,
    bias: opt.Bias = None,
    num_prefix: opt.NumPrefix = None,
    prefix_rope: opt.PrefixRope = None,
    pooling: opt.Pooling = None,
    prompt: opt.Prompt = None,
    wva: opt.Wva = None,
    tp_start: opt.TpStart = None,
    tp_stop: opt.TpStop = None,
    exit_layer: opt.ExitLayer = None,
    max_length: Optional[int] = typer.Option(None, help="Truncate inputs to this many tokens (reference only)."),
    input: Optional[Path] = typer.Option(None, "--input", "-i", help="Read texts from a .txt (one per line) or .jsonl file."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write embeddings to a .npy or .jsonl file."),
    batch_size: int = typer.Option(32, help="Rows per batch."),
    provider: str = typer.Option("auto", help="Runtime provider: auto, cpu, cuda, tensorrt."),
    threads: Optional[int] = typer.Option(None, help="Runtime intra-op threads."),
    similarity: bool = typer.Option(False, "--similarity", help="Print the cosine similarity matrix."),
    use: Optional[str] = typer.Option(None, "--use", help="Artifact output to embed with: an --also label (default: the main method)."),
) -> None:
    """Embed texts with an exported artifact (torch-free runtime) or the PyTorch reference.

    kvembed embed DIR "text" ... | kvembed embed --model stories260k --method va "text" ...
    | kvembed embed DIR --input texts.txt --output vectors.npy
    """
    import numpy as np

    from .runtime.textio import check_output_path, count_lines, read_texts, write_embeddings

    items = list(texts or [])
    source = items.pop(0) if items and is_artifact(items[0]) else model
    options = method_options(locals())

    def load() -> Any:
        if (input is None) == (not items):
            raise ValueError("give texts as arguments or one --input file (not both, not neither)")
        if output is not None:
            check_output_path(output)
        if is_artifact(source):
            if options or max_length is not None:
                raise ValueError(f"an artifact fixes its method options; drop {', '.join(options) or '--max-length'} or re-export")
            from .runtime import Embedder

            loaded = Embedder.load(source, provider=provider, threads=threads)
            loaded.dim_of(use)  # an unknown label fails here, naming the artifact's outputs
            return loaded
        if use is not None:
            raise ValueError("--use picks an output of an artifact exported with --also; give the artifact directory")
        from .reference import TorchEmbedder

        return TorchEmbedder.from_pretrained(source, method, max_length=max_length, **options)

    embedder = run_guarded(load)
    title = f"{use or embedder.method.name} on {source}"
    extra = {} if use is None else {"output": use}
    if input is not None:
        total = run_guarded(lambda: count_lines(input) if input.is_file() else 0)
        stream = read_texts(input)
        if hasattr(embedder, "encode_stream"):
            chunks = embedder.encode_stream(stream, kind=kind, batch_size=batch_size, show_progress_bar=True, **extra)
        else:
            chunks = (embedder.encode(chunk, kind=kind, batch_size=batch_size) for chunk in _chunked(stream, 4096))
        target = output or input.with_suffix(".npy")
        rows, dim = run_guarded(lambda: write_embeddings(target, chunks))
        console.print(f"{title}: wrote {rows} x {dim} float32 embeddings of {total} input lines to {target}")
        return
    vectors = run_guarded(lambda: embedder.encode(items, kind=kind, batch_size=batch_size, **extra))
    if output is not None:
        rows, dim = write_embeddings(output, [vectors])
        console.print(f"wrote {rows} x {dim} float32 to {output}")
    table = Table(title=f"{title}: {vectors.shape[0]} x {vectors.shape[1]}")
    table.add_column("#", justify="right")
    table.add_column("text")
    table.add_column("norm", justify="right")
    table.add_column("first values")
    for i, (text, vector) in enumerate(zip(items, vectors)):
        short = text if len(text) <= 40 else text[:37] + "..."
        table.add_row(str(i), short, f"{np.linalg.norm(vector):.4f}", " ".join(f"{x:+.4f}" for x in vector[:6]))
    console.print(table)
    if similarity:
        sim = vectors @ vectors.T
        matrix = Table(title="cosine similarity")
        matrix.add_column("")
        for i in range(len(items)):
            matrix.add_column(str(i), justify="right")
        for i, row in enumerate(sim):
            matrix.add_row(str(i), *(f"{x:.4f}" for x in row))
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


@app.command()
def verify(
    directory: Path = typer.Argument(..., help="Artifact directory written by kvembed-export."),
    backends: opt.Backends = "auto",
    no_compare: opt.NoCompare = False,
) -> None:
    """Re-run the parity check of an exported artifact against a freshly built PyTorch reference,
    then compare the graph across the backends present (polygraphy)."""
    from .export.cli import EXIT_FAILED, run_verify

    if not run_verify(directory, backends=backends, compare=not no_compare).passed:
        raise typer.Exit(EXIT_FAILED)


#: commands that live in their own modules: (command name, module, attribute). Each module imports
#: only typer/rich at the top (heavy imports happen inside the command), so ``kvembed --help`` stays fast.
#: An attribute that is a ``typer.Typer`` becomes a command group (``kvembed NAME SUBCOMMAND``).
SUBCOMMANDS: tuple[tuple[str, str, str], ...] = (
    ("bench", "kvembed.bench.cli", "bench_command"),
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


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
