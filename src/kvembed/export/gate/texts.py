"""The parity gate's texts: a fixed core for the padding machinery, real-looking variety for the
gate's decision, and a held-out slice that is only reported.

- :data:`PARITY_TEXTS`: short, long, unicode, empty, whitespace-only, quotes (the prompts'
  delimiter), question marks (token-prepending's clean-up), code and numbers; run as queries and
  documents, right- and left-padded (:func:`kvembed.export.gate.parity.batch_plan`).
- the variety texts of ``kvembed/data/gate_texts.jsonl`` (split ``gate``): what users embed
  (search queries, paragraphs up to a few hundred tokens, code, tables, invoices, German, French,
  Chinese, Russian, mixed punctuation), in batches of similar length, each group run once as
  queries and once as documents on opposite padding sides (:data:`GROUP_CASES`): the core already
  covers every kind and side, so the variety texts pay for content, not for padding.
- the held-out slice (split ``held_out``): other queries, code, tables and languages that neither
  the int8 calibration nor the gate's pass/fail decision sees, texts cut mid-word or mid-sentence
  as clients send them (group ``cut``: a last-token vector read where no sentence ends moved
  furthest from fp32 under bf16, benchmarks/log/fp16-on-cpu.md), and short paragraphs read at many
  positions (their prefixes, :data:`PREFIXES`, read only where the held-out texts decide). The
  export reports its worst cosine beside the gate's, so a recipe that fits the gate's own texts but
  not other text shows; for int8 it decides.
- the window text (split ``window``): long plain prose, cut by the model's own tokenizer so that
  it runs :data:`WINDOW_MARGIN` tokens past a sliding-window model's window
  (:func:`window_texts`); the other texts stay shorter than a real model's window, which the
  exported graph's windowed mask would otherwise never be checked past. Only such a model's gate
  runs it.

The file is written for this project and shares no line with ``calibration.txt`` (a test checks).
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

FILE = "gate_texts.jsonl"
GATE, HELD_OUT, WINDOW = "gate", "held_out", "window"
#: a data-file group whose texts run as their prefixes, cut after every :data:`PREFIX_STEP` words
#: (:func:`prefixes`): a last-token vector reads one position, and int8's error differs from one
#: position to the next, so a paragraph read at many positions samples it where whole texts,
#: each ending on a full stop, do not
PREFIXES = "prefixes"
PREFIX_STEP = 2
#: how many tokens past the sliding window the window text runs (prompt included)
WINDOW_MARGIN = 64
#: the window text runs once, as a document: long inputs are documents, and one case is enough for a
#: mask that does not depend on the prompt
WINDOW_KIND = "document"

_LONG = (
    "The committee met on Tuesday to review the budget for the coming year. After a long debate "
    "about road repairs and school funding, the members agreed to postpone the decision on the "
    "swimming pool until spring, when better cost estimates would be available."
)

#: name -> text: the core set, run in every kind and padding side
PARITY_TEXTS: dict[str, str] = {
    "short": "Hi",
    "sentence": "A man is playing a guitar.",
    "question": "What is the capital of France?",
    "long": _LONG,
    "medium": "Stock markets fell sharply on Monday as investors worried about rising interest rates",
    "unicode": "Ünïcödé façade — naïve café, 東京タワーの夜景, эмбеддинг текста, 🤖🚀✨",
    "empty": "",
    "whitespace": "   several   spaces\tand\ttabs\n new lines  ",
    "quotes": 'She said "no way" and left the room',
    "code": "x = [1, 2, 3]; print(sum(x) / len(x))  # mean",
    "numbers": "3.14159 2.71828 1.41421 and 42",
    "word": "cats",
}


@dataclass(frozen=True)
class GateText:
    """One text of the data file: its name, split (gate or held_out), length group and category."""

    name: str
    split: str
    group: str
    category: str
    text: str


def gate_texts_path() -> Path:
    """The shipped file (``kvembed/data/gate_texts.jsonl``)."""
    return Path(str(resources.files("kvembed") / "data" / FILE))


def prefixes(text: GateText) -> tuple[GateText, ...]:
    """``text`` cut after every :data:`PREFIX_STEP`-th word (the whole text last), each named
    ``name@words``."""
    ends = [m.end() for m in re.finditer(r"\S+", text.text)]
    counts = [*range(PREFIX_STEP, len(ends), PREFIX_STEP), len(ends)]
    return tuple(GateText(f"{text.name}@{n}", text.split, text.group, text.category, text.text[: ends[n - 1]])
                 for n in counts)


@functools.lru_cache(maxsize=1)
def load_gate_texts() -> tuple[GateText, ...]:
    """Every text of the data file, in file order; a :data:`PREFIXES` group's texts as their prefixes."""
    lines = gate_texts_path().read_text(encoding="utf-8").splitlines()
    read = (GateText(**json.loads(line)) for line in lines if line.strip())
    texts = tuple(cut for t in read for cut in (prefixes(t) if t.group == PREFIXES else (t,)))
    names = [t.name for t in texts]
    if len(set(names)) != len(names) or set(names) & set(PARITY_TEXTS):
        raise RuntimeError(f"{FILE} repeats a text name (or one of the core set's)")
    return texts


