"""Independent reference computation of the kvembed methods: the test oracle.

An :class:`Oracle` reads a model folder itself -- ``config.json`` (plain JSON), the
``*.safetensors`` weights and ``tokenizer.json`` (the ``tokenizers`` library) -- and computes
METHODS.md's definitions with plain float64 torch tensor ops, one text at a time. The prompt
strings below are copied literally from METHODS.md (the contract), as are the text clean-up, the
``<PST>`` registration, the echo pooling span and the option defaults.

This module must NOT import kvembed and must NOT call transformers' modelling or configuration
code, so a test comparing kvembed against it takes nothing from the code under test: not its
token ids, placeholder index, pooling span, resolved options or loaded weights.

The decoder families and their forward pass are tests/independent_forward.py's (the same rules
hold there). The result of :meth:`Oracle.embed` is a float32, L2-normalised 1-D numpy array.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from independent_forward import Hparams, final_norm, forward, load_weights, normalize, strip_prefix

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
        self.hp = Hparams(self.config)
        self.weights = strip_prefix(load_weights(self.folder))
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
                h = final_norm(weights, hp, forward(weights, hp, ids, n_layers_to_run=L)["hidden"][-1])
                if method == "mean":
                    return normalize(h.mean(dim=0))
                if method == "echo":
                    return normalize(h[tokens.pool].mean(dim=0))
                return normalize(h[last])

            if method == "kv-embedding":
                # no preset: README's band L//3 .. 7L//12 (Qwen3-4B's 12-21 of 36 scaled by depth)
                R = parse_layers(f"{L // 3}-{min(L - 1, max(L // 3, 7 * L // 12))}" if layers is None else layers, L)
                if num_prefix < 1:
                    raise ValueError("num_prefix must be >= 1")
                out = forward(weights, hp, ids, n_layers_to_run=L, reroute=set(R), bias=float(bias),
                               num_prefix=int(num_prefix), prefix_rope=prefix_rope)
                h = final_norm(weights, hp, out["hidden"][-1])
                pooled = {"last-mean": lambda: (h[last] + h.mean(dim=0)) / 2, "last": lambda: h[last],
                          "mean": lambda: h.mean(dim=0)}[pooling]()
                return normalize(pooled)

            if method in ("va", "aligned-wva"):
                S = parse_layers(f"{L // 2}-{L - 1}" if layers is None else layers, L)  # deep half by default
                if not S:
                    raise ValueError(f"{method} needs at least one layer")
                out = forward(weights, hp, ids, n_layers_to_run=max(S) + 1)  # early exit
                if method == "va":
                    per_layer = [out["values"][l].mean(dim=0) for l in S]
                else:
                    key = "attn_pre_o" if wva else "attn_out"
                    per_layer = [out[key][l][last] for l in S]
                return normalize(torch.stack(per_layer).mean(dim=0))

            if method == "token-prepending":
                exit_layer = L - 1 if exit_layer is None else int(exit_layer)
                if not 1 <= exit_layer <= L:
                    raise ValueError(f"exit_layer {exit_layer} out of range 1..{L}")
                out = forward(weights, hp, ids, n_layers_to_run=exit_layer,  # layers 0..exit_layer-1
                               tp_window=range(int(tp_start), int(tp_stop)), pst_index=tokens.pst_index)
                return normalize(out["hidden"][exit_layer][last])
        raise ValueError(f"unknown method {method!r}")
