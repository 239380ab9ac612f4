"""The request and response shapes the server speaks, one module per dialect.

A dialect is the routes of one family of clients: OpenAI's (``openai.py``), TEI's (``tei.py``),
Cohere's (``cohere.py``). Each module's :data:`ROUTES` lists :class:`Route` s; a route reads its
JSON body into an :class:`~kvembed.serve.request.EmbedRequest` (or a tokenizer call), takes the one
embedding path (:mod:`kvembed.serve.embedding`) and writes the answer; its errors keep the
dialect's own body (:attr:`Route.error`). The app (:mod:`kvembed.serve.app`) runs every route in
one pipeline: the API key, readiness, the body read under --payload-limit and --read-timeout, the
concurrency limit, --request-timeout, metrics. A new route is one entry in a dialect's list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from starlette.responses import Response

from ..errors import ApiError
from ..model import ServedModel
from ..state import ServerState

#: a POST route's work: the state, the body, the metrics' model label setter -> the answer
Handler = Callable[[ServerState, bytes, Callable[[str], None]], Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    """One route: path, method, its work, and what the OpenAPI document says of it."""

    path: str
    method: str
    handler: Handler
    summary: str
    #: the request body's JSON Schema (None: no body), from what the server knows now
    request_schema: Callable[[ServerState], dict[str, Any]] | None
    #: the 200 answer's JSON Schema
    response_schema: dict[str, Any]
    #: the error statuses it may answer with
    statuses: tuple[int, ...]
    #: ``ApiError`` -> this dialect's error response
    error: Callable[[ApiError], Response] = field(default=lambda err: err.response())
    #: the error body's pydantic model, for the document
    error_body: Any = None


def serving(state: ServerState, model: str | None, name: Callable[[str], None]) -> ServedModel:
    """The served model a request names (None: the default), its name handed to the metrics."""
    served = state.model(model)
    name(served.name)
    return served
