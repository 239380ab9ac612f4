"""``kvembed causal2vec``: tools for Causal2Vec checkpoints (torch-free: numpy + safetensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    help="Causal2Vec checkpoints: assemble an untrained one to test a deployment pipeline.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def assemble(
    encoder: Path = typer.Option(..., help="Folder of a Hugging Face BERT-style encoder with tokenizer.json."),
    llm: str = typer.Option(..., help="Folder of the decoder LLM (Llama, Mistral, Qwen2, Qwen3), or a built-in model with a local folder (stories260k)."),
    out: Path = typer.Option(..., help="Checkpoint folder to write."),
    seed: int = typer.Option(0, help="Seed of the random projector."),
    placeholder: Optional[str] = typer.Option(None, help="LLM token the Contextual token replaces (default: its BOS, else EOS)."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty OUT."),
) -> None:
    """Write an untrained checkpoint: copies of ENCODER and LLM, a random projector, causal2vec.json."""
    from ..methods.models import resolve_model
    from ..modeling.causal2vec import assemble as write

    location, _ = resolve_model(llm)
    checkpoint = write(encoder, location if Path(location).is_dir() else llm, out, seed=seed, placeholder=placeholder, force=force)
    typer.echo(
        f"wrote {checkpoint.root} (untrained: random projector, seed {seed}; encoder width {checkpoint.encoder_hidden}, "
        f"LLM width {checkpoint.llm_hidden}, placeholder {checkpoint.config['placeholder']!r}); export it with "
        f"kvembed-export --model {checkpoint.root} --method causal2vec"
    )
