"""What every dialect's request comes to, and the parsing they share.

A dialect (:mod:`kvembed.serve.dialects`: OpenAI's, TEI's, Cohere's) reads its own JSON body into
an :class:`EmbedRequest`; :mod:`.embedding` serves it; the dialect writes the answer in its own
shape. JSON that does not parse, an unknown field (400) and a wrong field value (422) are refused
here, the same way for every dialect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import ApiError

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Inputs:
    """A request's inputs: texts or token-id rows (never both)."""

    texts: list[str] | None = None
    ids: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.ids or [])

    @property
    def size(self) -> int:
        """Characters of text, or token ids: what tokenising them costs."""
        return sum(map(len, self.texts if self.texts is not None else self.ids or []))


@dataclass(frozen=True)
class EmbedRequest:
    """One embeddings request, whatever route it came by (:func:`.embedding.embed_request` serves it)."""

    model: str
    inputs: Inputs
    #: the request field holding the inputs, as errors name it (``input``, ``inputs``, ``texts``)
    field: str = "input"
    kind: str = "document"
    #: the request field naming the prompt, as errors name it (``input_type``, ``prompt_name``)
    kind_field: str = "input_type"
    output: str | None = None
    #: None: the server's --auto-truncate
    truncate: bool | None = None
    #: where a cut input loses its tokens: its end (``end``) or its start (``start``: TEI's left)
    truncate_from: str = "end"
    #: None: the server's --windows
    windows: bool | None = None
    dimensions: int | None = None
    normalize: bool = True
    #: ``kvembed.runtime.quantize.VECTOR_TYPES``: what the answer carries, each computed once
    vector_types: tuple[str, ...] = ("float",)


def read_json(body: bytes) -> dict[str, Any]:
    """JSON bytes -> an object; anything else -> 400."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON ({err}); send a JSON object") from None
    except RecursionError:  # arrays or objects nested past the parser's depth: no request needs that
        raise ApiError(400, "the request body nests arrays or objects too deeply to parse; send a flat JSON object",
                       code="too_deeply_nested") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    return data


def validated(model: type[M], body: bytes) -> M:
    """The body as ``model``: unknown fields -> 400 naming the field, wrong values -> 422 naming it."""
    data = read_json(body)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise ApiError(400, f"unrecognized request argument supplied: {field}", param=field) from None
        raise ApiError(422, f"{field}: {first['msg']}", param=field, code="validation_error") from None


def integral(data: Any, *names: str) -> Any:
    """``{name: 63.0}`` -> 63 for each of ``names``: JSON Schema's "integer" includes numbers with a
    zero fraction (a client's JSON encoder may write one); "63", true and 63.5 still fail validation."""
    if not isinstance(data, dict):
        return data
    fixed = {name: int(data[name]) for name in names if isinstance(data.get(name), float) and data[name].is_integer()}
    return {**data, **fixed} if fixed else data


_INPUT_HELP = "must be a string, a non-empty list of strings, a list of token ids, or a list of token-id lists"


def parse_input(value: Any, field: str = "input", ids: bool = True) -> Inputs:
    """Sort ``value`` into texts or (``ids``) token ids; anything else -> 400 naming the first bad item."""
    help_ = _INPUT_HELP if ids else "must be a string or a non-empty list of strings"
    if isinstance(value, str):
        return Inputs(texts=[value])
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"{field} {help_}; got {_describe(value)}", param=field)
    first = value[0]
    if isinstance(first, str):
        _check_items(value, field, lambda v: isinstance(v, str), f"a string like {field}[0]")
        return Inputs(texts=list(value))
    if ids and _is_int(first):
        _check_items(value, field, _is_int, f"a token id like {field}[0]")
        return Inputs(ids=[_ids(value)])
    if ids and isinstance(first, list):
        _check_items(value, field, lambda v: isinstance(v, list) and bool(v) and all(_is_int(i) for i in v),
                     "a non-empty list of token ids")
        return Inputs(ids=[_ids(row) for row in value])
    raise ApiError(400, f"{field} {help_}; {field}[0] is {_describe(first)}", param=field)


def _check_items(items: list[Any], field: str, ok: Any, expected: str) -> None:
    for index, item in enumerate(items):
        if not ok(item):
            raise ApiError(400, f"{field}[{index}] is {_describe(item)}, expected {expected} (one type per request)", param=field)


def _is_int(value: Any) -> bool:
    """JSON Schema's integer: 7 or 7.0 (a client's JSON encoder may write either), not true or 7.5."""
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


def _ids(row: list[Any]) -> list[int]:
    return [int(value) for value in row]


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    return "null" if value is None else f"{type(value).__name__} {str(value)[:40]!r}"
