"""Text -> token ids, exactly as every kvembed backend needs them. Torch-free.

One implementation of prompt formatting, text clean-up, placeholder handling, echo spans,
truncation and padding, used by the PyTorch reference and the ONNX runtime alike, so both see
identical token ids for identical text.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
from tokenizers import AddedToken, Tokenizer

from ..methods.spec import CONTEXT, PLACEHOLDER, ResolvedMethod
from ..errors import InvalidInput

TEXT = "{text}"
_EOL_ENDINGS = ('.', '?', '"', "'")


def preprocess_text(text: str) -> str:
    """The official token-prepending / PromptEOL clean-up (METHODS.md, token-prepending).

    Collapse whitespace runs and strip; append '.' to non-empty text not ending in . ? " ';
    replace " with '; replace a trailing ? with '.'.
    """
    text = " ".join(text.split())
    if text and not text.endswith(_EOL_ENDINGS):
        text += "."
    text = text.replace('"', "'")
    if text.endswith("?"):
        text = text[:-1] + "."
    return text


def format_prompt(template: str, text: str) -> tuple[str, tuple[int, int]]:
    """Fill every ``{text}`` of ``template``; return the string and the character span of the last copy."""
    parts = template.split(TEXT)
    if len(parts) < 2:
        raise InvalidInput(f"prompt template {template!r} has no {TEXT} field")
    head = text.join(parts[:-1])  # everything before the last copy, earlier copies filled in
    return head + text + parts[-1], (len(head), len(head) + len(text))


def unicode_problem(text: str) -> str | None:
    """Why ``text`` is not Unicode text a tokenizer takes, or None: a lone surrogate (``"\\ud800"``
    in JSON, or a file read with ``surrogateescape``) cannot be encoded as UTF-8. Such input is
    refused, never silently changed (the same rule in ``embed``, ``serve`` and ``embed-corpus``)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return (f"holds a lone surrogate U+{ord(text[err.start]):04X} at character {err.start}, which is not Unicode text "
                "(send UTF-8, or a surrogate pair as JSON's \\ud83d\\ude00 escapes)")
    return None


class TokenizerFailed(InvalidInput):
    """The artifact's tokenizer failed on one text (a Rust panic in ``tokenizers``, caught as what
    it is: it derives from BaseException, so ``except Exception`` would let it through)."""


def tokenize(tokenizer: Tokenizer, text: str, add_special_tokens: bool = True) -> Any:
    """``tokenizer.encode(text)`` (with its special tokens unless told); a panic becomes :class:`TokenizerFailed`."""
    try:
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    except BaseException as err:  # noqa: B036 - pyo3's PanicException is a BaseException
        if type(err).__name__ != "PanicException":
            raise
        detail = " ".join(str(err).split())[:200]
        raise TokenizerFailed(f"the artifact's tokenizer failed on this text ({detail}); the tokenizer.json is at fault") from None


def check_texts(texts: Any, first_index: int = 0) -> list[str]:
    """Validate user input: a list (or tuple, or iterable) of str. ``None`` / non-str -> TypeError naming
    the index (counted from ``first_index``: the position of ``texts[0]`` in a longer stream)."""
    if isinstance(texts, (str, bytes)) or texts is None:
        raise TypeError(f"texts must be a list of str, got {type(texts).__name__}")
    items = list(texts)
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise TypeError(f"texts[{first_index + index}] is {type(item).__name__}, expected str")
    return items


#: tokens a window leaves free beside the prompt for merges where the text meets the prompt
WINDOW_MARGIN = 4

#: a truncation warning names the cut texts by index when there are at most this many
NAMED_TRUNCATIONS = 10


def truncation_message(indices: Sequence[int], total: int, max_length: int) -> str:
    """One readable line: how many texts were cut, the limit, and which (by index) when few."""
    named = ", ".join(f"texts[{i}]" for i in indices[:NAMED_TRUNCATIONS])
    more = f" and {len(indices) - NAMED_TRUNCATIONS} more" if len(indices) > NAMED_TRUNCATIONS else ""
    return (
        f"{len(indices)} of {total} text(s) exceed max_length={max_length} tokens and were cut to fit "
        f"({named}{more}); the prompt template is kept whole"
    )


