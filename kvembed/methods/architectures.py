"""Per-architecture facts (torch-free, so a model can be checked before torch loads; Optimum keeps
such configs beside its exporters too).

All supported architectures share the Llama layout: ``model.layers[i].self_attn.{q,k,v,o}_proj``,
``model.embed_tokens``, ``model.norm``, ``model.rotary_emb``, decoder layers taking the hidden
state as first argument. Qwen3 adds per-head ``q_norm``/``k_norm`` (applied before RoPE, so the
keys our attention function receives are already normed and rotated); Qwen2 adds q/k/v biases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput


@dataclass(frozen=True)
class Architecture:
    model_type: str
    qk_norm: bool = False


SUPPORTED: dict[str, Architecture] = {
    "llama": Architecture("llama"),
    "mistral": Architecture("mistral"),
    "qwen2": Architecture("qwen2"),
    "qwen3": Architecture("qwen3", qk_norm=True),
}


def architecture_of(config: Any) -> Architecture:
    """The :class:`Architecture` of a transformers config, or an InvalidInput listing the supported ones."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        raise InvalidInput(
            f"unsupported architecture {model_type!r}: kvembed supports "
            f"{', '.join(sorted(SUPPORTED))} (decoder-only models with the Llama layout)"
        )
    if getattr(config, "hidden_act", "silu") not in ("silu", "swish"):
        raise InvalidInput(f"unsupported activation {config.hidden_act!r} for {model_type}; expected silu")
    return SUPPORTED[model_type]
