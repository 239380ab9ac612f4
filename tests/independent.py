"""Independent reference computation of the kvembed methods.

Everything here is written with plain torch tensor ops from a model's weights, one text at a
time, so that kvembed's patched-transformers implementation can be checked against it.  This
module must NOT import kvembed and must NOT call transformers' modelling code; the config object
is only read for hyper-parameters.  The method definitions are those of METHODS.md.

Supported architectures: Llama, Mistral, Qwen2 (q/k/v biases), Qwen3 (per-head q_norm/k_norm).
RoPE: "default" (and "llama3" frequency scaling, as used by Llama-3.1 checkpoints).
All computation is float64 internally; the result is a float32, L2-normalised 1-D numpy array.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

METHODS = (
    "kv-embedding",
    "va",
    "aligned-wva",
    "token-prepending",
    "last-token",
    "mean",
    "prompteol",
    "echo",
)

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


def _strip(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop ``lm_head.*``; strip a leading ``model.``."""
    out = {}
    for name, tensor in weights.items():
        if name.startswith("lm_head."):
            continue
        if name.startswith("model."):
            name = name[len("model."):]
        out[name] = tensor
    return out


class _Hparams:
    def __init__(self, config):
        self.hidden = config.hidden_size
        self.n_layers = config.num_hidden_layers
        self.n_heads = config.num_attention_heads
        self.n_kv = getattr(config, "num_key_value_heads", None) or self.n_heads
        head_dim = getattr(config, "head_dim", None)
        self.head_dim = head_dim if head_dim else self.hidden // self.n_heads
        self.eps = config.rms_norm_eps
        if self.n_heads % self.n_kv:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.group = self.n_heads // self.n_kv
        act = getattr(config, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise NotImplementedError(f"hidden_act {act!r}")

        rope = getattr(config, "rope_parameters", None) or {}
        scaling = getattr(config, "rope_scaling", None) or {}
        rope = {**scaling, **rope}
        self.rope_theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        self.rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        self.rope = rope
        if self.rope_type not in ("default", "llama3"):
            raise NotImplementedError(f"rope_type {self.rope_type!r}")
        if rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) != 1.0:
            raise NotImplementedError("partial rotary embeddings")

        # Sliding-window attention (Mistral; Qwen2 with use_sliding_window) is not implemented:
        # refuse texts long enough for it to matter instead of silently computing something else.
        window = getattr(config, "sliding_window", None)
        if getattr(config, "use_sliding_window", True) is False:
            window = None
        self.sliding_window = window

    def inv_freq(self) -> torch.Tensor:
        d = self.head_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, d, 2, dtype=_DT) / d))
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


