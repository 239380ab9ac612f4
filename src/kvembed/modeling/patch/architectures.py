"""Torch-side architecture helpers; the per-architecture facts live in
:mod:`kvembed.methods.architectures` (torch-free, read before any weights load)."""

from __future__ import annotations

from typing import Any

from ...methods.architectures import SUPPORTED, Architecture, architecture_of
from ...errors import InvalidInput

__all__ = ["SUPPORTED", "Architecture", "architecture_of", "base_model"]


def base_model(model: Any) -> Any:
    """The decoder stack (``LlamaModel`` etc.) of a base or causal-LM model."""
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "layers"):
        return inner
    if hasattr(model, "layers") and hasattr(model, "embed_tokens"):
        return model
    raise InvalidInput(f"{type(model).__name__} has no decoder layer list (.layers); is it a decoder-only LLM?")
