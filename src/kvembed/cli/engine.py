"""``kvembed build-engine ARTIFACT --out DIR``: a TensorRT engine directory from an artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import InvalidInput


def build_engine_command(
    artifact: Path = typer.Argument(..., help="Artifact directory (kvembed-export output, fp32 or fp16)."),
    out: Path = typer.Option(..., "--out", "-o", help="Engine directory to create (engine.plan, engine.json, tokenizer, manifest)."),
    shapes: Optional[list[str]] = typer.Option(
        None, "--shapes", help="MIN:OPT:MAX batch x sequence of one optimization profile, e.g. 1x16:8x128:32x512 "
        "(repeatable: one profile each; default that range clipped to the artifact's max_length).",
    ),
    fp16: bool = typer.Option(False, "--fp16", help="fp16 engine (TensorRT 11: from an fp16 artifact)."),
    bf16: bool = typer.Option(False, "--bf16", help="bf16 engine (TensorRT 10 builder flag; TensorRT 11 needs a bf16 artifact)."),
    timing_cache: Optional[Path] = typer.Option(None, "--timing-cache", help="Timing cache file, read if present and updated."),
    workspace: str = typer.Option("4GiB", "--workspace", help="Builder workspace limit (e.g. 4GiB, 512MiB)."),
    opt_level: int = typer.Option(3, "--opt-level", help="TensorRT builder optimization level, 0-5."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --out."),
    parity: bool = typer.Option(True, "--parity/--no-parity", help="Check the plan against onnxruntime on the "
                                "artifact (the gate's texts, METHODS.md's tolerance) before writing OUT."),
) -> None:
    """Build a TensorRT engine (polygraphy) from ARTIFACT into OUT; needs tensorrt and an NVIDIA GPU."""
    from rich.console import Console

    from ..artifact.engine import engine_limits
    from ..export.engine import build_engine
    from ..signals import sigterm_as_interrupt
    from .support import run_guarded

    def job() -> dict:
        if fp16 and bf16:
            raise InvalidInput("--fp16 and --bf16 exclude each other: pick one")
        return build_engine(
            artifact, out, shapes=list(shapes or []), precision="fp16" if fp16 else "bf16" if bf16 else "fp32",
            timing_cache=timing_cache, workspace=workspace, opt_level=opt_level, force=force, parity=parity,
        )

    with sigterm_as_interrupt():  # a scheduler's stop cleans up the staging directory, as Ctrl-C does
        record = run_guarded(job)
    limits = engine_limits(record)
    Console().print(
        f"engine {out / 'engine.plan'}: TensorRT {record['tensorrt_version']}, {record['gpu']['name']}, "
        f"{record['precision']}, {len(record['profiles'])} profile(s), max batch {limits.max_batch_size} x "
        f"{limits.max_sequence} tokens, built in {record['build']['seconds']}s; "
        + (f"parity vs onnxruntime: worst cosine {record['parity']['worst_cosine']:.7f}" if "parity" in record
           else "parity not checked (--no-parity)"), highlight=False,
    )
