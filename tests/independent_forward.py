"""The float64 forward pass of the independent oracle (tests/independent.py): each supported
family's decoder written out from its safetensors weights and ``config.json`` as plain tensor
ops, one text at a time.

Like the oracle, this module must NOT import kvembed and must NOT call transformers' modelling or
configuration code: the comparison against kvembed takes nothing from the code under test.

Families: Llama, Mistral (sliding-window attention), Qwen2 (q/k/v biases), Qwen3 (per-head
q_norm/k_norm), Gemma 3 (``gemma3_text``, written from transformers'
``models/gemma3/modeling_gemma3.py``: embeddings times sqrt(hidden), RMSNorm weights as ``1 + w``,
q/k norms, a norm on the attention output and around the GELU-tanh MLP, attention scale
``query_pre_attn_scalar ** -0.5``, sliding-window and global layers from ``layer_types`` each
with its own RoPE base), Gemma 2 (``gemma2``, written from the Gemma 2 report (Gemma Team, 2024):
Gemma 3's layer without the q/k norms, one RoPE base for both layer kinds, and the attention
logits soft-capped, ``cap * tanh(logits / cap)`` with ``cap = attn_logit_softcapping``, before
the mask), Granite (``models/granite/modeling_granite.py``: the embeddings, each
sublayer's output and the attention logits multiplied by the config's scalars), OLMo 2
(``models/olmo2/modeling_olmo2.py``: no pre-norms, a norm on each sublayer's output, q/k norms over
the whole projection), Phi-3 (``models/phi3/modeling_phi3.py``: fused qkv_proj and gate_up_proj,
RoPE on the first part of each head under ``partial_rotary_factor``), StableLM
(``models/stablelm/modeling_stablelm.py``, the StableLM 2 model card: LayerNorms with a bias, RoPE on
a quarter of each head unless the config says otherwise, heads of hidden / heads features), Cohere
(``models/cohere/modeling_cohere.py``, Command-R: attention and MLP side by side on one LayerNorm
without bias, RoPE rotating adjacent feature pairs (2i, 2i + 1) instead of a head's two halves).
RoPE: "default" and "llama3" frequency scaling.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

_DT = torch.float64

# --------------------------------------------------------------------------------------------
# weights and hyper-parameters
# --------------------------------------------------------------------------------------------


def load_weights(model_dir) -> dict[str, torch.Tensor]:
    """Read ``model.safetensors`` (or its shards) from ``model_dir`` into a plain dict."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    single = model_dir / "model.safetensors"
    if single.exists():
        return dict(load_file(str(single)))
    shards = sorted(model_dir.glob("model-*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no model.safetensors in {model_dir}")
    weights: dict[str, torch.Tensor] = {}
    for shard in shards:
        weights.update(load_file(str(shard)))
    return weights


def strip_prefix(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop ``lm_head.*``; strip a leading ``model.``."""
    out = {}
    for name, tensor in weights.items():
        if name.startswith("lm_head."):
            continue
        if name.startswith("model."):
            name = name[len("model."):]
        out[name] = tensor
    return out


class Hparams:
    """Hyper-parameters read from a ``config.json`` dict (missing required keys raise KeyError)."""

    def __init__(self, config: dict[str, Any]):
        self.hidden = config["hidden_size"]
        self.n_layers = config["num_hidden_layers"]
        self.n_heads = config["num_attention_heads"]
        self.n_kv = config.get("num_key_value_heads") or self.n_heads
        model_type = config.get("model_type")
        # StableLM's attention splits hidden_size evenly over the heads, whatever head_dim says
        self.head_dim = (config.get("head_dim") if model_type != "stablelm" else None) or self.hidden // self.n_heads
        # StableLM: LayerNorm (the mean removed, then weight and bias) where the others use RMSNorm
        self.layer_norm = model_type in ("stablelm", "cohere")
        # Cohere: x + attn(norm(x)) + mlp(norm(x)), and RoPE on adjacent pairs
        self.parallel = self.interleaved = model_type == "cohere"
        if model_type == "cohere" and config.get("use_qk_norm"):
            raise NotImplementedError("Cohere's q/k LayerNorms")
        self.eps = config["layer_norm_eps" if self.layer_norm else "rms_norm_eps"]
        if model_type == "stablelm" and (config.get("qk_layernorm") or config.get("use_parallel_residual")):
            raise NotImplementedError("StableLM's per-head q/k LayerNorms or parallel residual")
        if self.n_heads % self.n_kv:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.group = self.n_heads // self.n_kv
        self.gemma = model_type in ("gemma3_text", "gemma2")
        #: Gemma 2: the attention logits' soft cap (None: uncapped)
        self.softcap = config.get("attn_logit_softcapping") if model_type == "gemma2" else None
        #: per layer: "full_attention" or "sliding_attention" (Gemma 2, 3); None: every layer alike
        self.layer_types = config.get("layer_types") if self.gemma else None
        self.attn_scale = (config["query_pre_attn_scalar"] if self.gemma else self.head_dim) ** -0.5
        self.embed_scale = math.sqrt(self.hidden) if self.gemma else 1.0
        #: what a sublayer's output is multiplied by before the residual add
        self.residual_scale = 1.0
        # OLMo 2 (models/olmo2/modeling_olmo2.py): no norm before a sublayer, one on its output
        # before the residual add; q_norm/k_norm over the whole projection, not per head
        self.olmo2 = config.get("model_type") == "olmo2"
        if config.get("model_type") == "granite":
            # GraniteConfig's scalars (models/granite/modeling_granite.py), each 1.0 when left out:
            # the embeddings, every sublayer's output, and the attention logits in place of 1/sqrt(d)
            self.embed_scale = float(config.get("embedding_multiplier", 1.0))
            self.residual_scale = float(config.get("residual_multiplier", 1.0))
            self.attn_scale = float(config.get("attention_multiplier", 1.0))
        if self.gemma:
            if config.get("hidden_activation") != "gelu_pytorch_tanh":
                raise NotImplementedError(f"hidden_activation {config.get('hidden_activation')!r}")
            if model_type != "gemma2" and config.get("attn_logit_softcapping") is not None:
                raise NotImplementedError("Gemma 3's attention soft-capping")
            if config.get("use_bidirectional_attention"):
                raise NotImplementedError("bidirectional attention")
            # Gemma 3: one RoPE per layer kind; Gemma 2: one for both
            per_kind = config["rope_parameters"] if model_type == "gemma3_text" else {
                kind: config["rope_parameters"] for kind in set(self.layer_types)}
            self.rope_by_type = {kind: float(p["rope_theta"]) for kind, p in per_kind.items()}
            for p in per_kind.values():
                if p.get("rope_type", "default") != "default":
                    raise NotImplementedError(f"rope_type {p['rope_type']!r}")
        elif config.get("hidden_act", "silu") not in ("silu", "swish"):
            raise NotImplementedError(f"hidden_act {config['hidden_act']!r}")
        rope = {} if self.gemma else {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
        self.rope_theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        self.rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        self.rope = rope
        if self.rope_type not in ("default", "llama3"):
            raise NotImplementedError(f"rope_type {self.rope_type!r}")
        # Phi-3's partial rotary factor: RoPE turns the first int(head_dim * factor) features of a
        # head (its frequencies from that width), the rest pass through
        # (StableLM turns a quarter when its config leaves the factor out)
        default_factor = 0.25 if model_type == "stablelm" else 1.0
        factor = float(rope.get("partial_rotary_factor", config.get("partial_rotary_factor", default_factor)))
        self.rotary_dim = int(self.head_dim * factor)
        # sliding-window attention (Mistral; Qwen2 only with use_sliding_window): key j is visible
        # to query i iff i - W < j <= i
        self.sliding_window = config.get("sliding_window")
        if config.get("use_sliding_window", True) is False:
            self.sliding_window = None
        if self.sliding_window is not None and config.get("model_type") == "qwen2":
            raise NotImplementedError("Qwen2's per-layer sliding window (max_window_layers)")

    def norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The family's pre-sublayer and final norm: RMSNorm, or LayerNorm (with ``bias`` when it has one)."""
        if not self.layer_norm:
            return _rms_norm(x, weight, self.eps)
        centred = x - x.mean(dim=-1, keepdim=True)
        out = centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + self.eps) * weight
        return out if bias is None else out + bias

    def window(self, layer: int) -> int | None:
        """The attention window of ``layer`` in tokens, None for global attention."""
        if self.layer_types is not None:
            return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None
        return self.sliding_window

    def inv_freq(self, layer: int = 0) -> torch.Tensor:
        d = self.rotary_dim
        theta = self.rope_by_type[self.layer_types[layer]] if self.layer_types is not None else self.rope_theta
        inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=_DT) / d))
        if self.rope_type == "llama3":
            # Llama-3.1 frequency scaling: long wavelengths divided by `factor`, short ones kept,
            # smooth interpolation in between.
            factor = self.rope["factor"]
            low = self.rope["low_freq_factor"]
            high = self.rope["high_freq_factor"]
            old_len = self.rope["original_max_position_embeddings"]
            low_wavelen = old_len / low
            high_wavelen = old_len / high
            wavelen = 2 * math.pi / inv
            scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
            smooth = (old_len / wavelen - low) / (high - low)
            smoothed = (1 - smooth) * scaled / factor + smooth * scaled
            medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            inv = torch.where(medium, smoothed, scaled)
        return inv