@dataclass(frozen=True)
class EncodedText:
    """One text's token ids, plus the positions to pool over where the method needs them."""

    ids: tuple[int, ...]
    pool: tuple[int, ...] | None
    truncated: bool
    context: tuple[int, ...] | None = None
    """The context encoder's token ids of the text (Causal2Vec), else None."""
    text_tokens: int | None = None
    """A window's share of its text (`TextEncoder.encode_windows`): how many tokens of the bare
    text's tokenisation it holds, prompt and special tokens not counted; None for a whole input."""


class TextEncoder:
    """Formats, cleans, tokenises and truncates texts for one resolved method.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` (transformers' fast tokenizers expose theirs as
    ``backend_tokenizer``); its own special-token behaviour (BOS/EOS) is kept. For token-prepending
    the placeholder ``<PST>`` is added as a token that absorbs the space before it, matching the
    official code's ids with Llama 2's fast tokenizer.

    Causal2Vec (``method.contextual``) also needs ``context_tokenizer``, the bidirectional
    encoder's: it tokenises the bare text (cut to ``context_max_length`` by the tokenizer's own
    truncation, which keeps its special tokens), and the prompt's ``{context}`` becomes the
    checkpoint's placeholder token, whose position goes into ``pool``.

    ``padding_side`` (the artifact manifest's) is where :meth:`pad` puts the padding.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        method: ResolvedMethod,
        max_length: int,
        fallback_id: int = 0,
        pad_id: int | None = None,
        context_tokenizer: Tokenizer | None = None,
        context_max_length: int = 512,
        context_pad_id: int = 0,
        padding_side: str = "right",
    ) -> None:
        self.tokenizer = tokenizer
        self.padding_side = check_padding_side(padding_side)
        self.method = method
        self.max_length = int(max_length)
        self.min_width = 1  # pad() pads every batch to at least this many tokens (a TensorRT profile's minimum)
        self.fallback_id = int(fallback_id)
        self.pad_id = int(pad_id if pad_id is not None else fallback_id)
        self.placeholder_id: int | None = None
        if method.placeholder:
            self.placeholder_id = add_placeholder(tokenizer)
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        #: characters of the vocabulary's longest token (a byte-level token's characters are its bytes)
        self.longest_token = max((len(token) for token in tokenizer.get_vocab(with_added_tokens=True)), default=1) or 1
        self.context_tokenizer = context_tokenizer
        self.context_id: int | None = None
        self.context_pad_id = int(context_pad_id)
        self.context_max_length = int(context_max_length)
        if method.contextual:
            self.context_id = context_token_id(tokenizer, str(method.options["placeholder"]))
            if context_tokenizer is None:
                raise InvalidInput("causal2vec needs the context encoder's tokenizer (encoder/tokenizer.json)")
            context_tokenizer.no_padding()
            context_tokenizer.enable_truncation(self.context_max_length)

    def cap_input_tokens(self, tokens: int) -> None:
        """Cut (and flag as truncated) every later input at ``tokens``, prompt included; a cap above
        the current :attr:`max_length` changes nothing (a server's per-input limit, an engine's profiles)."""
        if tokens < 1:
            raise InvalidInput(f"an input cap must be >= 1 token, got {tokens}")
        self.max_length = min(self.max_length, int(tokens))

    def pad_at_least(self, width: int) -> None:
        """Pad every later batch to at least ``width`` tokens (a TensorRT profile's shortest sequence)."""
        self.min_width = max(1, int(width))

    # -- one text ----------------------------------------------------------------------------

    def encode_one(self, text: str, kind: str = "document") -> EncodedText:
        template = self.method.templates[kind]
        context_span = None
        if self.method.contextual:
            placeholder = str(self.method.options["placeholder"])
            start = template.index(CONTEXT)  # before {text}: the prompt up to it does not depend on the text
            context_span = (start, start + len(placeholder))
            template = template.replace(CONTEXT, placeholder)
        problem = unicode_problem(text)
        if problem is not None:
            raise InvalidInput(f"the text {problem}")
        if self.method.preprocess:
            text = preprocess_text(text)
        encoding, span = self._encode(template, self._head(text))
        if len(encoding.ids) <= self.max_length and span[1] - span[0] < len(text):
            encoding, span = self._encode(template, text)  # the head fit (a normaliser shrank it): the whole text decides
        truncated = len(encoding.ids) > self.max_length
        if truncated:
            keep = self._fit(template, text, encoding)
            encoding, span = self._encode(template, text[:keep])
        ids = list(encoding.ids)
        pool: list[int] | None = None
        if self.method.uses_pool_mask:
            special = encoding.special_tokens_mask
            pool = [
                i
                for i, (a, b) in enumerate(encoding.offsets)
                if not special[i] and a < span[1] and b > span[0]
            ]
        if not ids:  # e.g. raw "" on a tokenizer that adds no BOS: one stand-in token
            ids = [self.fallback_id]
        if pool is not None and not pool:  # empty text span (echo of ""): pool the last token
            pool = [len(ids) - 1]
        if self.placeholder_id is not None and ids.count(self.placeholder_id) != 1:
            raise InvalidInput(
                f"the prompt must contain {PLACEHOLDER} exactly once after tokenisation, found "
                f"{ids.count(self.placeholder_id)}; does the text itself contain {PLACEHOLDER!r}?"
            )
        context = None
        if context_span is not None:
            pool = [self._context_position(encoding, context_span)]
            assert self.context_tokenizer is not None
            context = tuple(tokenize(self.context_tokenizer, text).ids) or (self.context_pad_id,)
        return EncodedText(tuple(ids), None if pool is None else tuple(pool), truncated, context)

    def _context_position(self, encoding: Any, span: tuple[int, int]) -> int:
        """The token of the placeholder at character ``span`` of the prompt (Causal2Vec)."""
        for index, (token, offsets) in enumerate(zip(encoding.ids, encoding.offsets)):
            if token == self.context_id and tuple(offsets) == span:
                return index
        raise InvalidInput(
            f"the placeholder {self.method.options['placeholder']!r} did not tokenise as one token at its place in "
            f"the prompt; use a special token of the LLM's tokenizer (e.g. its BOS) as the placeholder"
        )

    def encode_windows(self, text: str, kind: str = "document") -> list[EncodedText]:
        """``text`` as :meth:`encode_one` gives it when it fits in :attr:`max_length` tokens (one
        item); otherwise its *windows*, in order: the (cleaned) text cut at token boundaries into
        consecutive pieces, none left out and none repeated (no overlap), each encoded by
        :meth:`encode_one` with the prompt around it and at most :attr:`max_length` tokens,
        ``truncated`` False and ``text_tokens`` its share of the text's tokens. The bare text is
        tokenised once; a window holds the tokens that fit beside the prompt's own (each copy of the
        text counted, as echo repeats it) less :data:`WINDOW_MARGIN` for merges at its edges, and a
        window the prompt's merges still push over is shortened until it fits."""
        if kind not in self.method.templates:
            raise InvalidInput(f"kind must be one of {', '.join(self.method.templates)}, got {kind!r}")
        problem = unicode_problem(text)
        if problem is not None:
            raise InvalidInput(f"the text {problem}")
        template = self.method.templates[kind]
        if self.method.contextual:
            template = template.replace(CONTEXT, str(self.method.options["placeholder"]))
        cleaned = preprocess_text(text) if self.method.preprocess else text
        if self._fits(template, cleaned):
            return [self.encode_one(text, kind)]
        encoding = tokenize(self.tokenizer, cleaned)
        starts = [a for (a, _), special in zip(encoding.offsets, encoding.special_tokens_mask) if not special]
        prompt = len(self._encode(template, "")[0].ids)
        room = (self.max_length - prompt - WINDOW_MARGIN) // template.count(TEXT)
        if room < 1:
            raise InvalidInput(f"the prompt template leaves no room for a window in max_length={self.max_length} tokens; "
                               "raise max_length or use a shorter prompt")
        windows: list[EncodedText] = []
        first = begin = 0  # the window's first token and its first character
        while first < len(starts) and begin < len(cleaned):
            size = min(room, len(starts) - first)
            while True:
                stop = _window_stop(starts, first, size, begin)
                end = len(cleaned) if stop == len(starts) else starts[stop]
                if size == 1 or self._fits(template, cleaned[begin:end], clean=True):
                    break
                size = max(1, min(size, stop - first) - max(WINDOW_MARGIN, size // 16))
            windows.append(replace(self.encode_one(cleaned[begin:end], kind), text_tokens=stop - first))
            first, begin = stop, end
        return windows

    def encode_tail(self, text: str, kind: str = "document") -> EncodedText:
        """``text`` as :meth:`encode_one` encodes it, but cut at its start when over the cap: its
        longest end that fits with the prompt (TEI's ``truncation_direction: left``, Cohere's
        ``truncate: START``); flagged ``truncated``."""
        item = self.encode_one(text, kind)
        if not item.truncated:
            return item
        template = self.method.templates[kind]
        if self.method.contextual:
            template = template.replace(CONTEXT, str(self.method.options["placeholder"]))
        tail = text[-2 * (self.max_length + 1) * self.longest_token :]  # as _head: surely more than fits
        lo, hi = 0, len(tail)
        while lo < hi:  # tokens shrink as the start moves right: binary search the first start that fits
            mid = (lo + hi) // 2
            if self._fits(template, tail[mid:], clean=True):
                hi = mid
            else:
                lo = mid + 1
        return replace(self.encode_one(tail[lo:], kind), truncated=True)

    def _fits(self, template: str, text: str, clean: bool = False) -> bool:
        """Whether ``text`` (cleaned already; ``clean``: clean it as :meth:`encode_one` will) fits
        in :attr:`max_length` tokens with the prompt around it, tokenising no more than fits."""
        if clean and self.method.preprocess:
            text = preprocess_text(text)
        head = self._head(text)
        if len(self._encode(template, head)[0].ids) > self.max_length:
            return False
        return head == text or len(self._encode(template, text)[0].ids) <= self.max_length

    def encode(self, texts: Sequence[str], kind: str = "document", first_index: int = 0) -> list[EncodedText]:
        """Encode ``texts``; over-long ones are cut and named in one warning (indices counted from
        ``first_index``, the position of ``texts[0]`` in a longer stream)."""
        if kind not in self.method.templates:
            raise InvalidInput(f"kind must be one of {', '.join(self.method.templates)}, got {kind!r}")
        encoded = []
        for index, text in enumerate(texts):
            try:
                encoded.append(self.encode_one(text, kind))
            except InvalidInput as err:
                raise type(err)(f"texts[{first_index + index}]: {err}") from None
        cut = [first_index + i for i, item in enumerate(encoded) if item.truncated]
        if cut:
            warnings.warn(truncation_message(cut, len(encoded), self.max_length), stacklevel=3)
        return encoded

    def _encode(self, template: str, text: str) -> tuple[Any, tuple[int, int]]:
        prompt, span = format_prompt(template, text)
        return tokenize(self.tokenizer, prompt), span

    def _head(self, text: str) -> str:
        """The start of ``text`` that surely holds more than :attr:`max_length` tokens, or all of
        it: no token covers more than :attr:`longest_token` characters, so twice that per token
        is ample. Tokenising holds the GIL, so a megabyte of input cut here costs what its first
        tokens cost, not a stall of every other request (and ``/health``)."""
        head = 2 * (self.max_length + 1) * self.longest_token
        return text if len(text) <= head else text[:head]

    def _fit(self, template: str, text: str, encoding: Any) -> int:
        """The longest prefix of ``text`` (in characters) whose prompt fits in ``max_length`` tokens."""
        prompt_prefix = template.split(TEXT)[0]
        covered = max(end for _, end in encoding.offsets[: self.max_length + 1])
        lo, hi = 0, max(0, min(len(text), covered - len(prompt_prefix)))
        while lo < hi:  # tokens grow with characters: binary search the last fitting length
            mid = (lo + hi + 1) // 2
            if len(self._encode(template, text[:mid])[0].ids) <= self.max_length:
                lo = mid
            else:
                hi = mid - 1
        if len(self._encode(template, text[:lo])[0].ids) > self.max_length:
            raise InvalidInput(
                f"the prompt template alone needs more than max_length={self.max_length} tokens; "
                "raise max_length or use a shorter prompt"
            )
        return lo

    # -- batches -----------------------------------------------------------------------------

    def pad(self, items: Sequence[EncodedText], padding_side: str | None = None) -> dict[str, np.ndarray]:
        """Stack encoded texts into int64 ``input_ids`` / ``attention_mask`` (and ``pool_mask``),
        padded on the encoder's :attr:`padding_side`; ``padding_side`` overrides it for one call
        (the parity gate pads both sides to prove the side does not matter)."""
        padding_side = self.padding_side if padding_side is None else check_padding_side(padding_side)
        width = max(max((len(item.ids) for item in items), default=1), self.min_width)
        n = len(items)
        input_ids = np.full((n, width), self.pad_id, dtype=np.int64)
        attention = np.zeros((n, width), dtype=np.int64)
        pool = np.zeros((n, width), dtype=np.int64) if self.method.uses_pool_mask else None
        for row, item in enumerate(items):
            offset = 0 if padding_side == "right" else width - len(item.ids)
            input_ids[row, offset : offset + len(item.ids)] = item.ids
            attention[row, offset : offset + len(item.ids)] = 1
            if pool is not None and item.pool is not None:
                pool[row, [offset + i for i in item.pool]] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention}
        if pool is not None:
            batch["pool_mask"] = pool
        if self.method.contextual:
            batch.update(self._pad_context(items))
        return batch

    def _pad_context(self, items: Sequence[EncodedText]) -> dict[str, np.ndarray]:
        """The context encoder's ``encoder_input_ids`` / ``encoder_attention_mask`` (right-padded:
        the encoder is bidirectional and mean-pools under its mask, so the side does not matter)."""
        width = max((len(item.context or ()) for item in items), default=1)
        ids = np.full((len(items), width), self.context_pad_id, dtype=np.int64)
        mask = np.zeros((len(items), width), dtype=np.int64)
        for row, item in enumerate(items):
            if item.context is None:
                raise InvalidInput("a Causal2Vec batch needs every item's context encoder ids (TextEncoder.encode_one)")
            ids[row, : len(item.context)] = item.context
            mask[row, : len(item.context)] = 1
        return {"encoder_input_ids": ids, "encoder_attention_mask": mask}


def _window_stop(starts: Sequence[int], first: int, size: int, begin: int) -> int:
    """Where a window of at most ``size`` tokens from token ``first`` ends: the last token index
    up to ``first + size`` at which a new character begins (tokens of one character, as a byte-level
    tokenizer splits a multi-byte one, stay together), else the first one after (or the end)."""
    def cut(k: int) -> bool:
        return k == len(starts) or (starts[k] > starts[k - 1] and starts[k] > begin)

    stop = min(first + size, len(starts))
    while stop > first + 1 and not cut(stop):
        stop -= 1
    while not cut(stop):
        stop += 1
    return stop


def check_padding_side(side: str) -> str:
    if side not in ("right", "left"):
        raise InvalidInput(f"padding_side must be 'right' or 'left', got {side!r}")
    return side


def context_token_id(tokenizer: Tokenizer, placeholder: str) -> int:
    """The id of Causal2Vec's placeholder token, which must already be in the LLM's vocabulary (its
    input embedding row is replaced, so an added token would have none)."""
    token_id = tokenizer.token_to_id(placeholder)
    if token_id is None:
        raise InvalidInput(
            f"the placeholder {placeholder!r} is not a token of the LLM's vocabulary; set causal2vec.json's "
            "'placeholder' to one of its tokens (the paper uses the BOS, e.g. '<s>')"
        )
    return int(token_id)


def add_placeholder(tokenizer: Tokenizer) -> int:
    """Register ``<PST>`` on ``tokenizer`` (idempotent) and return its id.

    ``lstrip=True`` makes the token absorb the space before it, which reproduces the official
    token-prepending ids on Llama 2's fast tokenizer (``▁:``, ``<PST>``, ``▁"``).
    """
    existing = tokenizer.token_to_id(PLACEHOLDER)
    if existing is not None:
        return existing
    tokenizer.add_tokens([AddedToken(PLACEHOLDER, lstrip=True, normalized=True)])
    token_id = tokenizer.token_to_id(PLACEHOLDER)
    assert token_id is not None
    return token_id
