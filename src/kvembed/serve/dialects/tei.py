"""TEI's dialect (text-embeddings-inference): ``POST /embed`` (and ``/``), ``/tokenize``,
``/decode``, ``GET /info``.

What TEI's clients send (``huggingface_hub.InferenceClient.feature_extraction``,
``langchain_huggingface.HuggingFaceEndpointEmbeddings``): ``inputs``, ``normalize``,
``truncate``, ``truncation_direction``, ``prompt_name``, ``dimensions``; the answer is the bare
list of vectors. TEI serves one model; here the first artifact given answers, another is named
by kvembed's ``model`` field. ``prompt_name`` picks the method's prompt (``query`` or
``document``; unset: ``document``: every method wraps its text in a prompt). A cut input loses
its end (``truncation_direction`` right, TEI's default) or its start (left). Errors are TEI's
``{"error", "error_type"}``.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator
from starlette.responses import JSONResponse, Response

from ...runtime.encoding import TokenizerFailed, format_prompt, unicode_problem
from ...runtime.encoding import tokenize as tokenize_text
from ...version import __version__
from ..embedding import INLINE_LIMIT, check_kind, embed_request, offload
from ..errors import ApiError
from ..request import EmbedRequest, integral, parse_input, validated
from ..state import ServerState
from . import Route, serving
from .schema import Shape, input_forms, per_model

#: TEI's error_type per status
_ERROR_TYPES = {400: "Validation", 401: "Unauthorized", 404: "Validation", 408: "Validation", 413: "Validation",
                422: "Validation", 429: "Overloaded", 500: "Backend", 503: "Unhealthy", 504: "Backend"}


class TeiError(BaseModel):
    """TEI's error body."""

    error: str = Field(description="what went wrong and how to fix it")
    error_type: str = Field(description="Validation, Unauthorized, Overloaded, Backend or Unhealthy")


def error(err: ApiError) -> Response:
    body = {"error": err.message, "error_type": _ERROR_TYPES.get(err.status, "Validation")}
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return Response(json.dumps(body), status_code=err.status, media_type="application/json", headers=headers)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = Field(None, description="kvembed: a served model (GET /v1/models); unset: the first")


class EmbedBody(_Request):
    """``POST /embed``."""

    inputs: Any = Field(description="str | list[str] | list[int] | list[list[int]] (token ids: raw-text methods only)")
    normalize: StrictBool = Field(True, description="false: the pooled vectors, not unit length")
    truncate: StrictBool | None = Field(None, description="true cuts an input over max_input_length; unset: the server's --auto-truncate")
    truncation_direction: Literal["right", "Right", "left", "Left"] = Field(
        "right", description="where a cut input loses its tokens: its end (right) or its start (left)")
    prompt_name: StrictStr | None = Field(None, description="the model's prompt (query, document, or a named prompt: /info); unset: document")
    dimensions: StrictInt | None = Field(None, ge=1, description="keep the first N values (re-normalised with normalize)")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32 bytes")
    windows: StrictBool | None = Field(None, description="kvembed: true embeds an input over the cap as windows; unset: --windows")

    @model_validator(mode="before")
    @classmethod
    def _integral(cls, data: Any) -> Any:
        return integral(data, "dimensions")


class TokenizeBody(_Request):
    """``POST /tokenize``."""

    inputs: Any = Field(description="str | list[str]")
    add_special_tokens: StrictBool = Field(True, description="the tokenizer's special tokens (BOS, EOS)")
    prompt_name: StrictStr | None = Field(None, description="tokenise the text in this prompt of the model (/info); unset: bare")


class DecodeBody(_Request):
    """``POST /decode``."""

    ids: Any = Field(description="list[int] | list[list[int]]")
    skip_special_tokens: StrictBool = Field(True, description="leave special tokens out of the text")


async def embed(state: ServerState, body: bytes, name: Callable[[str], None]) -> Response:
    spec = validated(EmbedBody, body)
    served = serving(state, spec.model, name)
    request = EmbedRequest(
        model=served.name, inputs=parse_input(spec.inputs, "inputs"), field="inputs", kind=spec.prompt_name or "document", kind_field="prompt_name",
        truncate=spec.truncate, windows=spec.windows, dimensions=spec.dimensions, normalize=spec.normalize,
        truncate_from="start" if spec.truncation_direction.lower() == "left" else "end",
    )
    rows = (await embed_request(state, served, request)).vectors["float"]
    if spec.encoding_format == "base64":
        answer: Any = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in rows]
    else:
        answer = rows
    payload = await offload(rows.size > INLINE_LIMIT, _json, answer)
    return Response(payload, media_type="application/json")


