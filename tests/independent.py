"""Independent reference computation of the kvembed methods: the test oracle.

An :class:`Oracle` reads a model folder itself -- ``config.json`` (plain JSON), the
``*.safetensors`` weights and ``tokenizer.json`` (the ``tokenizers`` library) -- and computes
METHODS.md's definitions with plain float64 torch tensor ops, one text at a time. The prompt
strings below are copied literally from METHODS.md (the contract), as are the text clean-up, the
``<PST>`` registration, the echo pooling span and the option defaults.

This module must NOT import kvembed and must NOT call transformers' modelling or configuration
code, so a test comparing kvembed against it takes nothing from the code under test: not its
token ids, placeholder index, pooling span, resolved options or loaded weights.

Supported architectures: Llama, Mistral (sliding-window attention), Qwen2 (q/k/v biases), Qwen3
(per-head q_norm/k_norm), Gemma 3 (``gemma3_text``, written from transformers'
``models/gemma3/modeling_gemma3.py``: embeddings times sqrt(hidden), RMSNorm weights as ``1 + w``,
q/k norms, a norm on the attention output and around the GELU-tanh MLP, attention scale
``query_pre_attn_scalar ** -0.5``, sliding-window and global layers from ``layer_types`` each
with its own RoPE base). RoPE: "default" and "llama3" frequency scaling. The result of
:meth:`Oracle.embed` is a float32, L2-normalised 1-D numpy array.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

_DT = torch.float64

# --------------------------------------------------------------------------------------------
# the contract, copied literally from METHODS.md
# --------------------------------------------------------------------------------------------

PLACEHOLDER = "<PST>"
KV_PROMPTS = {
    "query": '"Query: {text}" Compress the Query in one word:',
    "document": '"Context: {text}" Compress the Context in one word:',
}
PROMPTEOL = 'This sentence : "{text}" means in one word:"'
FUTUREEOL = 'Forecasting the subsequent tokens "{text}" in one word:"'
TP_PROMPTS = {
    "prompteol": 'This sentence : <PST> "{text}" means in one word:"',
    "cot": 'After thinking step by step , this sentence : <PST> "{text}" means in one word:"',
    "ke": (
        "The essence of a sentence is often captured by its main subjects and actions, while descriptive "
        "terms provide additional but less central details. With this in mind , this sentence : <PST> "
        '"{text}" means in one word:"'
    ),
}
ECHO = "Rewrite the sentence: {text}, rewritten sentence: {text}"
RAW = "{text}"

#: the options each method takes (any other keyword is a TypeError, never a silent default)
OPTIONS = {
    "kv-embedding": ("layers", "bias", "num_prefix", "prefix_rope", "pooling", "prompt"),
    "va": ("layers",),
    "aligned-wva": ("layers", "prompt", "wva"),
    "token-prepending": ("tp_start", "tp_stop", "exit_layer", "prompt"),
    "last-token": (),
    "mean": (),
    "prompteol": (),
    "echo": (),
}
METHODS = tuple(OPTIONS)


def official_clean(text: str) -> str:
    """METHODS.md token-prepending preprocessing (also PromptEOL's), in its stated order."""
    text = " ".join(text.split())
    if text and text[-1] not in ".?\"'":
        text += "."
    text = text.replace('"', "'")
    if text.endswith("?"):
        text = text[:-1] + "."
    return text


def parse_layers(spec: Any, num_layers: int) -> list[int]:
    """'none', '1-2', '0,2-3', an int or a list of ints -> sorted layer indices (checked)."""
    if isinstance(spec, int):
        layers = [spec]
    elif isinstance(spec, str):
        layers = []
        if spec.strip() != "none":
            for part in spec.split(","):
                a, _, b = part.strip().partition("-")
                layers.extend(range(int(a), int(b or a) + 1))
    else:
        layers = [int(x) for x in spec]
    layers = sorted(set(layers))
    for layer in layers:
        if not 0 <= layer < num_layers:
            raise ValueError(f"layer {layer} out of range for a {num_layers}-layer model")
    return layers


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
    """Hyper-parameters read from a ``config.json`` dict (missing required keys raise KeyError)."""

    def __init__(self, config: dict[str, Any]):
        self.hidden = config["hidden_size"]
        self.n_layers = config["num_hidden_layers"]
        self.n_heads = config["num_attention_heads"]
        self.n_kv = config.get("num_key_value_heads") or self.n_heads
        self.head_dim = config.get("head_dim") or self.hidden // self.n_heads
        self.eps = config["rms_norm_eps"]
        if self.n_heads % self.n_kv:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.group = self.n_heads // self.n_kv
        self.gemma = config.get("model_type") == "gemma3_text"
        #: per layer: "full_attention" or "sliding_attention" (Gemma 3); None: every layer alike
        self.layer_types = config.get("layer_types") if self.gemma else None
        self.attn_scale = (config["query_pre_attn_scalar"] if self.gemma else self.head_dim) ** -0.5
        self.embed_scale = math.sqrt(self.hidden) if self.gemma else 1.0
        if self.gemma:
            if config.get("hidden_activation") != "gelu_pytorch_tanh":
                raise NotImplementedError(f"hidden_activation {config.get('hidden_activation')!r}")
            if config.get("attn_logit_softcapping") is not None or config.get("use_bidirectional_attention"):
                raise NotImplementedError("attention soft-capping or bidirectional attention")
            self.rope_by_type = {kind: float(p["rope_theta"]) for kind, p in config["rope_parameters"].items()}
            for p in config["rope_parameters"].values():
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
        if rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) != 1.0:
            raise NotImplementedError("partial rotary embeddings")
        # sliding-window attention (Mistral; Qwen2 only with use_sliding_window): key j is visible
        # to query i iff i - W < j <= i
        self.sliding_window = config.get("sliding_window")
        if config.get("use_sliding_window", True) is False:
            self.sliding_window = None
        if self.sliding_window is not None and config.get("model_type") == "qwen2":
            raise NotImplementedError("Qwen2's per-layer sliding window (max_window_layers)")

    def window(self, layer: int) -> int | None:
        """The attention window of ``layer`` in tokens, None for global attention."""
        if self.layer_types is not None:
            return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None
        return self.sliding_window

    def inv_freq(self, layer: int = 0) -> torch.Tensor:
        d = self.head_dim
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