def _apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: [heads, n, d]; positions: [n]. Returns x*cos + rotate_half(x)*sin."""
    freqs = positions.to(_DT)[:, None] * inv_freq[None, :]  # [n, d/2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [n, d]
    return x * angles.cos() + _rotate_half(x) * angles.sin()


class _Layer:
    """The float64 weights of one decoder layer (converted lazily, one layer at a time)."""

    def __init__(self, weights: dict[str, torch.Tensor], index: int):
        prefix = f"layers.{index}."

        def get(name, required=True):
            t = weights.get(prefix + name)
            if t is None:
                if required:
                    raise KeyError(prefix + name)
                return None
            return t.to(_DT)

        self.ln1 = get("input_layernorm.weight")
        self.ln2 = get("post_attention_layernorm.weight")
        self.wq, self.bq = get("self_attn.q_proj.weight"), get("self_attn.q_proj.bias", False)
        self.wk, self.bk = get("self_attn.k_proj.weight"), get("self_attn.k_proj.bias", False)
        self.wv, self.bv = get("self_attn.v_proj.weight"), get("self_attn.v_proj.bias", False)
        self.wo, self.bo = get("self_attn.o_proj.weight"), get("self_attn.o_proj.bias", False)
        self.q_norm = get("self_attn.q_norm.weight", False)  # Qwen3 only
        self.k_norm = get("self_attn.k_norm.weight", False)  # Qwen3 only
        self.w_gate, self.b_gate = get("mlp.gate_proj.weight"), get("mlp.gate_proj.bias", False)
        self.w_up, self.b_up = get("mlp.up_proj.weight"), get("mlp.up_proj.bias", False)
        self.w_down, self.b_down = get("mlp.down_proj.weight"), get("mlp.down_proj.bias", False)


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x @ w.T
    return y if b is None else y + b


# --------------------------------------------------------------------------------------------
# the forward pass
# --------------------------------------------------------------------------------------------


def _forward(
    weights: dict[str, torch.Tensor],
    hp: _Hparams,
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
    if hp.sliding_window is not None and n > hp.sliding_window:
        raise NotImplementedError("sliding-window attention is not implemented")
    d, H = hp.head_dim, hp.hidden
    last = n - 1
    inv_freq = hp.inv_freq()
    positions = torch.arange(n)
    scale = 1.0 / math.sqrt(d)

    # token embeddings; the <PST> placeholder gets the zero vector
    x = weights["embed_tokens.weight"][torch.tensor(ids, dtype=torch.long)].to(_DT).clone()
    if pst_index is not None:
        x[pst_index] = 0.0

    # causal mask: key j visible to query i iff j <= i
    causal = torch.ones(n, n, dtype=torch.bool).tril()

    hidden, values, attn_pre_o, attn_out = [], [], [], []
    for l in range(n_layers_to_run):
        W = _Layer(weights, l)

        # token prepending: overwrite the placeholder's residual stream with the last token's
        if l in tp_window:
            x = x.clone()
            x[pst_index] = x[last]
        hidden.append(x)

        # ---- self-attention ----
        h = _rms_norm(x, W.ln1, hp.eps)
        q = _linear(h, W.wq, W.bq).view(n, hp.n_heads, d).transpose(0, 1)  # [heads, n, d]
        k = _linear(h, W.wk, W.bk).view(n, hp.n_kv, d).transpose(0, 1)  # [kv, n, d]
        v_flat = _linear(h, W.wv, W.bv)  # [n, kv*d]
        v = v_flat.view(n, hp.n_kv, d).transpose(0, 1)  # [kv, n, d]
        values.append(v_flat)
        if W.q_norm is not None:
            q = _rms_norm(q, W.q_norm, hp.eps)
        if W.k_norm is not None:
            k = _rms_norm(k, W.k_norm, hp.eps)
        k_pre_rope = k
        q = _apply_rope(q, positions, inv_freq)
        k = _apply_rope(k, positions, inv_freq)

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
            logits = (q[head] @ k_all[kv_head].T) * scale + col_bias  # [n, m+n]
            logits = logits.masked_fill(~visible, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            heads_out.append(probs @ v_all[kv_head])  # [n, d]
        concat = torch.cat(heads_out, dim=-1)  # [n, heads*d]
        attn_pre_o.append(concat)
        a = _linear(concat, W.wo, W.bo)  # [n, H]
        attn_out.append(a)
        x = x + a

        # ---- SwiGLU MLP ----
        h = _rms_norm(x, W.ln2, hp.eps)
        gate = _linear(h, W.w_gate, W.b_gate)
        up = _linear(h, W.w_up, W.b_up)
        x = x + _linear(torch.nn.functional.silu(gate) * up, W.w_down, W.b_down)
        assert x.shape == (n, H)

    hidden.append(x)
    return {"hidden": hidden, "values": values, "attn_pre_o": attn_pre_o, "attn_out": attn_out}


def _final_norm(weights, hp, x):
    return _rms_norm(x, weights["norm.weight"].to(_DT), hp.eps)


def _normalize(vec: torch.Tensor) -> np.ndarray:
    vec = vec.reshape(-1)
    vec = vec / vec.norm()
    return vec.to(torch.float32).numpy()


def _check_layers(layers, n_layers) -> list[int]:
    layers = sorted(set(int(l) for l in layers))
    for l in layers:
        if not 0 <= l < n_layers:
            raise ValueError(f"layer {l} out of range for a {n_layers}-layer model")
    return layers


# --------------------------------------------------------------------------------------------
# public entry point
# --------------------------------------------------------------------------------------------


def independent_embed(
    weights: dict[str, torch.Tensor],
    config,
    method: str,
    ids: list[int],
    *,
    layers: list[int] = (),
    bias: float = 1.0,
    num_prefix: int = 1,
    prefix_rope: str = "keep",
    pooling: str = "last-mean",
    wva: bool = False,
    tp_start: int = 1,
    tp_stop: int = 7,
    exit_layer: int | None = None,
    pst_index: int | None = None,
    pool_range: tuple[int, int] | None = None,
) -> np.ndarray:
    """Embed ONE already-prompted, tokenized text (no padding) with ``method``.

    - kv-embedding: ``layers`` = re-routing set R (may be empty: plain forward), ``bias``,
      ``num_prefix``, ``prefix_rope`` ("keep" | "zero"), ``pooling`` ("last-mean" | "last" | "mean")
      over final-normed last hidden states.
    - va: ``layers`` = S (empty -> deep half L//2..L-1); mean over tokens of v_proj output, mean
      over S.
    - aligned-wva: ``layers`` = S (empty -> deep half); last token's attention output after o_proj
      (``wva=True``: before o_proj), mean over S.
    - token-prepending: ``pst_index`` (required) gets a zero input embedding; before each layer l
      with tp_start <= l < tp_stop its residual stream is replaced by the last token's; output =
      last token's hidden state after layer ``exit_layer``-1 (default L-1), no final norm.
    - last-token / prompteol: final-normed last hidden state of the last token.
    - mean: mean of final-normed last hidden states over all tokens.
    - echo: mean of final-normed last hidden states over positions ``pool_range`` = [start, end).

    Returns a float32, L2-normalised 1-D numpy array.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}")
    ids = [int(i) for i in ids]
    n = len(ids)
    if n == 0:
        raise ValueError("empty ids")
    weights = _strip(weights)
    hp = _Hparams(config)
    L = hp.n_layers
    last = n - 1

    with torch.no_grad():
        if method in ("last-token", "prompteol", "mean", "echo"):
            out = _forward(weights, hp, ids, n_layers_to_run=L)
            h = _final_norm(weights, hp, out["hidden"][-1])
            if method == "mean":
                return _normalize(h.mean(dim=0))
            if method == "echo":
                if pool_range is None:
                    raise ValueError("echo needs pool_range")
                start, end = pool_range
                if not 0 <= start < end <= n:
                    raise ValueError(f"bad pool_range {pool_range} for {n} tokens")
                return _normalize(h[start:end].mean(dim=0))
            return _normalize(h[last])

        if method == "kv-embedding":
            if num_prefix < 1:
                raise ValueError("num_prefix must be >= 1")
            R = _check_layers(layers, L)
            out = _forward(
                weights,
                hp,
                ids,
                n_layers_to_run=L,
                reroute=set(R),
                bias=bias,
                num_prefix=num_prefix,
                prefix_rope=prefix_rope,
            )
            h = _final_norm(weights, hp, out["hidden"][-1])
            if pooling == "last-mean":
                return _normalize((h[last] + h.mean(dim=0)) / 2)
            if pooling == "last":
                return _normalize(h[last])
            if pooling == "mean":
                return _normalize(h.mean(dim=0))
            raise ValueError(f"pooling {pooling!r}")

        if method in ("va", "aligned-wva"):
            S = _check_layers(layers, L) if len(layers) else list(range(L // 2, L))
            out = _forward(weights, hp, ids, n_layers_to_run=max(S) + 1)  # early exit
            if method == "va":
                per_layer = [out["values"][l].mean(dim=0) for l in S]
            else:
                key = "attn_pre_o" if wva else "attn_out"
                per_layer = [out[key][l][last] for l in S]
            return _normalize(torch.stack(per_layer).mean(dim=0))

        if method == "token-prepending":
            if pst_index is None:
                raise ValueError("token-prepending needs pst_index")
            if pst_index < 0:
                pst_index += n
            if not 0 <= pst_index < n:
                raise ValueError(f"pst_index {pst_index} out of range for {n} tokens")
            exit_layer = L - 1 if exit_layer is None else int(exit_layer)
            if not 1 <= exit_layer <= L:
                raise ValueError(f"exit_layer {exit_layer} out of range 1..{L}")
            out = _forward(
                weights,
                hp,
                ids,
                n_layers_to_run=exit_layer,  # layers 0..exit_layer-1
                tp_window=range(tp_start, tp_stop),
                pst_index=pst_index,
            )
            return _normalize(out["hidden"][exit_layer][last])

    raise AssertionError("unreachable")
