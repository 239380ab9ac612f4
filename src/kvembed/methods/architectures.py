"""Per-architecture facts (torch-free, so a model can be checked before torch loads; Optimum keeps
such configs beside its exporters too).

All supported architectures share the Llama layout: ``model.layers[i].self_attn.{q,k,v,o}_proj``,
``model.embed_tokens``, ``model.norm``, ``model.rotary_emb``, decoder layers taking the hidden
state as first argument. Qwen3 adds per-head ``q_norm``/``k_norm`` (applied before RoPE, so the
keys our attention function receives are already normed and rotated); Qwen2 adds q/k/v biases.

Gemma 3 (``gemma3_text``) keeps that layout and adds: q/k norms as Qwen3; an ``embed_tokens``
that multiplies by sqrt(hidden_size) itself (kvembed calls ``embed_tokens``, so no field says
so); pre/post feed-forward norms around a GELU-tanh MLP
(``hidden_activation``); the attention scale ``query_pre_attn_scalar ** -0.5`` (passed to the
attention function as ``scaling``); sliding-window layers interleaved with global ones
(``layer_types``), each kind with its own RoPE base. A re-routed prefix is an extra key/value
column in front of the sequence with its own mask, so in a sliding-window layer every query
still sees it, however far the text runs past the window: the method defines the prefix as
visible to all positions, and the window only limits the sequence's own keys.

Gemma 2 (``gemma2``) is Gemma 3's layout without the q/k norms and with one RoPE for both
layer kinds; its attention logits are soft-capped (``attn_logit_softcapping``: ``cap *
tanh(logits / cap)``, after the ``query_pre_attn_scalar`` scale), so its layers run eager
attention. A re-routed prefix's bias is a mask term, added after the cap as the masks are.
``final_logit_softcapping`` caps the LM head's logits, which an embedder never computes.

Granite keeps the Llama layout and scales three things by config scalars, all inside transformers'
forward: the input embeddings (``embedding_multiplier``, applied by the decoder to the
``inputs_embeds`` kvembed passes, so a zero placeholder stays zero), each sublayer's output before
the residual add (``residual_multiplier``; the value and attention-output readouts are read before
it) and the attention logits (``attention_multiplier`` in place of ``head_dim ** -0.5``, passed to
the attention function as ``scaling``). ``logits_scaling`` divides the LM head's logits, which an
embedder never computes.

OLMo 2 drops the pre-norms: each sublayer reads the residual stream as it is and its output is
normed before the residual add (``post_attention_layernorm``, ``post_feedforward_layernorm``); its
q/k norms run over the whole projection (every head at once), before RoPE, so the keys our
attention function receives are normed and rotated as Qwen3's are.

Phi-3 fuses q/k/v into one ``self_attn.qkv_proj`` (q, then k, then v along its output) and the
MLP's gate and up into ``mlp.gate_up_proj``: the values readout slices v out of ``qkv_proj``'s
output (``fused_qkv``). With ``partial_rotary_factor`` below one RoPE turns only the first part
of each head, so the inverse rotation of a ``prefix_rope="zero"`` key does too. Its ``longrope``
scaling switches frequencies when the batch's longest text passes
``original_max_position_embeddings``: a text's vector would depend on its batch, and a traced
graph keeps one branch, so only the default RoPE is accepted (``rope_types``).

StableLM norms with LayerNorms that carry a bias (``norm_bias``, which the memory estimate
counts), rotates a quarter of each head by default (``partial_rotary_factor``, handled as
Phi-3's) and biases q/k/v only under ``use_qkv_bias``. Its attention takes the heads' width from
``hidden_size / num_attention_heads`` whatever ``head_dim`` says (``head_dim_field``). Its
per-head q/k LayerNorms and its parallel residual are switches no test proves yet, so a config
turning one on is refused (``refused_switches``).

Cohere (Command-R) runs attention and the MLP side by side on one LayerNorm (no bias) of the
residual stream and adds both to it (``parallel_sublayers``: one norm a layer). Its RoPE turns
adjacent feature pairs, not the two halves of a head (``rope_interleaved``), so the inverse
rotation of a ``prefix_rope="zero"`` key pairs the features the same way. ``logit_scale``
multiplies the LM head's logits, which an embedder never computes; its per-head q/k LayerNorms
(``use_qk_norm``, Command R+) are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidInput


@dataclass(frozen=True)
class Architecture:
    """Everything kvembed reads about one architecture. Adding one is an entry in :data:`SUPPORTED`
    (plus a file in ``modeling/patch/`` if its forward differs): the GGUF loader, the export's
    memory estimate and the patched forward take their facts from here."""

    model_type: str
    #: llama.cpp's name for it: a GGUF file's ``general.architecture``
    gguf_name: str
    #: transformers' GGUF loader converts this family (kvembed dequantizes through it); a GGUF of a
    #: family it does not convert is refused by name before anything loads
    gguf_loadable: bool = True
    #: RMSNorms of queries and keys (``q_norm``/``k_norm``) in every layer ...
    qk_norm: bool = False
    #: ... over each head (``"head"``: Qwen3, Gemma 3) or the whole projection (``"projection"``: OLMo 2)
    qk_norm_span: Literal["head", "projection"] = "head"
    #: q/k/v projections always carry biases (Qwen2), whatever the config says
    qkv_bias: bool = False
    #: the config switches this architecture honours: ``attention_bias`` (q/k/v/o), ``mlp_bias`` (the MLP),
    #: ``use_qkv_bias`` (q/k/v only: StableLM)
    bias_switches: tuple[str, ...] = ("attention_bias",)
    #: the config attribute naming the MLP activation, and the values kvembed supports
    activation_field: str = "hidden_act"
    activations: tuple[str, ...] = ("silu", "swish")
    #: ``config.layer_types`` mixes sliding-window and global layers ...
    per_layer_window: bool = False
    #: ... each kind with its own RoPE (Gemma 3: ``rotary_emb(x, positions, layer_type)``)
    per_layer_rope: bool = False
    #: the attention logits are soft-capped, ``cap * tanh(logits / cap)``, by ``config.attn_logit_softcapping``
    #: (Gemma 2): its layers run eager attention, not SDPA, which has no cap
    softcapped: bool = False
    #: extra norms after attention and around the MLP (Gemma's sandwich norms): four a layer, not two
    sandwich_norms: bool = False
    #: ``tie_word_embeddings`` when config.json leaves it out (the transformers config class's default)
    tied_by_default: bool = False
    #: q/k/v come out of one ``self_attn.qkv_proj`` (v last), not ``v_proj``: the values readout slices it
    fused_qkv: bool = False
    #: the MLP's gate and up are one ``mlp.gate_up_proj``
    fused_gate_up: bool = False
    #: the RoPE types kvembed accepts; None: whatever transformers runs
    rope_types: tuple[str, ...] | None = None
    #: the norms are LayerNorms with a bias (StableLM): a weight and a bias vector each
    norm_bias: bool = False
    #: ``config.head_dim`` sets the heads' width; False: it is always hidden_size / heads (StableLM)
    head_dim_field: bool = True
    #: config switches kvembed does not support for this family: a config turning one on is refused
    refused_switches: tuple[str, ...] = ()
    #: attention and MLP both read one input norm and add to the residual together (Cohere): one norm a layer
    parallel_sublayers: bool = False
    #: RoPE turns adjacent feature pairs (Cohere), not a head's two halves: so must its inverse
    rope_interleaved: bool = False

    def head_dim(self, config: Any) -> int:
        """The width of one attention head, as this family's attention computes it."""
        hidden, heads = int(_field(config, "hidden_size")), int(_field(config, "num_attention_heads"))
        return (self.head_dim_field and _field(config, "head_dim")) or hidden // heads

    @property
    def weight_matrices(self) -> int:
        """Weight matrices one decoder layer multiplies by (q, k, v, o, gate, up, down; fewer when
        fused): the export counts the layers its graph holds by them."""
        return (1 if self.fused_qkv else 3) + 1 + (1 if self.fused_gate_up else 2) + 1

    def activation(self, config: Any) -> str:
        value = _field(config, self.activation_field)
        return self.activations[0] if value is None else value

    def biased(self, config: Any, switch: str) -> bool:
        """Whether ``config`` turns on the biases ``switch`` names (False for a switch this
        architecture does not honour: Mistral's projections never carry one)."""
        return switch in self.bias_switches and bool(_field(config, switch))


