"""The request schemas the OpenAPI document gives, exact for the loaded models.

What the server would refuse with 400 or 413 in a request its document allowed is spelled out
per model, so a client (or schemathesis) can trust the document both ways: each model's request
is split into variants by output width (how many ``dimensions`` it can ask), by the kinds that
take token ids, by whether an input may be longer than the per-input cap (cut or windowed) and
by whether int8/uint8 may be asked (only at full width). One builder serves every dialect; a
:class:`Shape` says how a dialect names those fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..state import ServerState

#: what the dialects call the vector types (kvembed.runtime.quantize.VECTOR_TYPES) and the ranged ones
TYPES: tuple[str, ...] = ("float", "int8", "uint8", "binary", "ubinary")
UNRANGED: tuple[str, ...] = ("float", "binary", "ubinary")


@dataclass(frozen=True)
class ModelFacts:
    """What the request schema says of one loaded model."""

    name: str
    #: the prompts a request may name: query, document, then the model's named ones
    kinds: tuple[str, ...]
    #: output label (None: the main method's) -> its width, the most ``dimensions`` can ask for
    outputs: dict[str | None, int]
    #: the kinds with which token ids are accepted (none for prompt methods)
    id_kinds: tuple[str, ...]
    #: token ids are below this
    vocab: int
    #: tokens one input may have unless cut or windowed (the served per-input cap)
    max_input_tokens: int


def model_facts(name: str, embedder: Any, max_input_tokens: int) -> ModelFacts:
    """Ask a loaded :class:`~kvembed.runtime.Embedder` what its requests may hold; which kinds take
    token ids is found by the very call the requests go through (``token_inputs``), not restated."""
    kinds = tuple(embedder.method.templates)
    id_kinds = []
    for kind in kinds:
        try:
            embedder.token_inputs([[0]], kind)
        except ValueError:
            continue
        id_kinds.append(kind)
    outputs = {None: embedder.dim_of(None), **{label: embedder.dim_of(label) for label in embedder.outputs}}
    vocab = embedder.encoder.tokenizer.get_vocab_size(with_added_tokens=True)
    return ModelFacts(name, kinds, outputs, tuple(id_kinds), vocab, max_input_tokens)


def input_forms(max_items: int, vocab: int | None, max_tokens: int | None, ids: bool = True, single: bool = True) -> list[dict[str, Any]]:
    """An input field's forms: texts (``single``: a bare string too), and (``ids``; ``vocab`` 0: none)
    token ids below ``vocab``, rows of at most ``max_tokens`` ids when given (an input that must not be cut)."""
    texts: list[dict[str, Any]] = [{"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": max_items}]
    if single:
        texts.insert(0, {"type": "string"})
    if not ids or vocab == 0:
        return texts
    token: dict[str, Any] = {"type": "integer", "minimum": 0, **({"maximum": vocab - 1} if vocab else {})}
    row: dict[str, Any] = {"type": "array", "items": token, "minItems": 1, **({"maxItems": max_tokens} if max_tokens else {})}
    return [*texts, row, {"type": "array", "items": row, "minItems": 1, "maxItems": max_items}]


@dataclass(frozen=True)
class Shape:
    """How one dialect's request names what the variants constrain (None: it has no such field)."""

    input: str
    #: the dialect takes token ids
    ids: bool
    #: the field choosing the prompt, its values for some kinds, and the kind it means when absent
    kind: str | None
    kind_values: Callable[[tuple[str, ...]], list[Any]]
    dimensions: str
    #: the field cutting an over-long input: its values meaning cut (True) or not (False)
    truncate: str | None
    truncate_values: Callable[[bool], list[Any]]
    #: what an absent truncate means (None: the server's --auto-truncate)
    truncate_default: bool | None
    #: the field asking vector types, and its schema for the allowed ones
    types: str | None = None
    types_schema: Callable[[tuple[str, ...]], dict[str, Any]] | None = None
    #: the field naming an ``--also`` output
    output: str | None = None
    #: the field asking windows (absent or null: the server's --windows)
    windows: str = "windows"
    #: the input may be one bare string
    single: bool = True


@dataclass(frozen=True)
class Server:
    """The server's settings the variants depend on."""

    max_items: int
    auto_truncate: bool
    windows: bool


