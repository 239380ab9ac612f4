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


def method_options(**given: Any) -> dict[str, Any]:
    """Keep only the method options the user actually set."""
    return {name: value for name, value in given.items() if value is not None}


@app.command()
def embed(
    texts: list[str] = typer.Argument(..., help="Texts to embed."),
    model: str = typer.Option("stories260k", "--model", "-m", help="Model folder, alias (qwen3-4b, stories260k) or hub id."),
    method: str = typer.Option("kv-embedding", "--method", help="Embedding method."),
    kind: str = typer.Option("document", "--kind", help="query or document (selects the prompt)."),
    layers: Optional[str] = typer.Option(None, help="Layer set: '12-21', '10,11,26-31', 'none'."),
    bias: Optional[float] = typer.Option(None, help="kv-embedding: prefix logit bias."),
    num_prefix: Optional[int] = typer.Option(None, help="kv-embedding: prepend the last n tokens."),
    prefix_rope: Optional[str] = typer.Option(None, help="kv-embedding: keep or zero."),
    pooling: Optional[str] = typer.Option(None, help="kv-embedding: last-mean, last or mean."),
    prompt: Optional[str] = typer.Option(None, help="Named prompt of the method, or a template with {text}."),
    wva: Optional[bool] = typer.Option(None, "--wva/--no-wva", help="aligned-wva: read before o_proj."),
    tp_start: Optional[int] = typer.Option(None, help="token-prepending: first rewired layer."),
    tp_stop: Optional[int] = typer.Option(None, help="token-prepending: last rewired layer + 1."),
    exit_layer: Optional[int] = typer.Option(None, help="token-prepending: early-exit layer."),
    max_length: Optional[int] = typer.Option(None, help="Truncate inputs to this many tokens."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the embeddings to a .npy file."),
    similarity: bool = typer.Option(False, "--similarity", help="Print the cosine similarity matrix."),
) -> None:
    """Embed TEXTS with the PyTorch reference and print norms and first values."""
    import numpy as np

    def job() -> np.ndarray:
        from .reference import TorchEmbedder

        options = method_options(
            layers=layers, bias=bias, num_prefix=num_prefix, prefix_rope=prefix_rope, pooling=pooling,
            prompt=prompt, wva=wva, tp_start=tp_start, tp_stop=tp_stop, exit_layer=exit_layer,
        )
        embedder = TorchEmbedder.from_pretrained(model, method, max_length=max_length, **options)
        return embedder.encode(texts, kind=kind)

    vectors = run_guarded(job)
    if output is not None:
        if output.suffix != ".npy":
            errors.print(f"[bold red]error:[/] --output must end in .npy, got {output}")
            raise typer.Exit(2)
        output.parent.mkdir(parents=True, exist_ok=True)
        np.save(output, vectors)
        console.print(f"wrote {vectors.shape[0]} x {vectors.shape[1]} float32 to {output}")
    table = Table(title=f"{method} on {model}: {vectors.shape[0]} x {vectors.shape[1]}")
    table.add_column("#", justify="right")
    table.add_column("text")
    table.add_column("norm", justify="right")
    table.add_column("first values")
    for i, (text, vector) in enumerate(zip(texts, vectors)):
        short = text if len(text) <= 40 else text[:37] + "..."
        table.add_row(str(i), short, f"{np.linalg.norm(vector):.4f}", " ".join(f"{x:+.4f}" for x in vector[:6]))
    console.print(table)
    if similarity:
        sim = vectors @ vectors.T
        matrix = Table(title="cosine similarity")
        matrix.add_column("")
        for i in range(len(texts)):
            matrix.add_column(str(i), justify="right")
        for i, row in enumerate(sim):
            matrix.add_row(str(i), *(f"{x:.4f}" for x in row))
        console.print(matrix)


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())


@app.command()
def verify(
    directory: Path = typer.Argument(..., help="Artifact directory written by kvembed-export."),
) -> None:
    """Re-run the parity check of an exported artifact against a freshly built PyTorch reference."""
    from .export.cli import EXIT_FAILED, run_verify

    if not run_verify(directory).passed:
        raise typer.Exit(EXIT_FAILED)
