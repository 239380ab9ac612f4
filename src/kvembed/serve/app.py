"""The FastAPI app: every dialect's routes (:mod:`kvembed.serve.dialects`), ``/health``, ``/metrics``.

Artifacts load in a thread after the socket is bound, so ``/health`` and the model routes answer
503 until they are ready. Each served artifact has its own :class:`~.lanes.Lanes` (a
:class:`Batcher` for short inputs and one for long inputs), and a per-input token cap. Every
route runs in one pipeline (:func:`_serve`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager
from time import perf_counter
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from ..backends.catalogue import hint_options
from ..runtime import Embedder
from .config import ServeConfig
from .dialects import Route
from .dialects.cohere import ROUTES as COHERE
from .dialects.openai import ROUTES as OPENAI
from .dialects.tei import ROUTES as TEI
from .errors import ApiError, error_responses
from .metrics import NO_MODEL, Metrics
from .model import serve_model
from .preflight import Checked
from .state import ServerState

log = logging.getLogger("uvicorn.error")  # shown with uvicorn's own messages

Loader = Callable[[ServeConfig], Mapping[str, Embedder]]
#: the status a request whose client disconnected is counted under (nginx's "client closed request")
CLIENT_GONE = 499
#: every route of every dialect
ROUTES: list[Route] = [*OPENAI, *TEI, *COHERE]


def load_embedders(config: ServeConfig, verify: bool = True, checked: Mapping[str, Checked] | None = None) -> dict[str, Embedder]:
    """Open every artifact with the configured provider and threads (``verify``: sha256-check its
    files first; the CLI has done that before binding, see :mod:`.preflight`, and hands on what it
    ``checked`` there, each manifest and encoder, so none is read or built again; it checked the
    signatures as well under ``config.trust_key``)."""
    checked = checked or {}
    embedders = {}
    for name, path in config.artifacts:
        found = checked.get(name)
        embedders[name] = Embedder.load(
            found.manifest if found else path, provider=config.provider, threads=config.threads_per_call,
            options=hint_options(config.ov_precision), verify=verify, encoder=found.encoder if found else None,
            trust_key=config.trust_key if verify else None,  # verify=False: preflight checked both
        )
    return embedders


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
        left = state.time_left()
        state.abandoned = sum(await asyncio.gather(*(served.lanes.stop(left) for served in state.models.values())))

    # no /docs or /redoc: their pages load scripts from a CDN (blank on an air-gapped host) and would
    # be open without a key; /openapi.json is the document, for any viewer the operator trusts
    app = FastAPI(title="kvembed", summary="Embeddings in OpenAI's, TEI's and Cohere's dialects", lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.kvembed = state
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    _install_error_handlers(app)
    for route in ROUTES:
        _add_route(app, state, route)

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
        for route in ROUTES:
            if route.request_schema is not None:
                operation = document["paths"][route.path][route.method.lower()]
                operation["requestBody"]["content"]["application/json"]["schema"] = route.request_schema(state)
        return document

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def _add_route(app: FastAPI, state: ServerState, route: Route) -> None:
    """``route`` on ``app``, run through :func:`_serve`, with its request, answer and errors documented."""
    extra = None
    if route.request_schema is not None:
        extra = {"requestBody": {"required": True, "content": {"application/json": {"schema": route.request_schema(state)}}}}
    responses = {200: {"description": route.summary, "content": {"application/json": {"schema": route.response_schema}}},
                 **error_responses(*route.statuses, body=route.error_body)}

    async def endpoint(request: Request) -> Response:
        return await _serve(state, request, route)

    app.add_api_route(route.path, endpoint, methods=[route.method], openapi_extra=extra, summary=route.summary,
                      response_class=Response, responses=responses)


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
        log.info("kvembed serve: ready (%s)", ", ".join(f"{name} on {served.embedder.target}" for name, served in state.models.items()))


async def _serve(state: ServerState, request: Request, route: Route) -> Response:
    """Every route's pipeline: the API key, readiness; for a POST the body (under --payload-limit and
    --read-timeout, before a slot is taken), the concurrency limit and --request-timeout; metrics
    for all. Errors come back in the route's dialect; a bug is a 500 in that shape, never a traceback."""
    start = perf_counter()
    status = 200
    model = [NO_MODEL]
    admitted = False
    config = state.config

    def named(name: str) -> None:
        model[0] = name

    try:
        _check_auth(state, request)
        _check_ready(state)
        if route.method == "GET":
            return await route.handler(state, b"", named)
        body = await _read_body(request, config.payload_limit, config.read_timeout, state.metrics)
        if state.in_flight >= config.max_concurrent_requests:  # counted once the body is in: a slow sender holds no slot
            raise ApiError(429, f"the server is at its limit of {config.max_concurrent_requests} concurrent requests; retry later")
        state.in_flight += 1
        admitted = True
        state.metrics.in_flight.set(state.in_flight)
        answer = await _until_done_or_gone(request, route.handler(state, body, named), config.request_timeout or None,
                                           state.metrics)
        if answer is None:  # the client went away: its queued inputs are dropped, no one reads an answer
            status = CLIENT_GONE
            return Response(status_code=CLIENT_GONE)
        return answer
    except asyncio.CancelledError:
        if not state.draining:
            raise
        # the graceful timeout is over and uvicorn cancels what still runs: the client hears why
        status = 503
        return route.error(ApiError(503, "the server shut down before this request was served (--graceful-timeout); "
                                         "retry on another instance", code="shutting_down"))
    except ApiError as err:
        status = err.status
        response = route.error(err)
        if status == 408:  # the rest of a late body would be read as the next request
            response.headers["Connection"] = "close"
        return response
    except Exception as err:  # a bug or a failed graph call: answer in the dialect's shape, keep serving
        log.exception("%s %s failed", route.method, route.path)
        status = 500
        return route.error(ApiError(500, f"internal error: {type(err).__name__}: {err}"))
    finally:
        if admitted:
            state.in_flight -= 1
            state.metrics.in_flight.set(state.in_flight)
        if route.method == "POST":
            state.metrics.requests.labels(model[0], str(status)).inc()
            state.metrics.latency.labels(model[0]).observe(perf_counter() - start)


async def _until_done_or_gone(request: Request, work: Awaitable[Response], timeout: float | None, metrics: Metrics) -> Response | None:
    """``work``'s answer; None as soon as the client disconnects (``work`` is cancelled: the batcher
    drops its queued inputs); 504 after ``timeout`` seconds. The body has been read, so the next
    ASGI message is the disconnect."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if task in done:
        return task.result()
    if gone in done:  # counted as a request of status 499
        return None
    metrics.timeouts.labels("request").inc()
    raise ApiError(504, f"the request was not served within {timeout:g} s (--request-timeout); "
                   "send fewer or shorter inputs per request")


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


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