def _json(answer: Any) -> bytes:
    return json.dumps(answer if isinstance(answer, list) else answer.tolist()).encode()


async def tokenize(state: ServerState, body: bytes, name: Callable[[str], None]) -> Response:
    spec = validated(TokenizeBody, body)
    served = serving(state, spec.model, name)
    inputs = parse_input(spec.inputs, "inputs", ids=False)
    if len(inputs) > state.config.max_client_batch_size:
        raise ApiError(400, f"{len(inputs)} inputs in one request, over the limit of {state.config.max_client_batch_size}",
                       param="inputs")
    template = served.embedder.method.templates[check_kind(served, spec.prompt_name, "prompt_name")] if spec.prompt_name else None
    tokens = await offload(inputs.size > INLINE_LIMIT, _tokens, served.embedder.encoder, inputs.texts or [], template,
                           spec.add_special_tokens)
    return JSONResponse(tokens)


def _tokens(encoder: Any, texts: list[str], template: str | None, special: bool) -> list[list[dict[str, Any]]]:
    """TEI's tokens of each text: id, text, special, start and stop (character offsets of the text,
    or of the prompt around it with ``template``)."""
    out = []
    for index, text in enumerate(texts):
        problem = unicode_problem(text)
        if problem is not None:
            raise ApiError(400, f"inputs[{index}]: the text {problem}", param="inputs")
        prompt = format_prompt(template, text)[0] if template else text
        try:
            encoding = tokenize_text(encoder.tokenizer, prompt, special)
        except TokenizerFailed as err:
            raise ApiError(400, f"inputs[{index}]: {err}", param="inputs") from None
        out.append([
            {"id": token, "text": prompt[start:stop], "special": bool(mask), "start": None if mask else start,
             "stop": None if mask else stop}
            for token, (start, stop), mask in zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask)
        ])
    return out


async def decode(state: ServerState, body: bytes, name: Callable[[str], None]) -> Response:
    spec = validated(DecodeBody, body)
    served = serving(state, spec.model, name)
    inputs = parse_input(spec.ids, "ids")
    if inputs.ids is None:
        raise ApiError(400, "ids must be a list of token ids or a list of token-id lists", param="ids")
    if len(inputs) > state.config.max_client_batch_size:
        raise ApiError(400, f"{len(inputs)} rows in one request, over the limit of {state.config.max_client_batch_size}", param="ids")
    tokenizer = served.embedder.encoder.tokenizer
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    for index, row in enumerate(inputs.ids):
        if any(not 0 <= i < vocab for i in row):
            raise ApiError(400, f"ids[{index}]: token ids must be in [0, {vocab})", param="ids")
    texts = await offload(inputs.size > INLINE_LIMIT, tokenizer.decode_batch, inputs.ids, spec.skip_special_tokens)
    return JSONResponse(list(texts))


async def info(state: ServerState, body: bytes, name: Callable[[str], None]) -> Response:
    """TEI's ``/info`` of the default model, and kvembed's list of every served model."""
    served = state.model(None)
    config = state.config
    embedder = served.embedder
    return JSONResponse({
        "model_id": served.name, "model_sha": None, "model_dtype": embedder.artifact.precision,
        "model_type": {"embedding": {"pooling": embedder.method.name}},
        "prompts": dict(embedder.method.templates), "default_prompt_name": "document",
        "max_concurrent_requests": config.max_concurrent_requests, "max_input_length": served.max_input_tokens,
        "max_batch_tokens": config.max_batch_tokens, "max_batch_requests": config.batch_size,
        "max_client_batch_size": config.max_client_batch_size, "auto_truncate": config.auto_truncate,
        "tokenization_workers": 1, "version": __version__, "sha": None, "docker_label": None,
        "models": list(state.models),
    })


SHAPE = Shape(
    input="inputs", ids=True, kind="prompt_name", kind_values=lambda kinds: [*kinds, *([None] if "document" in kinds else [])],
    dimensions="dimensions", truncate="truncate", truncate_values=lambda cut: [cut], truncate_default=None,
)


