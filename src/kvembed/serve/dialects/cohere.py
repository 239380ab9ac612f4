"""Cohere's dialect (API v2): ``POST /v2/embed`` and ``POST /v2/rerank``.

What ``cohere.ClientV2(base_url=...)`` sends. ``input_type`` picks the method's prompt
(``search_query``: query; ``search_document``, ``classification``, ``clustering``: document);
``embedding_types`` answers several vector types at once (``base64``: the float32 bytes);
``truncate`` is ``END`` (cut an input's end, Cohere's default), ``START`` (cut its start) or
``NONE`` (413). Rerank embeds the query and the documents (cut at the cap, as Cohere cuts documents) and
ranks the documents by the cosine of their vectors with the query's, highest first:
``relevance_score`` is that cosine, not a cross-encoder's probability. Errors are Cohere's
``{"message"}``.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any, Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator
from starlette.responses import Response

from ..embedding import INLINE_LIMIT, Encoded, check, embed_encoded, embed_request, encode_inputs, offload
from ..errors import ApiError
from ..model import ServedModel
from ..request import EmbedRequest, Inputs, integral, validated
from ..state import ServerState
from . import Route, serving
from .schema import Shape, per_model

#: Cohere's input types -> the method's prompt kinds
KIND_OF = {"search_query": "query", "search_document": "document", "classification": "document", "clustering": "document"}
CohereType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class CohereError(BaseModel):
    """Cohere's error body."""

    message: str = Field(description="what went wrong and how to fix it")


def error(err: ApiError) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return Response(json.dumps({"message": err.message}), status_code=err.status, media_type="application/json", headers=headers)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(description="served model name (GET /v1/models)")
    priority: StrictInt | None = Field(None, description="accepted and ignored")
    windows: StrictBool | None = Field(None, description="kvembed: true embeds an input over the cap as windows; unset: --windows")


class EmbedBody(_Body):
    """``POST /v2/embed``."""

    texts: list[StrictStr] = Field(description="the texts to embed")
    input_type: Literal["search_document", "search_query", "classification", "clustering"] = Field(
        "search_document", description="search_query: the method's query prompt; the others: its document prompt")
    embedding_types: list[CohereType] | None = Field(None, description="the vector types to answer; unset: float")
    truncate: Literal["NONE", "START", "END"] = Field(
        "END", description="END cuts an input over the cap at its end, START at its start; NONE answers 413")
    output_dimension: StrictInt | None = Field(None, ge=1, description="keep the first N values and re-normalise")

    @model_validator(mode="before")
    @classmethod
    def _integral(cls, data: Any) -> Any:
        return integral(data, "output_dimension", "priority")


class RerankBody(_Body):
    """``POST /v2/rerank``."""

    query: StrictStr = Field(description="the search query")
    documents: list[StrictStr] = Field(description="the texts to rank")
    top_n: StrictInt | None = Field(None, ge=1, description="answer the best N (unset: all)")
    return_documents: StrictBool = Field(False, description="kvembed (Cohere v1): each result carries its document's text")

    @model_validator(mode="before")
    @classmethod
    def _integral(cls, data: Any) -> Any:
        return integral(data, "top_n", "priority")


def _meta(tokens: int) -> dict[str, Any]:
    return {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}}


def _serving(state: ServerState, spec: _Body, texts: list[str], field: str, name: Callable[[str], None]) -> ServedModel:
    """The named model, once the texts are known not to be empty."""
    served = serving(state, spec.model, name)
    if not texts:
        raise ApiError(400, f"{field} must hold at least one text", param=field)
    return served


async def embed(state: ServerState, body: bytes, name: Callable[[str], None]) -> Response:
    spec = validated(EmbedBody, body)
    served = _serving(state, spec, spec.texts, "texts", name)
    if spec.embedding_types == []:
        raise ApiError(400, "embedding_types must name at least one type (or be left out: float)", param="embedding_types")
    asked = tuple(dict.fromkeys(spec.embedding_types or ["float"]))
    types = tuple(dict.fromkeys("float" if kind == "base64" else kind for kind in asked))
    request = EmbedRequest(
        model=spec.model, inputs=Inputs(texts=list(spec.texts)), field="texts", kind=KIND_OF[spec.input_type],
        truncate=spec.truncate != "NONE", truncate_from="start" if spec.truncate == "START" else "end",
        windows=spec.windows, dimensions=spec.output_dimension, vector_types=types,
    )
    done = await embed_request(state, served, request)
    size = sum(vectors.size for vectors in done.vectors.values())
    payload = await offload(size > INLINE_LIMIT, _embed_answer, done.vectors, asked, spec.texts, done.tokens)
    return Response(payload, media_type="application/json")