def _apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """x: [heads, n, d]; positions: [n]. Returns x*cos + rotate_half(x)*sin."""
    freqs = positions.to(_DT)[:, None] * inv_freq[None, :]  # [n, d/2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [n, d]
    return x * angles.cos() + _rotate_half(x) * angles.sin()


class _Layer:
    """The float64 weights of one decoder layer (converted lazily, one layer at a time)."""

    def __init__(self, weights: dict[str, torch.Tensor], index: int, gemma: bool = False):
        prefix = f"layers.{index}."

        def get(name, required=True):
            t = weights.get(prefix + name)
            if t is None:
                if required:
                    raise KeyError(prefix + name)
                return None
            t = t.to(_DT)
            return t + 1.0 if gemma and name.endswith("norm.weight") else t  # Gemma scales by 1 + w

        self.ln1 = get("input_layernorm.weight")
        self.ln2 = get("post_attention_layernorm.weight")
        self.pre_ff = get("pre_feedforward_layernorm.weight", gemma)  # Gemma 3 only
        self.post_ff = get("post_feedforward_layernorm.weight", gemma)
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
        W = _Layer(weights, l, hp.gemma)
        inv_freq = hp.inv_freq(l)
        causal = causal_mask(hp.window(l))

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
        if hp.gemma:  # Gemma: norm the attention output, then norms around the MLP
            x = x + _rms_norm(a, W.ln2, hp.eps)
            h = _rms_norm(x, W.pre_ff, hp.eps)
        else:
            x = x + a
            h = _rms_norm(x, W.ln2, hp.eps)

        # ---- gated MLP: SwiGLU, or GELU-tanh for Gemma ----
        gate = _linear(h, W.w_gate, W.b_gate)
        up = _linear(h, W.w_up, W.b_up)
        act = _gelu_tanh(gate) if hp.gemma else torch.nn.functional.silu(gate)
        down = _linear(act * up, W.w_down, W.b_down)
        x = x + (_rms_norm(down, W.post_ff, hp.eps) if hp.gemma else down)
        assert x.shape == (n, H)

    hidden.append(x)
    return {"hidden": hidden, "values": values, "attn_pre_o": attn_pre_o, "attn_out": attn_out}


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation (transformers' ``gelu_pytorch_tanh``)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def _final_norm(weights, hp, x):
    w = weights["norm.weight"].to(_DT)
    return _rms_norm(x, w + 1.0 if hp.gemma else w, hp.eps)


def _normalize(vec: torch.Tensor) -> np.ndarray:
    vec = vec.reshape(-1)
    vec = vec / vec.norm()
    return vec.to(torch.float32).numpy()


# --------------------------------------------------------------------------------------------
# text -> token ids
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tokens:
    """One prompted text: its ids, the ``<PST>`` position, the echo pooling positions."""

    ids: list[int]
    pst_index: int | None = None
    pool: list[int] | None = None
    truncated: bool = False


def _template(method: str, kind: str, prompt: str | None) -> tuple[str, bool]:
    """METHODS.md's prompt for ``method`` and ``kind`` (or the ``prompt`` option), and whether the
    text gets the official clean-up first."""
    if kind not in ("query", "document"):
        raise ValueError(f"kind {kind!r}")
    if method == "kv-embedding":
        if prompt in (None, "compress"):
            return KV_PROMPTS[kind], False
        if "{text}" not in prompt:
            raise ValueError(f"prompt {prompt!r}")
        return prompt, False
    if method == "aligned-wva":
        return {None: PROMPTEOL, "prompteol": PROMPTEOL, "futureeol": FUTUREEOL}[prompt], False
    if method == "token-prepending":
        return TP_PROMPTS[prompt or "prompteol"], True
    if method == "prompteol":
        return PROMPTEOL, True
    if method == "echo":
        return ECHO, False
    if method in ("va", "last-token", "mean"):
        return RAW, False
    raise ValueError(f"unknown method {method!r}")


# --------------------------------------------------------------------------------------------
# the oracle
# --------------------------------------------------------------------------------------------


class Oracle:
    """A model folder read from disk, embedding one text at a time by METHODS.md."""

    def __init__(self, folder) -> None:
        from tokenizers import AddedToken, Tokenizer

        self.folder = Path(folder)
        self.config: dict[str, Any] = json.loads((self.folder / "config.json").read_text(encoding="utf-8"))
        self.hp = _Hparams(self.config)
        self.weights = _strip(load_weights(self.folder))
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        # METHODS.md: <PST> is an added token of the fast tokenizer, and the space before it is
        # absorbed (Llama 2: "▁:", "<PST>", '▁"'): an lstrip token
        self.pst_tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self.pst_tokenizer.no_truncation()
        self.pst_tokenizer.no_padding()
        self.pst_tokenizer.add_tokens([AddedToken(PLACEHOLDER, lstrip=True)])
        self.pst_id = self.pst_tokenizer.token_to_id(PLACEHOLDER)
        tokenizer_config = self.folder / "tokenizer_config.json"
        declared = json.loads(tokenizer_config.read_text(encoding="utf-8")) if tokenizer_config.is_file() else {}
        limits = [self.config.get("max_position_embeddings"), declared.get("model_max_length")]
        #: README: texts longer than this are cut (the prompt stays whole)
        self.max_length = min(int(x) for x in limits if x is not None and 0 < int(x) < 10**8)

    @property
    def num_layers(self) -> int:
        return self.hp.n_layers

    # -- tokens -------------------------------------------------------------------------------

    def tokenize(self, method: str, text: str, kind: str = "document", prompt: str | None = None) -> Tokens:
        """The ids METHODS.md prescribes for ``text``; too long texts lose characters at their end."""
        template, clean = _template(method, kind, prompt)
        if clean:
            text = official_clean(text)
        tokens = self._tokens(method, template, text)
        if len(tokens.ids) <= self.max_length:
            return tokens
        keep = len(text)  # coarse steps down until the prompt fits, then the longest fitting prefix
        while keep > 0 and len(self._tokens(method, template, text[:keep]).ids) > self.max_length:
            keep = max(0, keep - 64)
        for longer in range(min(len(text), keep + 63), keep, -1):
            if len(self._tokens(method, template, text[:longer]).ids) <= self.max_length:
                keep = longer
                break
        cut = self._tokens(method, template, text[:keep])
        if len(cut.ids) > self.max_length:
            raise ValueError("the prompt alone is longer than max_length")
        return Tokens(cut.ids, cut.pst_index, cut.pool, truncated=True)

    def _tokens(self, method: str, template: str, text: str) -> Tokens:
        prompt = template.replace("{text}", text)
        placeholder = method == "token-prepending"
        encoding = (self.pst_tokenizer if placeholder else self.tokenizer).encode(prompt)
        ids = list(encoding.ids)
        if not ids:  # README: a text without any token gets EOS (else BOS, else pad)
            fallback = [self.config.get(k) for k in ("eos_token_id", "bos_token_id", "pad_token_id")]
            ids = [next(t for t in fallback if t is not None)]
        pst_index = None
        if placeholder:
            if ids.count(self.pst_id) != 1:
                raise ValueError(f"{PLACEHOLDER} occurs {ids.count(self.pst_id)} times")
            pst_index = ids.index(self.pst_id)
        pool = None
        if method == "echo":  # the tokens of the second copy of the text (the end of the prompt)
            start = len(prompt) - len(text)
            special = encoding.special_tokens_mask
            pool = [i for i, (a, b) in enumerate(encoding.offsets) if not special[i] and b > start and text]
            pool = pool or [len(ids) - 1]  # README: an empty second copy pools the last token
        return Tokens(ids, pst_index, pool)

    # -- embeddings -----------------------------------------------------------------------------

    def embed(self, method: str, text: str, kind: str = "document", **options: Any) -> np.ndarray:
        """METHODS.md's embedding of ``text``; ``options`` are the method's (see OPTIONS)."""
        if method not in OPTIONS:
            raise ValueError(f"unknown method {method!r}")
        unknown = set(options) - set(OPTIONS[method])
        if unknown:
            raise TypeError(f"the oracle's {method} takes no option {', '.join(sorted(unknown))}")
        tokens = self.tokenize(method, text, kind, options.pop("prompt", None))
        return self.embed_tokens(method, tokens, **options)

    def embed_tokens(
        self,
        method: str,
        tokens: Tokens,
        *,
        layers: Any = None,
        bias: float = 1.0,
        num_prefix: int = 1,
        prefix_rope: str = "keep",
        pooling: str = "last-mean",
        wva: bool = False,
        tp_start: int = 1,
        tp_stop: int = 7,
        exit_layer: int | None = None,
    ) -> np.ndarray:
        """Embed already-prompted ``tokens`` (no padding) with ``method``."""
        weights, hp, ids = self.weights, self.hp, tokens.ids
        L, last = hp.n_layers, len(ids) - 1
        with torch.no_grad():
            if method in ("last-token", "prompteol", "mean", "echo"):
                h = _final_norm(weights, hp, _forward(weights, hp, ids, n_layers_to_run=L)["hidden"][-1])
                if method == "mean":
                    return _normalize(h.mean(dim=0))
                if method == "echo":
                    return _normalize(h[tokens.pool].mean(dim=0))
                return _normalize(h[last])

            if method == "kv-embedding":
                # no preset: README's band L//3 .. 7L//12 (Qwen3-4B's 12-21 of 36 scaled by depth)
                R = parse_layers(f"{L // 3}-{min(L - 1, max(L // 3, 7 * L // 12))}" if layers is None else layers, L)
                if num_prefix < 1:
                    raise ValueError("num_prefix must be >= 1")
                out = _forward(weights, hp, ids, n_layers_to_run=L, reroute=set(R), bias=float(bias),
                               num_prefix=int(num_prefix), prefix_rope=prefix_rope)
                h = _final_norm(weights, hp, out["hidden"][-1])
                pooled = {"last-mean": lambda: (h[last] + h.mean(dim=0)) / 2, "last": lambda: h[last],
                          "mean": lambda: h.mean(dim=0)}[pooling]()
                return _normalize(pooled)

            if method in ("va", "aligned-wva"):
                S = parse_layers(f"{L // 2}-{L - 1}" if layers is None else layers, L)  # deep half by default
                if not S:
                    raise ValueError(f"{method} needs at least one layer")
                out = _forward(weights, hp, ids, n_layers_to_run=max(S) + 1)  # early exit
                if method == "va":
                    per_layer = [out["values"][l].mean(dim=0) for l in S]
                else:
                    key = "attn_pre_o" if wva else "attn_out"
                    per_layer = [out[key][l][last] for l in S]
                return _normalize(torch.stack(per_layer).mean(dim=0))

            if method == "token-prepending":
                exit_layer = L - 1 if exit_layer is None else int(exit_layer)
                if not 1 <= exit_layer <= L:
                    raise ValueError(f"exit_layer {exit_layer} out of range 1..{L}")
                out = _forward(weights, hp, ids, n_layers_to_run=exit_layer,  # layers 0..exit_layer-1
                               tp_window=range(int(tp_start), int(tp_stop)), pst_index=tokens.pst_index)
                return _normalize(out["hidden"][exit_layer][last])
        raise ValueError(f"unknown method {method!r}")
