"""The FastAPI app: OpenAI's ``/v1/embeddings``, ``/v1/models``, ``/health``, ``/metrics``.

Artifacts load in a thread after the socket is bound, so ``/health`` and the embeddings routes
answer 503 until they are ready. Each served artifact has its own :class:`~.lanes.Lanes` (a
:class:`Batcher` for short inputs and one for long inputs), and a per-input token cap.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, AsyncIterator, Callable, Mapping, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from ..artifact import Manifest
from ..errors import shown
from ..runtime import Embedder
from ..runtime.encoding import EncodedText
from .config import ServeConfig
from .errors import ApiError, error_responses
from .metrics import NO_MODEL, Metrics
from .model import ServedModel, serve_model
from .schema import (
    EmbeddingRequest, Inputs, embedding_response, model_facts, parse_input, parse_request, request_json_schema, truncate_dimensions,
)

log = logging.getLogger("uvicorn.error")  # shown with uvicorn's own messages

Loader = Callable[[ServeConfig], Mapping[str, Embedder]]
T = TypeVar("T")

#: characters (or token ids) of input, or floats of output, above which the work leaves the event loop
INLINE_LIMIT = 16384
#: what a refusal of token ids adds: the clients that send ids unasked tokenize for OpenAI's models
TIKTOKEN_HINT = ("clients that count tokens for OpenAI's models send tiktoken ids, not this model's (LangChain's "
                 "OpenAIEmbeddings does by default): send text instead, e.g. OpenAIEmbeddings(..., "
                 "check_embedding_ctx_length=False)")


def load_embedders(config: ServeConfig, verify: bool = True, manifests: Mapping[str, Manifest] | None = None) -> dict[str, Embedder]:
    """Open every artifact with the configured provider and threads (``verify``: sha256-check its
    files first; the CLI has done that before binding, see :mod:`.preflight`, and hands on the
    ``manifests`` it read there, so none is read again; it checked the signatures as well under
    ``config.trust_key``)."""
    manifests = manifests or {}
    return {name: Embedder.load(manifests.get(name, path), provider=config.provider, threads=config.threads_per_call,
                                ov_precision=config.ov_precision, verify=verify,
                                trust_key=config.trust_key if verify else None)  # verify=False: preflight checked both
            for name, path in config.artifacts}


@dataclass
class ServerState:
    """What the routes share: settings, metrics, the loaded artifacts, and the lifecycle flags."""

    config: ServeConfig
    metrics: Metrics = field(default_factory=Metrics)
    models: dict[str, ServedModel] = field(default_factory=dict)
    ready: bool = False
    draining: bool = False
    load_error: str | None = None
    in_flight: int = 0
    created: int = field(default_factory=lambda: int(time.time()))


def create_app(
    config: ServeConfig, loader: Loader = load_embedders, on_load_error: Callable[[str], None] | None = None,
    on_ready: Callable[[ServerState], None] | None = None,
) -> FastAPI:
    """The app for ``config``. ``loader`` opens the artifacts (in a thread, after startup);
    ``on_load_error`` is told when that fails (the CLI stops the server), ``on_ready`` when every
    model serves (the CLI prints where)."""
    state = ServerState(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(_load(state, loader, on_load_error, on_ready))
        yield
        task.cancel()
        for served in state.models.values():
            await served.lanes.stop()

    # no /docs or /redoc: their pages load scripts from a CDN (blank on an air-gapped host) and would
    # be open without a key; /openapi.json is the document, for any viewer the operator trusts
    app = FastAPI(title="kvembed", summary="OpenAI-compatible embeddings", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.kvembed = state
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    _install_error_handlers(app)
    request_schema = {"requestBody": {"required": True, "content": {"application/json": {"schema": _request_schema(state)}}}}
    embedding_responses = {
        200: {"description": "The embeddings", "content": {"application/json": {"schema": EMBEDDING_RESPONSE_SCHEMA}}},
        **error_responses(400, 401, 404, 408, 413, 422, 429, 500, 503, 504),
    }

    async def embeddings(request: Request) -> Response:
        return await _serve_embeddings(state, request)

    for path in EMBEDDING_PATHS:
        app.add_api_route(path, embeddings, methods=["POST"], openapi_extra=request_schema, summary="Create embeddings",
                          response_class=Response, responses=embedding_responses)

    @app.get("/v1/models", summary="Served models", response_class=Response, responses={
        200: {"description": "The served models", "content": {"application/json": {"schema": MODEL_LIST_SCHEMA}}},
        **error_responses(401, 503),
    })
    async def models(request: Request) -> Response:
        try:
            _check_auth(state, request)
            _check_ready(state)
        except ApiError as err:
            return err.response()
        data = [served.card(state.created) for served in state.models.values()]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/health", summary="200 once every artifact is loaded", response_class=Response, responses={
        200: {"description": "Every artifact is loaded", "content": {"application/json": {"schema": HEALTH_SCHEMA}}},
        **error_responses(503),
    })
    async def health() -> Response:
        if state.load_error is not None:
            return ApiError(503, f"loading failed: {state.load_error}", code="load_failed").response()
        if not state.ready:
            return ApiError(503, "loading artifacts; retry shortly", code="loading").response()
        return JSONResponse({"status": "ok", "models": list(state.models)})

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response, responses={
        200: {"description": "Prometheus text exposition format",
              "content": {state.metrics.content_type: {"schema": {"type": "string"}}}},
    })
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    def openapi() -> dict[str, Any]:
        """FastAPI's document, with each loaded model's request spelled out: built again until
        every model is loaded (their outputs, widths and token ids are known only then), then kept."""
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = FastAPI.openapi(app)
        if not state.ready:
            app.openapi_schema = None
            return document
        for path in EMBEDDING_PATHS:
            document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"] = _request_schema(state)
        return document

    app.openapi = openapi  # type: ignore[method-assign]
    return app


EMBEDDING_PATHS = ("/v1/embeddings", "/embeddings")


def _request_schema(state: ServerState) -> dict[str, Any]:
    """The request body's schema: the served names before the models load, each model's own request once loaded."""
    config = state.config
    facts = [model_facts(name, served.embedder, served.max_input_tokens) for name, served in state.models.items()] if state.ready else None
    return request_json_schema([name for name, _ in config.artifacts], config.max_client_batch_size, config.auto_truncate, facts)


#: ``POST /v1/embeddings`` 200, as :func:`.schema.embedding_response` writes it
EMBEDDING_RESPONSE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {
            "type": "object", "required": ["object", "index", "embedding"],
            "properties": {
                "object": {"const": "embedding"}, "index": {"type": "integer", "minimum": 0},
                "embedding": {"anyOf": [{"type": "array", "items": {"type": "number"}},
                                        {"type": "string", "description": "base64 of little-endian float32"}]},
            },
        }},
        "model": {"type": "string"},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"], "properties": {
            "prompt_tokens": {"type": "integer", "minimum": 0}, "total_tokens": {"type": "integer", "minimum": 0}}},
    },
}

#: ``GET /v1/models`` 200 (each card as :meth:`.model.ServedModel.card` writes it)
MODEL_LIST_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {
        "type": "object", "required": ["id", "object", "created", "owned_by"],
        "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                       "owned_by": {"type": "string"}, "backend": {"type": "string"}, "backend_reason": {"type": "string"}},
    }}},
}

#: ``GET /health`` 200
HEALTH_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["status", "models"],
    "properties": {"status": {"const": "ok"}, "models": {"type": "array", "items": {"type": "string"}}},
}


async def _load(
    state: ServerState, loader: Loader, on_load_error: Callable[[str], None] | None, on_ready: Callable[[ServerState], None] | None,
) -> None:
    try:
        embedders = await asyncio.to_thread(loader, state.config)
    except Exception as err:  # reported on /health and to the CLI, which exits 2
        state.load_error = f"{type(err).__name__}: {err}"
        log.error("kvembed serve: %s", state.load_error)
        if on_load_error is not None:
            on_load_error(state.load_error)
        return
    for name, embedder in embedders.items():
        served = serve_model(name, embedder, state.metrics, state.config)
        served.lanes.start()
        state.models[name] = served
    state.ready = True
    if on_ready is not None:
        on_ready(state)
    else:
        log.info("kvembed serve: ready (%s)", ", ".join(f"{name} on {served.embedder.backend}" for name, served in state.models.items()))


async def _serve_embeddings(state: ServerState, request: Request) -> Response:
    start = perf_counter()
    model, status = NO_MODEL, 200
    admitted = False
    config = state.config
    try:
        _check_auth(state, request)
        _check_ready(state)
        body = await _read_body(request, config.payload_limit, config.read_timeout, state.metrics)
        if state.in_flight >= config.max_concurrent_requests:  # counted once the body is in: a slow sender holds no slot
            raise ApiError(429, f"the server is at its limit of {config.max_concurrent_requests} concurrent requests; retry later")
        state.in_flight += 1
        admitted = True
        state.metrics.in_flight.set(state.in_flight)
        spec = parse_request(body)
        served = state.models.get(spec.model)
        if served is None:
            raise ApiError(404, f"model {shown(spec.model)} is not served here; served: {', '.join(state.models)}", param="model")
        model = spec.model
        try:
            return await asyncio.wait_for(_embed(state, served, spec), config.request_timeout or None)
        except asyncio.TimeoutError:
            state.metrics.timeouts.labels("request").inc()
            raise ApiError(504, f"the request was not served within {config.request_timeout:g} s (--request-timeout); "
                           "send fewer or shorter inputs per request") from None
    except ApiError as err:
        status = err.status
        return err.response(headers={"Connection": "close"} if status == 408 else None)
    except Exception as err:  # a bug or a failed graph call: answer in OpenAI's shape, keep serving
        log.exception("embeddings request failed")
        status = 500
        return ApiError(500, f"internal error: {type(err).__name__}: {err}").response()
    finally:
        if admitted:
            state.in_flight -= 1
            state.metrics.in_flight.set(state.in_flight)
        state.metrics.requests.labels(model, str(status)).inc()
        state.metrics.latency.labels(model).observe(perf_counter() - start)


async def _embed(state: ServerState, served: ServedModel, spec: EmbeddingRequest) -> Response:
    """The admitted request, parsed: tokenise, embed in the model's lanes, answer."""
    model = spec.model
    inputs = parse_input(spec.input)
    if len(inputs) > state.config.max_client_batch_size:
        # 400 as OpenAI answers it: the document's maxItems says so, unlike a body over --payload-limit (413)
        raise ApiError(400, f"{len(inputs)} inputs in one request, over the limit of {state.config.max_client_batch_size}; split the request",
                       param="input", code="too_many_inputs")
    _check_output(served.embedder, spec)
    truncate = state.config.auto_truncate if spec.truncate is None else spec.truncate
    with served.lanes.arriving():
        items = await _offload(inputs.size > INLINE_LIMIT, _tokenize, served, inputs, spec.input_type, truncate)
    vectors = truncate_dimensions(await served.lanes.embed(items, spec.output), spec.dimensions)
    tokens = sum(len(item.ids) for item in items)
    payload = await _offload(vectors.size > INLINE_LIMIT, embedding_response, vectors, model, tokens, spec.encoding_format)
    state.metrics.texts.labels(model).inc(len(items))
    state.metrics.tokens.labels(model).inc(tokens)
    return Response(payload, media_type="application/json")