def _bodies(model: type[BaseModel], state: ServerState) -> tuple[dict[str, Any], dict[str, Any]]:
    schema = model.model_json_schema()
    names = [name for name, _ in state.config.artifacts]
    schema["properties"]["model"] = {**schema["properties"]["model"], "anyOf": [{"enum": names}, {"type": "null"}]}
    return schema, schema["properties"]


def embed_schema(state: ServerState) -> dict[str, Any]:
    schema, props = _bodies(EmbedBody, state)
    config = state.config
    props["inputs"] = {"description": props["inputs"].get("description", ""), "anyOf": input_forms(config.max_client_batch_size, None, None)}
    default = state.default_model
    return per_model(state, schema, SHAPE, lambda name: ({"enum": [name, None]}, False) if name == default else ({"const": name}, True))


def tokenize_schema(state: ServerState) -> dict[str, Any]:
    """TokenizeBody's schema; once the models load, one variant per model naming its prompts."""
    schema, props = _bodies(TokenizeBody, state)
    props["inputs"] = {"description": props["inputs"].get("description", ""),
                       "anyOf": input_forms(state.config.max_client_batch_size, None, None, ids=False)}
    if not state.ready:
        return schema
    variants = []
    for name, served in state.models.items():
        default = name == state.default_model
        prompt = {"enum": [*served.embedder.method.templates, None], "description": props["prompt_name"].get("description", "")}
        model = {"enum": [name, None]} if default else {"const": name}
        variants.append({**{k: v for k, v in schema.items() if k not in ("title", "properties", "required")}, "title": name,
                         "properties": {**props, "model": model, "prompt_name": prompt},
                         "required": sorted({*schema.get("required", []), *([] if default else ["model"])})})
    return {"title": schema["title"], "description": schema.get("description", ""), "anyOf": variants}


def decode_schema(state: ServerState) -> dict[str, Any]:
    schema, props = _bodies(DecodeBody, state)
    vocab = None
    if state.ready:  # the default model's vocabulary; another model's ids are checked by the server
        vocab = state.model(None).embedder.encoder.tokenizer.get_vocab_size(with_added_tokens=True)
        if len(state.models) > 1:
            props["model"] = {"enum": [state.default_model, None], "description": props["model"].get("description", "")}
    forms = input_forms(state.config.max_client_batch_size, vocab, None)[2:]
    props["ids"] = {"description": props["ids"].get("description", ""), "anyOf": forms}
    return schema


_FLOATS = {"type": "array", "items": {"type": "number"}}
EMBED_RESPONSE: dict[str, Any] = {"type": "array", "items": {"anyOf": [_FLOATS, {"type": "string", "description": "base64"}]}}
TOKENIZE_RESPONSE: dict[str, Any] = {"type": "array", "items": {"type": "array", "items": {
    "type": "object", "required": ["id", "text", "special", "start", "stop"],
    "properties": {"id": {"type": "integer", "minimum": 0}, "text": {"type": "string"}, "special": {"type": "boolean"},
                   "start": {"type": ["integer", "null"]}, "stop": {"type": ["integer", "null"]}}}}}
DECODE_RESPONSE: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
INFO_RESPONSE: dict[str, Any] = {"type": "object", "required": ["model_id", "max_input_length", "max_client_batch_size", "version"],
                                 "properties": {"model_id": {"type": "string"}, "max_input_length": {"type": "integer"},
                                                "max_client_batch_size": {"type": "integer"}, "version": {"type": "string"}}}

_STATUSES = (400, 401, 404, 408, 413, 422, 429, 500, 503, 504)
_TEI = {"error": error, "error_body": TeiError}
ROUTES = [
    Route("/embed", "POST", embed, "Embed (TEI)", embed_schema, EMBED_RESPONSE, _STATUSES, **_TEI),
    Route("/", "POST", embed, "Embed (TEI's root route)", embed_schema, EMBED_RESPONSE, _STATUSES, **_TEI),
    Route("/tokenize", "POST", tokenize, "Tokenize (TEI)", tokenize_schema, TOKENIZE_RESPONSE, _STATUSES, **_TEI),
    Route("/decode", "POST", decode, "Decode token ids (TEI)", decode_schema, DECODE_RESPONSE, _STATUSES, **_TEI),
    Route("/info", "GET", info, "Model and server facts (TEI)", None, INFO_RESPONSE, (401, 503), **_TEI),
]