# --------------------------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------------------------


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * w over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((-x2, x1), dim=-1)


def _apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """x: [heads, n, d]; positions: [n]. Returns x*cos + rotate_half(x)*sin on the first
    2 * len(inv_freq) features of each head, the others unchanged. ``interleaved``: frequency i
    turns the pair (2i, 2i + 1) as the complex number x[2i] + j x[2i + 1] times exp(j angle)."""
    freqs = positions.to(_DT)[:, None] * inv_freq[None, :]  # [n, r/2]
    r = 2 * freqs.shape[-1]
    if interleaved:
        even, odd = x[..., 0:r:2], x[..., 1:r:2]
        cos, sin = freqs.cos(), freqs.sin()
        turned = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
        return torch.cat((turned, x[..., r:]), dim=-1)
    angles = torch.cat((freqs, freqs), dim=-1)  # [n, r]
    turned = x[..., :r] * angles.cos() + _rotate_half(x[..., :r]) * angles.sin()
    return torch.cat((turned, x[..., r:]), dim=-1)


class _Layer:
    """The float64 weights of one decoder layer (converted lazily, one layer at a time)."""

    def __init__(self, weights: dict[str, torch.Tensor], index: int, hp: "Hparams"):
        prefix = f"layers.{index}."
        gemma, olmo2 = hp.gemma, hp.olmo2

        def get(name, required=True):
            t = weights.get(prefix + name)
            if t is None:
                if required:
                    raise KeyError(prefix + name)
                return None
            t = t.to(_DT)
            return t + 1.0 if gemma and name.endswith("norm.weight") else t  # Gemma scales by 1 + w

        self.ln1 = get("input_layernorm.weight", not olmo2)  # OLMo 2 has none
        self.ln2 = get("post_attention_layernorm.weight", not hp.parallel)  # Cohere's one norm feeds both
        self.ln1_bias = get("input_layernorm.bias", False)  # StableLM's LayerNorms
        self.ln2_bias = get("post_attention_layernorm.bias", False)
        self.pre_ff = get("pre_feedforward_layernorm.weight", gemma)  # Gemma 2 and 3 only
        self.post_ff = get("post_feedforward_layernorm.weight", gemma or olmo2)
        fused = get("self_attn.qkv_proj.weight", False)  # Phi-3: the rows of q, then k, then v
        if fused is not None:
            q_rows, kv_rows = hp.n_heads * hp.head_dim, hp.n_kv * hp.head_dim
            self.wq, self.wk, self.wv = fused.split([q_rows, kv_rows, kv_rows])
            self.bq = self.bk = self.bv = None
        else:
            self.wq, self.bq = get("self_attn.q_proj.weight"), get("self_attn.q_proj.bias", False)
            self.wk, self.bk = get("self_attn.k_proj.weight"), get("self_attn.k_proj.bias", False)
            self.wv, self.bv = get("self_attn.v_proj.weight"), get("self_attn.v_proj.bias", False)
        self.wo, self.bo = get("self_attn.o_proj.weight"), get("self_attn.o_proj.bias", False)
        self.q_norm = get("self_attn.q_norm.weight", olmo2)  # Qwen3, Gemma 3 (per head), OLMo 2 (whole)
        self.k_norm = get("self_attn.k_norm.weight", olmo2)
        gate_up = get("mlp.gate_up_proj.weight", False)  # Phi-3: gate's rows, then up's
        if gate_up is not None:
            self.w_gate, self.w_up = gate_up.chunk(2)
            self.b_gate = self.b_up = None
        else:
            self.w_gate, self.b_gate = get("mlp.gate_proj.weight"), get("mlp.gate_proj.bias", False)
            self.w_up, self.b_up = get("mlp.up_proj.weight"), get("mlp.up_proj.bias", False)
        self.w_down, self.b_down = get("mlp.down_proj.weight"), get("mlp.down_proj.bias", False)


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x @ w.T
    return y if b is None else y + b


