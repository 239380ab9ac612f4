"""Declarative method specs: what a method is, independent of how it is computed.

A :class:`MethodSpec` is data (prompts, readout, pooling, options with defaults and validation).
:func:`kvembed.methods.resolve` turns a spec plus user options plus the model's depth into a
:class:`ResolvedMethod`, the single fully-explicit description that the PyTorch patcher, the
exporter and the runtime all read. Nothing here imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

Kind = Literal["query", "document"]
KINDS: tuple[str, ...] = ("query", "document")
#: what a named prompt beyond the kinds may be called (a trained embedder's ``sts_query``): a request names it
PROMPT_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
#: :data:`PROMPT_NAME` in words, for the messages that refuse a name
PROMPT_NAME_RULE = "1-64 letters, digits, '_', '-' or '.'"
#: the most named prompts one method holds, the kinds included
MAX_NAMED_PROMPTS = 32
TEXT = "{text}"

#: What the embedding is read from.
#: - ``hidden``: the final layer's normed hidden states, pooled by ``pooling``;
#: - ``values``: value vectors (``v_proj`` output) averaged over real tokens and over ``layers``;
#: - ``attention-output``: the last real token's attention sub-layer output, averaged over ``layers``;
#: - ``residual``: the last real token's residual stream after decoder layer ``exit_layer - 1``.
Readout = Literal["hidden", "values", "attention-output", "residual"]

#: How hidden states are pooled over positions (``hidden`` readout only).
#: ``span`` pools over the positions flagged in the ``pool_mask`` input (echo's second copy);
#: ``context-eos`` concatenates the states at the flagged position (Causal2Vec's Contextual token)
#: and at the last real token (its EOS): twice the hidden width.
Pooling = Literal["last-mean", "last", "mean", "span", "context-eos"]
POOLINGS: tuple[str, ...] = ("last-mean", "last", "mean", "span", "context-eos")

CONTEXT = "{context}"
"""Where Causal2Vec's prompt templates put the placeholder token that the Contextual token replaces."""

PLACEHOLDER = "<PST>"
"""Token-prepending's placeholder, registered as an added token on the tokenizer."""


@dataclass(frozen=True)
class OptionSpec:
    """One public option of a method: its default and how a user value is checked.

    ``default`` may be a callable ``(context) -> value`` where the default depends on the model
    (its depth, its preset); ``context`` is a :class:`ResolveContext`.
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    check: Callable[[Any, "ResolveContext"], str | None] | None = None
    clamp: Callable[[Any, "ResolveContext"], Any] | None = None
    """Maps a checked value to the effective one (e.g. a token-prepending stop past the early exit
    is reached never, so it means the exit); the manifest records the effective value."""
    flag: str | None = None
    """The help of the option's command-line flag (``--num-prefix``; ``--wva/--no-wva`` for a bool),
    shown by every command that takes method options; None: no flag (e.g. set by a checkpoint).
    Methods sharing an option name share its flag, so they declare the same type and help."""

    @property
    def flag_name(self) -> str:
        """``num_prefix`` -> ``--num-prefix``."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class ResolveContext:
    """Facts about the target model that option defaults and checks need."""

    num_layers: int
    model_id: str | None = None
    presets: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    given: Mapping[str, Any] = field(default_factory=dict)
    """The options the user gave, typed, before clamping (those resolved so far)."""