async def _offload(heavy: bool, job: Callable[..., T], *args: Any) -> T:
    """Run ``job`` in a thread when it is heavy; inline otherwise: for a few short texts the thread
    hop (a wake-up, a GIL hand-over) costs more than the work, and it is paid on every request."""
    return await asyncio.to_thread(job, *args) if heavy else job(*args)


def _check_auth(state: ServerState, request: Request) -> None:
    key = state.config.api_key
    if key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        raise ApiError(401, "missing API key: send the header 'Authorization: Bearer KEY'")
    if not hmac.compare_digest(given.strip().encode(), key.encode()):  # constant time
        raise ApiError(401, "incorrect API key provided")


def _check_ready(state: ServerState) -> None:
    if state.draining:
        raise ApiError(503, "the server is shutting down; retry on another instance", code="shutting_down")
    if not state.ready:
        raise ApiError(503, "the server is still loading its artifacts; retry shortly", code="loading")


async def _read_body(request: Request, limit: int, timeout: float, metrics: Metrics) -> bytes:
    """The body, refused with 413 as soon as it passes ``limit`` bytes (Content-Length or streamed),
    and with 408 when it has not all arrived ``timeout`` seconds after its headers."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {int(declared)} bytes is over the payload limit of {limit} bytes (--payload-limit)")

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body is over the payload limit of {limit} bytes (--payload-limit)")
            chunks.append(chunk)
        return b"".join(chunks)

    metrics.reading.inc()
    try:
        return await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        metrics.timeouts.labels("body").inc()
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s (--read-timeout)") from None
    finally:
        metrics.reading.dec()


def _check_output(embedder: Embedder, spec: EmbeddingRequest) -> None:
    try:
        dim = embedder.dim_of(spec.output)
    except ValueError as err:
        raise ApiError(400, str(err), param="output") from None
    if spec.dimensions is not None and spec.dimensions > dim:
        raise ApiError(400, f"dimensions={spec.dimensions} is over this model's {dim}; ask for at most {dim}", param="dimensions")


def _tokenize(served: ServedModel, inputs: Inputs, input_type: str, truncate: bool) -> list[EncodedText]:
    """Inputs -> the runtime's encoded rows (its own tokenizer and prompts), cut at the model's
    per-input cap; an input over it -> 413 unless ``truncate``."""
    embedder = served.embedder
    if inputs.texts is not None:
        items = []
        for index, text in enumerate(inputs.texts):
            try:
                items.append(embedder.encoder.encode_one(text, input_type))
            except ValueError as err:  # not Unicode text, a tokenizer panic, a placeholder typed by the user
                raise ApiError(400, f"input[{index}]: {err}", param="input") from None
    else:
        try:
            items = embedder.token_inputs(inputs.ids or [], input_type)
        except ValueError as err:
            raise ApiError(400, f"{str(err).replace('ids[', 'input[')}; {TIKTOKEN_HINT}", param="input") from None
    if not truncate:
        cut = [index for index, item in enumerate(items) if item.truncated]
        if cut:
            cap = served.max_input_tokens
            raise ApiError(
                413, f"input[{cut[0]}] ({len(cut)} input(s) in all) is longer than this model's limit of {cap} tokens per "
                f"input, prompt included (kvembed serve --max-input-tokens, at most the artifact's max_length of "
                f"{served.max_length}); shorten or split it, or send truncate=true to embed its first {cap} tokens",
                param="input", code="input_too_long",
            )
    return items


def _install_error_handlers(app: FastAPI) -> None:
    """Routing errors (404 path, 405 method) and FastAPI validation in OpenAI's error shape too."""

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        """Starlette's own headers are kept: a 405 carries ``Allow`` with the path's methods (RFC 9110)."""
        message = f"{request.method} {request.url.path}: {exc.detail}"
        error = ApiError(exc.status_code, message, code="not_found" if exc.status_code == 404 else None)
        return error.response(headers=dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> Response:
        """A kvembed bug anywhere outside the embeddings route's own handler: JSON like every other answer."""
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return ApiError(500, f"internal error: {type(exc).__name__} (a kvembed bug; the server's log has the traceback)").response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return ApiError(422, str(exc.errors()[0].get("msg", exc))).response()
