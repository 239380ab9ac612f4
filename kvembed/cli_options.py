"""The method options as command-line flags, declared once for every kvembed command."""

from __future__ import annotations

from typing import Annotated, Any, Mapping, Optional

import typer

from .backends.catalogue import VERIFY_HELP

Layers = Annotated[Optional[str], typer.Option(help="Layer set: '12-21', '10,11,26-31', 'none', 'auto'.")]
Bias = Annotated[Optional[float], typer.Option(help="kv-embedding: prefix logit bias.")]
NumPrefix = Annotated[Optional[int], typer.Option(help="kv-embedding: prepend the last n tokens.")]
PrefixRope = Annotated[Optional[str], typer.Option(help="kv-embedding: keep or zero.")]
Pooling = Annotated[Optional[str], typer.Option(help="kv-embedding: last-mean, last or mean.")]
Prompt = Annotated[Optional[str], typer.Option(help="Named prompt of the method, or a template with {text}.")]
Wva = Annotated[Optional[bool], typer.Option("--wva/--no-wva", help="aligned-wva: read before o_proj.")]
TpStart = Annotated[Optional[int], typer.Option(help="token-prepending: first rewired layer.")]
TpStop = Annotated[Optional[int], typer.Option(help="token-prepending: last rewired layer + 1.")]
ExitLayer = Annotated[Optional[int], typer.Option(help="token-prepending: early-exit layer.")]

# ``kvembed verify`` / ``kvembed-export verify``: the backend comparison
Backends = Annotated[str, typer.Option("--backends", help=VERIFY_HELP)]
NoCompare = Annotated[bool, typer.Option("--no-compare", help="Skip the backend comparison (parity against PyTorch only).")]


#: the parameter names of the flags above, as every command declares them
METHOD_FLAGS = ("layers", "bias", "num_prefix", "prefix_rope", "pooling", "prompt", "wva", "tp_start", "tp_stop", "exit_layer")


def method_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """The method options the user set, from a command's arguments (``method_options(locals())``)."""
    return {name: values[name] for name in METHOD_FLAGS if values.get(name) is not None}

OvPrecision = Annotated[Optional[str], typer.Option(
    "--ov-precision", help="--provider openvino: precision hint f32 or bf16 (default: bf16 where the CPU has BF16).",
)]


def check_ov_precision(provider: str, ov_precision: Optional[str]) -> None:
    """``--ov-precision`` only with ``--provider openvino``, and only f32/bf16."""
    if ov_precision is None:
        return
    if provider != "openvino":
        raise ValueError("--ov-precision applies to --provider openvino; add it or drop --ov-precision")
    if ov_precision not in ("f32", "bf16"):
        raise ValueError(f"--ov-precision must be f32 or bf16, got {ov_precision!r}")
