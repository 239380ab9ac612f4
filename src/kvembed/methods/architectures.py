"""Per-architecture facts (torch-free, so a model can be checked before torch loads; Optimum keeps
such configs beside its exporters too).

All supported architectures share the Llama layout: ``model.layers[i].self_attn.{q,k,v,o}_proj``,
``model.embed_tokens``, ``model.norm``, ``model.rotary_emb``, decoder layers taking the hidden
state as first argument. Qwen3 adds per-head ``q_norm``/``k_norm`` (applied before RoPE, so the
keys our attention function receives are already normed and rotated); Qwen2 adds q/k/v biases.

Gemma 3 (``gemma3_text``) keeps that layout and adds: q/k norms as Qwen3; an ``embed_tokens``
that multiplies by sqrt(hidden_size) itself; pre/post feed-forward norms around a GELU-tanh MLP
(``hidden_activation``); the attention scale ``query_pre_attn_scalar ** -0.5`` (passed to the
attention function as ``scaling``); sliding-window layers interleaved with global ones
(``layer_types``), each kind with its own RoPE base. A re-routed prefix is an extra key/value
column in front of the sequence with its own mask, so in a sliding-window layer every query
still sees it, however far the text runs past the window: the method defines the prefix as
visible to all positions, and the window only limits the sequence's own keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput


@dataclass(frozen=True)
class Architecture:
    model_type: str
    qk_norm: bool = False
    #: the config attribute naming the MLP activation, and the values kvembed supports
    activation_field: str = "hidden_act"
    activations: tuple[str, ...] = ("silu", "swish")
    #: ``config.layer_types`` mixes sliding-window and global layers, each with its own RoPE
    per_layer_window: bool = False
    #: ``embed_tokens`` multiplies its rows by sqrt(hidden_size)
    scaled_embeddings: bool = False
    #: extra norms after attention and around the MLP (Gemma's sandwich norms)
    sandwich_norms: bool = False

    def activation(self, config: Any) -> str:
        value = config.get(self.activation_field) if isinstance(config, dict) else getattr(config, self.activation_field, None)
        return self.activations[0] if value is None else value


SUPPORTED: dict[str, Architecture] = {
    "llama": Architecture("llama"),
    "mistral": Architecture("mistral"),
    "qwen2": Architecture("qwen2"),
    "qwen3": Architecture("qwen3", qk_norm=True),
    "gemma3_text": Architecture(
        "gemma3_text", qk_norm=True, activation_field="hidden_activation",
        activations=("gelu_pytorch_tanh",), per_layer_window=True, scaled_embeddings=True, sandwich_norms=True,
    ),
}


def _field(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def sliding_window(config: Any) -> int | None:
    """The span in tokens of the model's sliding-window layers, or None when no layer slides: as
    transformers builds the masks (a window on the layers ``layer_types`` names sliding, else on
    every layer when ``sliding_window`` is set; Qwen's only with ``use_sliding_window`` and
    layers from ``max_window_layers`` on). The parity gate runs one text past it."""
    window = _field(config, "sliding_window")
    if window is None or _field(config, "use_sliding_window") is False:
        return None
    layer_types = _field(config, "layer_types")
    if layer_types is not None:
        return int(window) if "sliding_attention" in layer_types else None
    first, layers = _field(config, "max_window_layers"), _field(config, "num_hidden_layers")
    if _field(config, "use_sliding_window") and first is not None and layers is not None and first >= layers:
        return None
    return int(window)


def architecture_of(config: Any) -> Architecture:
    """The :class:`Architecture` of a transformers config (or a ``config.json`` dict), or an
    InvalidInput listing the supported ones."""
    model_type = _field(config, "model_type")
    if model_type not in SUPPORTED:
        raise InvalidInput(
            f"unsupported architecture {model_type!r}: kvembed supports "
            f"{', '.join(sorted(SUPPORTED))} (decoder-only models with the Llama layout)"
        )
    arch = SUPPORTED[model_type]
    activation = arch.activation(config)
    if activation not in arch.activations:
        raise InvalidInput(
            f"unsupported activation {activation!r} for {model_type}; expected {' or '.join(arch.activations)}"
        )
    if arch.per_layer_window:
        if _field(config, "use_bidirectional_attention"):
            raise InvalidInput(f"{model_type} with use_bidirectional_attention is not a causal decoder; kvembed needs one")
        if _field(config, "attn_logit_softcapping") is not None:
            raise InvalidInput(f"{model_type} with attn_logit_softcapping is not supported (the SDPA path has no soft-capping)")
    return arch