SUPPORTED: dict[str, Architecture] = {
    "llama": Architecture("llama", "llama", bias_switches=("attention_bias", "mlp_bias")),
    "mistral": Architecture("mistral", "mistral", bias_switches=()),
    "qwen2": Architecture("qwen2", "qwen2", qkv_bias=True, bias_switches=()),
    "qwen3": Architecture("qwen3", "qwen3", qk_norm=True),
    "gemma3_text": Architecture(
        "gemma3_text", "gemma3", qk_norm=True, activation_field="hidden_activation",
        activations=("gelu_pytorch_tanh",), per_layer_window=True, per_layer_rope=True, sandwich_norms=True,
        tied_by_default=True,
    ),
    "gemma2": Architecture(
        "gemma2", "gemma2", activation_field="hidden_activation", activations=("gelu_pytorch_tanh",),
        per_layer_window=True, sandwich_norms=True, tied_by_default=True, softcapped=True,
    ),
    "granite": Architecture("granite", "granite", gguf_loadable=False, bias_switches=("attention_bias", "mlp_bias")),
    "olmo2": Architecture("olmo2", "olmo2", gguf_loadable=False, qk_norm=True, qk_norm_span="projection"),
    "phi3": Architecture("phi3", "phi3", bias_switches=(), fused_qkv=True, fused_gate_up=True,
                         rope_types=("default",)),
    "stablelm": Architecture("stablelm", "stablelm", bias_switches=("use_qkv_bias",), norm_bias=True,
                             head_dim_field=False, refused_switches=("qk_layernorm", "use_parallel_residual")),
    "cohere": Architecture("cohere", "command-r", gguf_loadable=False, tied_by_default=True, parallel_sublayers=True,
                           rope_interleaved=True, refused_switches=("use_qk_norm",)),
}

