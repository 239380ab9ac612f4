"""OpenAI's dialect: ``POST /v1/embeddings`` (and ``/embeddings``) and ``GET /v1/models``.

OpenAI's fields, then kvembed's (``input_type``, ``output``, ``truncate``, ``windows``,
``embedding_types``). Errors are OpenAI's ``{"error": {message, type, param, code}}``. The answer
is written straight to JSON bytes: a pydantic round trip of thousands of float lists would cost
more than the model on small artifacts.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator
from starlette.responses import JSONResponse, Response

from ..embedding import INLINE_LIMIT, embed_request, offload
from ..errors import ApiError
from ..request import EmbedRequest, integral, parse_input, validated
from ..state import ServerState
from . import Route, serving
from .schema import Shape, input_forms, per_model

VectorType = Literal["float", "int8", "uint8", "binary", "ubinary"]


class EmbeddingRequest(BaseModel):
    """``POST /v1/embeddings``: OpenAI's fields, then kvembed's."""

    model_config = ConfigDict(extra="forbid")

    input: Any = Field(description="str | list[str] | list[int] | list[list[int]] (token ids: raw-text methods only)")
    model: StrictStr = Field(description="served model name (GET /v1/models)")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: the vector's little-endian bytes (float32, or the embedding_types' int8/uint8 bytes)")
    dimensions: StrictInt | None = Field(None, ge=1, description="keep the first N values and re-normalise (N <= dim)")
    user: StrictStr | None = Field(None, description="accepted and ignored")
    input_type: StrictStr = Field("document", description="kvembed: which prompt wraps the text: query, document, or a "
                                  "named prompt of the model (GET /v1/models: prompts)")
    output: StrictStr | None = Field(None, description="kvembed: an --also output label of the artifact")
    truncate: StrictBool | None = Field(
        None, description="kvembed/TEI: true cuts an input over the served model's max_input_tokens to fit, false answers 413; "
        "unset: the server's --auto-truncate (default off: 413)",
    )
    windows: StrictBool | None = Field(
        None, description="kvembed: true embeds an input over max_input_tokens as windows of the cap, one vector from them; "
        "unset: the server's --windows")
    embedding_types: VectorType | list[VectorType] | None = Field(
        None, description="kvembed (vLLM, Cohere): the vector type, one per request here (int8 and uint8 from the ranges "
        "calibrated at export; binary and ubinary: packed sign bits); unset: float")

    @model_validator(mode="before")
    @classmethod
    def _integral_dimensions(cls, data: Any) -> Any:
        return integral(data, "dimensions")


SHAPE = Shape(
    input="input", ids=True, kind="input_type", kind_values=list, dimensions="dimensions", truncate="truncate",
    truncate_values=lambda cut: [cut], truncate_default=None, types="embedding_types", output="output",
    types_schema=lambda types: {"anyOf": [{"enum": list(types)}, {"type": "array", "items": {"enum": list(types)},
                                                                  "minItems": 1, "maxItems": 1}, {"type": "null"}]},
)


def request_schema(state: ServerState) -> dict[str, Any]:
    """The request body's schema: the served names before the models load, each model's own request once loaded."""
    config = state.config
    schema = EmbeddingRequest.model_json_schema()
    props = schema["properties"]
    props["model"] = {**props["model"], "enum": [name for name, _ in config.artifacts]}
    props["input"] = {"description": props["input"].get("description", ""), "anyOf": input_forms(config.max_client_batch_size, None, None)}
    return per_model(state, schema, SHAPE, lambda name: ({"const": name}, False))


def vector_types(value: str | list[str] | None) -> tuple[str, ...]:
    """``embedding_types`` as a tuple: one type (several -> 400: this answer holds one vector per input)."""
    if value is None:
        return ("float",)
    if isinstance(value, str):
        return (value,)
    if len(value) != 1:
        raise ApiError(400, f"embedding_types: /v1/embeddings answers one vector per input, {len(value)} types were asked; "
                       "ask for one, or use /v2/embed, which answers several", param="embedding_types")
    return (value[0],)


def embedding_response(vectors: np.ndarray, model: str, prompt_tokens: int, encoding_format: str) -> bytes:
    """OpenAI's ``{object: list, data: [{object: embedding, index, embedding}], model, usage}`` as JSON bytes."""
    if encoding_format == "base64":
        little = vectors.astype("<f4") if vectors.dtype.kind == "f" else vectors
        rows: list[Any] = [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    else:
        rows = (vectors.astype(np.float32) if vectors.dtype.kind == "f" else vectors).tolist()
    data = [{"object": "embedding", "index": index, "embedding": row} for index, row in enumerate(rows)]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return json.dumps({"object": "list", "data": data, "model": model, "usage": usage}).encode()


async def embeddings(state: ServerState, body: bytes, name: Callable[[str], None]) -> Response:
    spec = validated(EmbeddingRequest, body)
    served = serving(state, spec.model, name)
    request = EmbedRequest(
        model=spec.model, inputs=parse_input(spec.input), kind=spec.input_type, output=spec.output, truncate=spec.truncate,
        windows=spec.windows, dimensions=spec.dimensions, vector_types=vector_types(spec.embedding_types),
    )
    done = await embed_request(state, served, request)
    vectors = done.vectors[request.vector_types[0]]
    payload = await offload(vectors.size > INLINE_LIMIT, embedding_response, vectors, spec.model, done.tokens, spec.encoding_format)
    return Response(payload, media_type="application/json")


async def models(state: ServerState) -> Response:
    data = [served.card(state.created) for served in state.models.values()]
    return JSONResponse({"object": "list", "data": data})


#: ``POST /v1/embeddings`` 200, as :func:`embedding_response` writes it
EMBEDDING_RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {
            "type": "object", "required": ["object", "index", "embedding"],
            "properties": {
                "object": {"const": "embedding"}, "index": {"type": "integer", "minimum": 0},
                "embedding": {"anyOf": [{"type": "array", "items": {"type": "number"}},
                                        {"type": "string", "description": "base64 of the vector's little-endian bytes"}]},
            },
        }},
        "model": {"type": "string"},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"], "properties": {
            "prompt_tokens": {"type": "integer", "minimum": 0}, "total_tokens": {"type": "integer", "minimum": 0}}},
    },
}

#: ``GET /v1/models`` 200 (each card as :meth:`kvembed.serve.model.ServedModel.card` writes it)
MODEL_LIST_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {
        "type": "object", "required": ["id", "object", "created", "owned_by"],
        "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                       "owned_by": {"type": "string"}, "target": {"type": "string"}, "backend": {"type": "string"}, "backend_reason": {"type": "string"}},
    }}},
}

_EMBED_STATUSES = (400, 401, 404, 408, 413, 422, 429, 500, 503, 504)
ROUTES = [
    *(Route(path, "POST", embeddings, "Create embeddings", request_schema, EMBEDDING_RESPONSE_SCHEMA, _EMBED_STATUSES)
      for path in ("/v1/embeddings", "/embeddings")),
    Route("/v1/models", "GET", lambda state, body, name: models(state), "Served models", None, MODEL_LIST_SCHEMA, (401, 503)),
]