def split_texts(split: str) -> dict[str, str]:
    """name -> text of one split of the data file."""
    return {t.name: t.text for t in load_gate_texts() if t.split == split}


def text_groups() -> dict[str, tuple[str, ...]]:
    """``split/group`` -> the names of its texts: one padded batch each, in file order."""
    groups: dict[str, list[str]] = {}
    for t in load_gate_texts():
        groups.setdefault(f"{t.split}/{t.group}", []).append(t.name)
    return {key: tuple(names) for key, names in groups.items()}


#: what the gate decides on: the core set and the variety texts
GATE_TEXTS: dict[str, str] = {**PARITY_TEXTS, **split_texts(GATE)}
#: read where the held-out texts decide (int8): the held-out slice with its :data:`PREFIXES` paragraphs
DECIDING_HELD_OUT_TEXTS: dict[str, str] = split_texts(HELD_OUT)
#: reported beside the gate for every precision: the held-out slice without the prefixes, which cost
#: as much as the rest of a big model's gate and are read only where they decide
HELD_OUT_TEXTS: dict[str, str] = {name: text for name, text in DECIDING_HELD_OUT_TEXTS.items()
                                  if name not in text_groups().get(f"{HELD_OUT}/{PREFIXES}", ())}


def held_out_texts(decides: bool) -> dict[str, str]:
    """The held-out texts an export runs: :data:`DECIDING_HELD_OUT_TEXTS` where they decide, else
    :data:`HELD_OUT_TEXTS`."""
    return DECIDING_HELD_OUT_TEXTS if decides else HELD_OUT_TEXTS


def window_texts(encoder: Any, window: int | None) -> dict[str, str]:
    """name -> text of the window split, cut so that as a document (:data:`WINDOW_KIND`) its prompt
    takes ``window + WINDOW_MARGIN`` tokens of ``encoder`` (a TextEncoder), or the encoder's
    ``max_length`` if that is shorter; empty when there is no ``window`` or no input can pass it.
    The prose repeats when a window is longer than it; the cut falls after a word."""
    if window is None or window >= encoder.max_length:
        return {}
    target = min(int(window) + WINDOW_MARGIN, encoder.max_length)

    def fits(text: str) -> bool:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a cut text is what this probes for
            encoded = encoder.encode_one(text, WINDOW_KIND)
        return not encoded.truncated and len(encoded.ids) <= target

    made = {}
    for name, prose in split_texts(WINDOW).items():
        text = prose
        while fits(text):
            text += "\n\n" + prose
        ends = [m.end() for m in re.finditer(r"\S+", text)]
        lo, hi = 0, len(ends) - 1  # the most words that still fit: tokens grow with words
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(text[: ends[mid]]):
                lo = mid
            else:
                hi = mid - 1
        made[name] = text[: ends[lo]]
    return made


def gated_texts(encoder: Any, window: int | None) -> dict[str, str]:
    """What the gate decides on for a model whose sliding window is ``window`` tokens (None: none):
    :data:`GATE_TEXTS`, plus the window text (:func:`window_texts`) when inputs can pass the window."""
    return {**GATE_TEXTS, **window_texts(encoder, window)}