def variants(base: dict[str, Any], shape: Shape, model: ModelFacts, server: Server, title: str) -> list[dict[str, Any]]:
    """``base`` (a pydantic model's JSON Schema) made exact for ``model``: a list for ``anyOf``."""
    props0 = base["properties"]
    out = []
    widths: dict[int, list[str | None]] = {}
    for label, width in model.outputs.items():
        if shape.output is not None or label is None:
            widths.setdefault(width, []).append(label)
    groups = [g for g in (model.id_kinds, tuple(k for k in model.kinds if k not in model.id_kinds)) if g] if shape.kind else [model.kinds]
    for width, labels in widths.items():
        for kinds in groups:
            ids = shape.ids and bool(model.id_kinds) and set(kinds) <= set(model.id_kinds)
            limits = ("truncate", "windows", "whole") if shape.truncate else ("windows", "whole")
            for limit in (limits if ids else (None,)):
                for full in ((True, False) if shape.types else (None,)):
                    props, required = dict(props0), [name for name in base.get("required", [])]
                    props[shape.input] = {"description": props0[shape.input].get("description", ""),
                                          "anyOf": input_forms(server.max_items, model.vocab if ids else 0,
                                                               model.max_input_tokens if limit == "whole" else None, shape.ids,
                                                               shape.single)}
                    if shape.kind:
                        props[shape.kind] = _values(props0[shape.kind], shape.kind_values(kinds))
                        if "document" not in kinds:  # absent means document: another variant's
                            required.append(shape.kind)
                    if shape.output:
                        props[shape.output] = _values(props0[shape.output], labels)
                        if None not in labels:
                            required.append(shape.output)
                    dims: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": width}
                    if full is True:  # int8/uint8 only at full width
                        dims = {"type": "integer", "minimum": width, "maximum": width}
                    props[shape.dimensions] = {"anyOf": [dims, {"type": "null"}], "description": props0[shape.dimensions].get("description", "")}
                    if shape.types and shape.types_schema:
                        props[shape.types] = {**shape.types_schema(TYPES if full else UNRANGED),
                                              "description": props0[shape.types].get("description", "")}
                        if full is False:  # absent means float, allowed in the full-width variant too
                            required.append(shape.dimensions)
                    if limit is not None:
                        _limit(props, required, props0, shape, server, limit)
                    out.append({**{k: v for k, v in base.items() if k not in ("title", "description", "required", "properties")},
                                "title": title, "properties": props, "required": sorted(set(required))})
    return out


def _limit(props: dict[str, Any], required: list[str], props0: dict[str, Any], shape: Shape, server: Server, limit: str) -> None:
    """Constrain the fields that decide whether an input over the cap is cut (``truncate``), windowed
    (``windows``) or refused (``whole``: then the rows are bounded)."""
    default_truncate = server.auto_truncate if shape.truncate_default is None else shape.truncate_default
    if shape.truncate is not None and limit != "windows":
        cut = limit == "truncate"
        values = shape.truncate_values(cut)
        if default_truncate == cut:
            values = [*values, None] if None not in values and shape.truncate_default is None else values
        else:
            required.append(shape.truncate)
        props[shape.truncate] = _values(props0[shape.truncate], values)
    if limit != "truncate":
        on = limit == "windows"
        values = [on, None] if server.windows == on else [on]
        if server.windows != on:
            required.append(shape.windows)
        props[shape.windows] = _values(props0[shape.windows], values)


def _values(prop: dict[str, Any], values: list[Any]) -> dict[str, Any]:
    return {"enum": list(values), "description": prop.get("description", "")}


def per_model(state: ServerState, schema: dict[str, Any], shape: Shape,
              model_field: Callable[[str], tuple[dict[str, Any], bool]]) -> dict[str, Any]:
    """``schema`` as the document gives it: as it is until the models load, then one ``anyOf`` of
    every loaded model's :func:`variants`; ``model_field(name)`` is that model's ``model``
    property and whether a request must name it."""
    if not state.ready:
        return schema
    config = state.config
    server = Server(config.max_client_batch_size, config.auto_truncate, config.windows)
    out = []
    for name, served in state.models.items():
        prop, required = model_field(name)
        base = {**schema, "properties": {**schema["properties"], "model": prop},
                "required": [*schema.get("required", []), *(["model"] if required else [])]}
        out.extend(variants(base, shape, model_facts(name, served.embedder, served.max_input_tokens), server, name))
    return {"title": schema["title"], "description": schema.get("description", ""), "anyOf": out}
