"""The OpenAI embeddings request and response, plus kvembed's extension fields.

The request is validated here (pydantic for the scalar fields -> 422; ``input`` by hand -> 400, so
every bad item is named by its index). The response is written straight to JSON bytes: a
pydantic round trip of thousands of float lists would cost more than the model on small artifacts.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, model_validator

from ..runtime.vectors import unit_rows
from .errors import ApiError


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``: OpenAI's fields, then kvembed's (``input_type``, ``output``, ``truncate``)."""

    model_config = ConfigDict(extra="forbid")

    input: Any = Field(description="str | list[str] | list[int] | list[list[int]] (token ids: raw-text methods only)")
    model: StrictStr = Field(description="served model name (GET /v1/models)")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32 bytes")
    dimensions: StrictInt | None = Field(None, ge=1, description="keep the first N values and re-normalise (N <= dim)")
    user: StrictStr | None = Field(None, description="accepted and ignored")
    input_type: Literal["query", "document"] = Field("document", description="kvembed: which prompt wraps the text")
    output: StrictStr | None = Field(None, description="kvembed: an --also output label of the artifact")
    truncate: StrictBool | None = Field(
        None, description="kvembed/TEI: true cuts an input over the served model's max_input_tokens to fit, false answers 413; "
        "unset: the server's --auto-truncate (default off: 413)",
    )

    @model_validator(mode="before")
    @classmethod
    def _integral_dimensions(cls, data: Any) -> Any:
        """``dimensions: 63.0`` -> 63: JSON Schema's "integer" includes numbers with a zero fraction
        (a client's JSON encoder may write one); "63", true and 63.5 still fail the strict check."""
        value = data.get("dimensions") if isinstance(data, dict) else None
        if isinstance(value, float) and value.is_integer():
            return {**data, "dimensions": int(value)}
        return data


@dataclass(frozen=True)
class ModelFacts:
    """What the request schema says of one loaded model: what the server would otherwise refuse
    with 400 or 413 in a request the schema allowed (a client, or schemathesis, can trust it)."""

    name: str
    #: output label (None: the main method's) -> its width, the most ``dimensions`` can ask for
    outputs: dict[str | None, int]
    #: the ``input_type`` values with which token ids are accepted (none for prompt methods)
    id_kinds: tuple[str, ...]
    #: token ids are below this
    vocab: int
    #: tokens one input may have unless truncated (the served per-input cap)
    max_input_tokens: int


KINDS: tuple[str, ...] = ("query", "document")


def model_facts(name: str, embedder: Any, max_input_tokens: int) -> ModelFacts:
    """Ask a loaded :class:`~kvembed.runtime.Embedder` what its requests may hold; which kinds take
    token ids is found by the very call the requests go through (``token_inputs``), not restated."""
    id_kinds = []
    for kind in KINDS:
        try:
            embedder.token_inputs([[0]], kind)
        except ValueError:
            continue
        id_kinds.append(kind)
    outputs = {None: embedder.dim_of(None), **{label: embedder.dim_of(label) for label in embedder.outputs}}
    vocab = embedder.encoder.tokenizer.get_vocab_size(with_added_tokens=True)
    return ModelFacts(name, outputs, tuple(id_kinds), vocab, max_input_tokens)


def request_json_schema(names: list[str], max_items: int, auto_truncate: bool, facts: list[ModelFacts] | None = None) -> dict[str, Any]:
    """:class:`EmbeddingRequest`'s schema with what this server knows: the served model names and
    ``input`` spelled out (at most ``max_items`` inputs). With the loaded models' ``facts``: one
    complete request schema per model (and per set of outputs of one width, per kinds that take
    token ids, per truncation), naming its outputs, its widest ``dimensions``, its token ids."""
    schema = EmbeddingRequest.model_json_schema()
    props = schema["properties"]
    props["model"] = {**props["model"], "enum": list(names)}
    props["input"] = {"description": props["input"].get("description", ""), "anyOf": _input_forms(max_items, None, None)}
    if facts is None:
        return schema
    variants = [variant for model in facts for variant in _model_variants(schema, model, max_items, auto_truncate)]
    return {"title": schema["title"], "description": schema.get("description", ""), "anyOf": variants}


