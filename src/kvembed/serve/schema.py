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
        return Inputs(ids=[list(value)])
    if isinstance(first, list):
        _check_items(value, lambda v: isinstance(v, list) and bool(v) and all(_is_int(i) for i in v), "a non-empty list of token ids")
        return Inputs(ids=[list(row) for row in value])
    raise ApiError(400, f"{_INPUT_HELP}; input[0] is {_describe(first)}", param="input")


def _check_items(items: list[Any], ok: Any, expected: str) -> None:
    for index, item in enumerate(items):
        if not ok(item):
            raise ApiError(400, f"input[{index}] is {_describe(item)}, expected {expected} (one type per request)", param="input")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