@dataclass(frozen=True)
class MethodSpec:
    """One training-free embedding method, as METHODS.md defines it."""

    name: str
    summary: str
    prompts: Mapping[str, Mapping[str, str]]
    """Named prompt sets: prompt name -> {kind: template}; templates contain ``{text}``."""
    default_prompt: str
    readout: Readout
    pooling: Pooling | None = None
    preprocess: bool = False
    """Apply the token-prepending / PromptEOL text clean-up before formatting."""
    reroute: bool = False
    """Prepend the last token's key/value in the ``layers`` set (kv-embedding)."""
    placeholder: bool = False
    """The prompt carries ``<PST>`` whose position is rewired per layer (token-prepending)."""
    contextual: bool = False
    """A bidirectional encoder's Contextual token replaces the prompt's ``{context}`` token (Causal2Vec)."""
    options: tuple[OptionSpec, ...] = ()
    paper: str = ""

    def option(self, name: str) -> OptionSpec:
        for opt in self.options:
            if opt.name == name:
                return opt
        raise KeyError(name)

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(opt.name for opt in self.options)


@dataclass(frozen=True)
class ResolvedMethod:
    """A method with every option explicit and checked against one model.

    This is what gets recorded in an artifact's manifest (:meth:`to_dict`), and what the runtime
    reads back (:meth:`from_dict`) to format and tokenise text exactly like the reference.
    """

    name: str
    options: Mapping[str, Any]
    layers: tuple[int, ...]
    num_layers: int
    layers_needed: int
    """How many decoder layers the computation runs (early exit keeps only these)."""
    templates: Mapping[str, str]
    """prompt name -> template with ``{text}``: the :data:`KINDS`, then any named prompts of the
    checkpoint (``st``: its folder's), each of which a request may name as its kind."""
    readout: Readout
    pooling: Pooling | None
    preprocess: bool
    reroute: bool
    placeholder: bool
    contextual: bool = False

    def takes_ids(self, kind: str) -> bool:
        """Whether token ids stand for this kind's text: its template is ``{text}`` with no clean-up,
        placeholder or pool span, so ``tokenizer.encode(text).ids`` is exactly the model's input."""
        return self.templates.get(kind) == "{text}" and not (self.preprocess or self.placeholder or self.uses_pool_mask)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "options": dict(self.options),
            "layers": list(self.layers),
            "num_layers": self.num_layers,
            "layers_needed": self.layers_needed,
            "templates": dict(self.templates),
            "readout": self.readout,
            "pooling": self.pooling,
            "preprocess": self.preprocess,
            "reroute": self.reroute,
            "placeholder": self.placeholder,
            "contextual": self.contextual,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ResolvedMethod":
        return cls(
            name=data["name"],
            options=dict(data["options"]),
            layers=tuple(int(i) for i in data["layers"]),
            num_layers=int(data["num_layers"]),
            layers_needed=int(data["layers_needed"]),
            templates=_templates(data["templates"]),
            readout=data["readout"],
            pooling=data["pooling"],
            preprocess=bool(data["preprocess"]),
            reroute=bool(data["reroute"]),
            placeholder=bool(data["placeholder"]),
            contextual=bool(data.get("contextual", False)),
        )

    @property
    def uses_pool_mask(self) -> bool:
        """Whether the forward pass needs a ``pool_mask`` input besides the attention mask."""
        return self.readout == "hidden" and self.pooling in ("span", "context-eos")


def _templates(data: Any) -> dict[str, str]:
    """A manifest's templates, checked: the kinds and at most :data:`MAX_NAMED_PROMPTS` names of
    :data:`PROMPT_NAME`'s form, each a string holding ``{text}``."""
    if not isinstance(data, Mapping) or not 0 < len(data) <= MAX_NAMED_PROMPTS:
        raise ValueError(f"templates must map at most {MAX_NAMED_PROMPTS} prompt names to templates")
    for name, template in data.items():
        if not isinstance(name, str) or not PROMPT_NAME.fullmatch(name):
            raise ValueError(f"templates holds a prompt name that is not {PROMPT_NAME_RULE}: {str(name)[:40]!r}")
        if not isinstance(template, str) or TEXT not in template:
            raise ValueError(f"template {name!r} is not a string holding {TEXT}")
    if not set(KINDS) <= set(data):
        raise ValueError(f"templates lacks {' and '.join(k for k in KINDS if k not in data)}")
    return dict(data)