def _input_forms(max_items: int, vocab: int | None, max_tokens: int | None) -> list[dict[str, Any]]:
    """``input``'s forms: texts, and (``vocab`` not None) token ids below ``vocab``, rows of at
    most ``max_tokens`` ids when given (an input that must not be truncated)."""
    texts: list[dict[str, Any]] = [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": max_items}]
    if vocab == 0:
        return texts
    token: dict[str, Any] = {"type": "integer", "minimum": 0, **({"maximum": vocab - 1} if vocab else {})}
    row: dict[str, Any] = {"type": "array", "items": token, "minItems": 1, **({"maxItems": max_tokens} if max_tokens else {})}
    return [*texts, row, {"type": "array", "items": row, "minItems": 1, "maxItems": max_items}]


def _model_variants(base: dict[str, Any], model: ModelFacts, max_items: int, auto_truncate: bool) -> list[dict[str, Any]]:
    widths: dict[int, list[str | None]] = {}
    for label, width in model.outputs.items():
        widths.setdefault(width, []).append(label)
    kind_groups = [kinds for kinds in (model.id_kinds, tuple(k for k in KINDS if k not in model.id_kinds)) if kinds]
    variants = []
    for width, labels in widths.items():
        for kinds in kind_groups:
            ids = kinds == model.id_kinds
            # with token ids, a row over the cap is refused (413) unless truncated: two variants
            for truncate in ((True, False) if ids else (None,)):
                props = dict(base["properties"])
                props.update(
                    model={"const": model.name},
                    output={"enum": labels, "description": props["output"].get("description", "")},
                    dimensions={"anyOf": [{"type": "integer", "minimum": 1, "maximum": width}, {"type": "null"}],
                                "description": props["dimensions"].get("description", "")},
                    input_type={"enum": list(kinds), "description": props["input_type"].get("description", ""),
                                **({"default": "document"} if "document" in kinds else {})},
                    input={"description": props["input"]["description"],
                           "anyOf": _input_forms(max_items, model.vocab if ids else 0, model.max_input_tokens if truncate is False else None)},
                )
                required = ["input", "model"]
                if None not in labels:  # unset means the main output, in another variant
                    required.append("output")
                if "document" not in kinds:  # the default kind is in the other variant
                    required.append("input_type")
                if truncate is not None:
                    props["truncate"] = {"enum": [truncate, None] if truncate == auto_truncate else [truncate],
                                         "description": props["truncate"].get("description", "")}
                    if truncate != auto_truncate:  # unset means the server's --auto-truncate
                        required.append("truncate")
                variants.append({**{k: v for k, v in base.items() if k not in ("title", "description")},
                                 "title": f"{model.name}", "properties": props, "required": required})
    return variants


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


_INPUT_HELP = "input must be a string, a non-empty list of strings, a list of token ids, or a list of token-id lists"


def parse_request(body: bytes) -> EmbeddingRequest:
    """JSON bytes -> request. Unparseable JSON and unknown fields -> 400; wrong field values -> 422."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON ({err}); send a JSON object") from None
    except RecursionError:  # arrays or objects nested past the parser's depth: no request needs that
        raise ApiError(400, "the request body nests arrays or objects too deeply to parse; send a flat JSON object",
                       code="too_deeply_nested") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return EmbeddingRequest.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise ApiError(400, f"unrecognized request argument supplied: {field}", param=field) from None
        raise ApiError(422, f"{field}: {first['msg']}", param=field, code="validation_error") from None


def parse_input(value: Any) -> Inputs:
    """Sort ``input`` into texts or token ids; anything else -> 400 naming the first bad item."""
    if isinstance(value, str):
        return Inputs(texts=[value])
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"{_INPUT_HELP}; got {_describe(value)}", param="input")
    first = value[0]
    if isinstance(first, str):
        _check_items(value, lambda v: isinstance(v, str), "a string like input[0]")
        return Inputs(texts=list(value))
    if _is_int(first):
        _check_items(value, _is_int, "a token id like input[0]")
        return Inputs(ids=[_ids(value)])
    if isinstance(first, list):
        _check_items(value, lambda v: isinstance(v, list) and bool(v) and all(_is_int(i) for i in v), "a non-empty list of token ids")
        return Inputs(ids=[_ids(row) for row in value])
    raise ApiError(400, f"{_INPUT_HELP}; input[0] is {_describe(first)}", param="input")


def _check_items(items: list[Any], ok: Any, expected: str) -> None:
    for index, item in enumerate(items):
        if not ok(item):
            raise ApiError(400, f"input[{index}] is {_describe(item)}, expected {expected} (one type per request)", param="input")


def _is_int(value: Any) -> bool:
    """JSON Schema's integer: 7 or 7.0 (a client's JSON encoder may write either), not true or 7.5."""
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


def _ids(row: list[Any]) -> list[int]:
    return [int(value) for value in row]


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    return "null" if value is None else f"{type(value).__name__} {str(value)[:40]!r}"


def embedding_response(vectors: np.ndarray, model: str, prompt_tokens: int, encoding_format: str) -> bytes:
    """OpenAI's ``{object: list, data: [{object: embedding, index, embedding}], model, usage}`` as JSON bytes."""
    if encoding_format == "base64":
        rows: list[Any] = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors]
    else:
        rows = vectors.astype(np.float32).tolist()
    data = [{"object": "embedding", "index": index, "embedding": row} for index, row in enumerate(rows)]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return json.dumps({"object": "list", "data": data, "model": model, "usage": usage}).encode()


def truncate_dimensions(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """The first ``dimensions`` values of each row, re-normalised to unit length (Matryoshka-style).

    The methods are not trained for this: a prefix keeps only part of the information, so quality
    drops by an amount nobody has measured for these methods. It is offered because clients send it.
    """
    if dimensions is None or dimensions >= vectors.shape[1]:
        return vectors
    return unit_rows(vectors[:, :dimensions])