# --------------------------------------------------------------------------------------------
# the forward pass
# --------------------------------------------------------------------------------------------


def forward(
    weights: dict[str, torch.Tensor],
    hp: Hparams,
    ids: list[int],
    *,
    n_layers_to_run: int,
    reroute: set[int] = frozenset(),
    bias: float = 1.0,
    num_prefix: int = 1,
    prefix_rope: str = "keep",
    tp_window: range = range(0),
    pst_index: int | None = None,
) -> dict:
    """Run decoder layers 0..n_layers_to_run-1 on one text.

    Returns a dict with
      "hidden":    list of residual-stream states; hidden[l] is the input of layer l
                   (after any token-prepending replacement), hidden[l+1] its output. [n, H]
      "values":    per layer, v_proj output (+bias), per KV head concatenated. [n, n_kv*d]
      "attn_pre_o": per layer, concatenated attention heads before o_proj. [n, n_heads*d]
      "attn_out":  per layer, attention sub-layer output after o_proj. [n, H]
    """
    n = len(ids)
    if n == 0:
        raise ValueError("empty ids")
    d, H = hp.head_dim, hp.hidden
    last = n - 1
    positions = torch.arange(n)
    scale = hp.attn_scale

    # token embeddings; the <PST> placeholder (an id outside the vocabulary) gets the zero vector
    lookup = [0 if i == pst_index else t for i, t in enumerate(ids)]
    x = weights["embed_tokens.weight"][torch.tensor(lookup, dtype=torch.long)].to(_DT) * hp.embed_scale
    if pst_index is not None:
        x[pst_index] = 0.0

    # causal mask: key j visible to query i iff j <= i (and, with a sliding window W, i - j < W)
    # (the prefix columns below are outside the window: visible to every query)
    def causal_mask(window: int | None) -> torch.Tensor:
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        if window is not None:
            causal &= ~torch.ones(n, n, dtype=torch.bool).tril(-window)
        return causal

    hidden, values, attn_pre_o, attn_out = [], [], [], []
    for l in range(n_layers_to_run):
        W = _Layer(weights, l, hp)
        inv_freq = hp.inv_freq(l)
        causal = causal_mask(hp.window(l))

        # token prepending: overwrite the placeholder's residual stream with the last token's
        if l in tp_window:
            x = x.clone()
            x[pst_index] = x[last]
        hidden.append(x)

        # ---- self-attention ----
        h = x if hp.olmo2 else hp.norm(x, W.ln1, W.ln1_bias)
        q_flat, k_flat = _linear(h, W.wq, W.bq), _linear(h, W.wk, W.bk)  # [n, heads*d], [n, kv*d]
        if hp.olmo2:  # one RMS over all heads' features of a token
            q_flat, k_flat = _rms_norm(q_flat, W.q_norm, hp.eps), _rms_norm(k_flat, W.k_norm, hp.eps)
        q = q_flat.view(n, hp.n_heads, d).transpose(0, 1)  # [heads, n, d]
        k = k_flat.view(n, hp.n_kv, d).transpose(0, 1)  # [kv, n, d]
        v_flat = _linear(h, W.wv, W.bv)  # [n, kv*d]
        v = v_flat.view(n, hp.n_kv, d).transpose(0, 1)  # [kv, n, d]
        values.append(v_flat)
        if W.q_norm is not None and not hp.olmo2:  # per head, over head_dim
            q = _rms_norm(q, W.q_norm, hp.eps)
        if W.k_norm is not None and not hp.olmo2:
            k = _rms_norm(k, W.k_norm, hp.eps)
        k_pre_rope = k
        q = _apply_rope(q, positions, inv_freq, hp.interleaved)
        k = _apply_rope(k, positions, inv_freq, hp.interleaved)

        # kv-embedding: the K/V of the last `num_prefix` tokens become extra columns in front
        if l in reroute:
            m = min(num_prefix, n)
            src = list(range(n - m, n))
            if prefix_rope == "keep":
                k_pref = k[:, src]  # keeps the rotation of its own position
            elif prefix_rope == "zero":
                k_pref = k_pre_rope[:, src]  # rotation by angle 0 == identity
            else:
                raise ValueError(f"prefix_rope {prefix_rope!r}")
            v_pref = v[:, src]
        else:
            m = 0
            k_pref = k[:, :0]
            v_pref = v[:, :0]
        k_all = torch.cat((k_pref, k), dim=1)  # [kv, m+n, d]
        v_all = torch.cat((v_pref, v), dim=1)
        visible = torch.cat((torch.ones(n, m, dtype=torch.bool), causal), dim=1)  # [n, m+n]
        col_bias = torch.cat((torch.full((m,), float(bias), dtype=_DT), torch.zeros(n, dtype=_DT)))

        heads_out = []
        for head in range(hp.n_heads):
            kv_head = head // hp.group  # GQA: consecutive query heads share a KV head
            logits = (q[head] @ k_all[kv_head].T) * scale  # [n, m+n]
            if hp.softcap is not None:  # Gemma 2: the cap bounds the scores; the prefix's bias is added after it
                logits = hp.softcap * torch.tanh(logits / hp.softcap)
            logits = logits + col_bias
            logits = logits.masked_fill(~visible, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            heads_out.append(probs @ v_all[kv_head])  # [n, d]
        concat = torch.cat(heads_out, dim=-1)  # [n, heads*d]
        attn_pre_o.append(concat)
        a = _linear(concat, W.wo, W.bo)  # [n, H]
        attn_out.append(a)
        if hp.gemma:  # Gemma: norm the attention output, then norms around the MLP
            x = x + _rms_norm(a, W.ln2, hp.eps)
            h = _rms_norm(x, W.pre_ff, hp.eps)
        elif hp.olmo2:  # the MLP reads the residual stream as it is
            x = x + _rms_norm(a, W.ln2, hp.eps)
            h = x
        elif hp.parallel:  # Cohere: the MLP reads the attention's input norm; both join the stream below
            x = x + a
        else:
            x = x + a * hp.residual_scale
            h = hp.norm(x, W.ln2, W.ln2_bias)

        # ---- gated MLP: SwiGLU, or GELU-tanh for Gemma ----
        gate = _linear(h, W.w_gate, W.b_gate)
        up = _linear(h, W.w_up, W.b_up)
        act = _gelu_tanh(gate) if hp.gemma else torch.nn.functional.silu(gate)
        down = _linear(act * up, W.w_down, W.b_down)
        x = x + (_rms_norm(down, W.post_ff, hp.eps) if hp.gemma or hp.olmo2 else down * hp.residual_scale)
        assert x.shape == (n, H)

    hidden.append(x)
    return {"hidden": hidden, "values": values, "attn_pre_o": attn_pre_o, "attn_out": attn_out}


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation (transformers' ``gelu_pytorch_tanh``)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def final_norm(weights, hp, x):
    w, b = weights["norm.weight"].to(_DT), weights.get("norm.bias")
    return hp.norm(x, w + 1.0 if hp.gemma else w, None if b is None else b.to(_DT))


def normalize(vec: torch.Tensor) -> np.ndarray:
    vec = vec.reshape(-1)
    vec = vec / vec.norm()
    return vec.to(torch.float32).numpy()