#: GGUF ``general.architecture`` -> the :class:`Architecture` it is, for the families kvembed loads from a GGUF
BY_GGUF_NAME: dict[str, Architecture] = {arch.gguf_name: arch for arch in SUPPORTED.values() if arch.gguf_loadable}
#: the llama.cpp names of supported families whose GGUF transformers cannot convert
UNLOADABLE_GGUF: dict[str, Architecture] = {arch.gguf_name: arch for arch in SUPPORTED.values() if not arch.gguf_loadable}


def _field(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def rope_type(config: Any) -> str:
    """The RoPE type a config asks for (``rope_parameters`` or the older ``rope_scaling``)."""
    params = _field(config, "rope_parameters") or _field(config, "rope_scaling") or {}
    return str(params.get("rope_type") or params.get("type") or "default")


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
    refused = [switch for switch in arch.refused_switches if _field(config, switch)]
    if refused:
        raise InvalidInput(f"{model_type} with {' and '.join(refused)} is not supported (kvembed does not prove it yet)")
    if arch.rope_types is not None and rope_type(config) not in arch.rope_types:
        raise InvalidInput(
            f"unsupported rope_type {rope_type(config)!r} for {model_type}; expected {' or '.join(arch.rope_types)} "
            "(its frequencies would change with the batch's longest text)"
        )
    if arch.per_layer_window:
        if _field(config, "use_bidirectional_attention"):
            raise InvalidInput(f"{model_type} with use_bidirectional_attention is not a causal decoder; kvembed needs one")
        if not arch.softcapped and _field(config, "attn_logit_softcapping") is not None:
            raise InvalidInput(f"{model_type} with attn_logit_softcapping is not supported (the SDPA path has no soft-capping)")
    cap = _field(config, "attn_logit_softcapping") if arch.softcapped else None
    if cap is not None and not (isinstance(cap, (int, float)) and not isinstance(cap, bool) and 0 < cap < float("inf")):
        raise InvalidInput(f"{model_type}: attn_logit_softcapping must be a positive number or null, got {cap!r:.80}")
    return arch