def _embed_answer(vectors: dict[str, np.ndarray], asked: tuple[str, ...], texts: list[str], tokens: int) -> bytes:
    embeddings: dict[str, Any] = {}
    for kind in asked:
        if kind == "base64":
            embeddings[kind] = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors["float"]]
        else:
            embeddings[kind] = vectors[kind].tolist()
    answer = {"id": uuid.uuid4().hex, "embeddings": embeddings, "texts": texts, "meta": _meta(tokens),
              "response_type": "embeddings_by_type"}
    return json.dumps(answer).encode()


async def rerank(state: ServerState, body: bytes, name: Callable[[str], None]) -> Response:
    spec = validated(RerankBody, body)
    served = _serving(state, spec, spec.documents, "documents", name)
    documents = EmbedRequest(model=spec.model, inputs=Inputs(texts=list(spec.documents)), field="documents",
                             truncate=True, windows=spec.windows)
    query = EmbedRequest(model=spec.model, inputs=Inputs(texts=[spec.query]), field="query", kind="query",
                         truncate=True, windows=spec.windows)
    check(state, served, documents)
    with served.lanes.arriving():
        asked = await encode_inputs(state, served, query.inputs, query)
        given = await encode_inputs(state, served, documents.inputs, documents)

    rows = await embed_encoded(served, Encoded(asked.items + given.items, asked.counts + given.counts), None)
    scores = rows[1:] @ rows[0]
    order = np.argsort(-scores, kind="stable")[: spec.top_n]
    results = [{"index": int(i), "relevance_score": float(scores[i]),
                **({"document": {"text": spec.documents[i]}} if spec.return_documents else {})} for i in order]
    tokens = asked.tokens + given.tokens
    state.metrics.texts.labels(served.name).inc(len(rows))
    state.metrics.tokens.labels(served.name).inc(tokens)
    answer = {"id": uuid.uuid4().hex, "results": results, "meta": _meta(tokens)}
    return Response(json.dumps(answer), media_type="application/json")


SHAPE = Shape(
    input="texts", ids=False, single=False, kind=None, kind_values=list, dimensions="output_dimension", truncate="truncate",
    truncate_values=lambda cut: ["END", "START"] if cut else ["NONE"], truncate_default=True, types="embedding_types",
    types_schema=lambda types: {"anyOf": [{"type": "array", "items": {"enum": [*types, *(["base64"] if "float" in types else [])]},
                                            "minItems": 1}, {"type": "null"}]},
)


def _names(state: ServerState) -> list[str]:
    return [name for name, _ in state.config.artifacts]


def embed_schema(state: ServerState) -> dict[str, Any]:
    schema = EmbedBody.model_json_schema()
    props = schema["properties"]
    props["model"] = {**props["model"], "enum": _names(state)}
    props["texts"] = {**props["texts"], "minItems": 1, "maxItems": state.config.max_client_batch_size}
    return per_model(state, schema, SHAPE, lambda name: ({"const": name}, False))


def rerank_schema(state: ServerState) -> dict[str, Any]:
    schema = RerankBody.model_json_schema()
    props = schema["properties"]
    props["model"] = {**props["model"], "enum": _names(state)}
    props["documents"] = {**props["documents"], "minItems": 1, "maxItems": state.config.max_client_batch_size}
    return schema


_META = {"type": "object"}
EMBED_RESPONSE: dict[str, Any] = {
    "type": "object", "required": ["id", "embeddings"],
    "properties": {"id": {"type": "string"}, "embeddings": {"type": "object", "additionalProperties": {"type": "array"}},
                   "texts": {"type": "array", "items": {"type": "string"}}, "meta": _META,
                   "response_type": {"const": "embeddings_by_type"}},
}
RERANK_RESPONSE: dict[str, Any] = {
    "type": "object", "required": ["id", "results"],
    "properties": {"id": {"type": "string"}, "meta": _META, "results": {"type": "array", "items": {
        "type": "object", "required": ["index", "relevance_score"],
        "properties": {"index": {"type": "integer", "minimum": 0}, "relevance_score": {"type": "number"},
                       "document": {"type": "object", "properties": {"text": {"type": "string"}}}}}}},
}

_STATUSES = (400, 401, 404, 408, 413, 422, 429, 500, 503, 504)
_COHERE = {"error": error, "error_body": CohereError}
ROUTES = [
    Route("/v2/embed", "POST", embed, "Embed (Cohere v2)", embed_schema, EMBED_RESPONSE, _STATUSES, **_COHERE),
    Route("/v2/rerank", "POST", rerank, "Rerank by embedding cosine (Cohere v2)", rerank_schema, RERANK_RESPONSE, _STATUSES, **_COHERE),
]
