"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field
from starlette.responses import Response

#: HTTP status -> (OpenAI error type, default code)
_KINDS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("invalid_request_error", "request_timeout"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "validation_error"),
    429: ("rate_limit_error", "too_many_concurrent_requests"),
    500: ("server_error", "internal_error"),
    503: ("server_error", "unavailable"),
    504: ("server_error", "request_timeout"),
}
#: the longest message an error body carries: a crafted field name or value is not echoed at length
LONGEST_MESSAGE = 1000
#: the longest ``param`` (a field's name as the request spelled it)
LONGEST_PARAM = 100


class ErrorDetail(BaseModel):
    """The inside of OpenAI's error body."""

    message: str = Field(description="what went wrong and how to fix it")
    type: str = Field(description="invalid_request_error, rate_limit_error or server_error")
    param: str | None = Field(description="the request field at fault, if any")
    code: str | None = Field(description="a machine-readable reason, e.g. model_not_found, input_too_long, loading")


class ErrorBody(BaseModel):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail


#: what each status means on this server, for the OpenAPI document
_DESCRIPTIONS: dict[int, str] = {
    400: "Invalid request (unparseable JSON, unknown field, bad input item, more inputs than --max-client-batch-size, "
         "unsupported output or dimensions)",
    401: "Missing or incorrect API key (Authorization: Bearer KEY)",
    404: "Model not served here",
    405: "Method not allowed (the Allow header lists the methods of the path)",
    413: "Request too large: body over --payload-limit, or an input over the per-input token cap without truncate",
    422: "A field of the request has a wrong value",
    408: "The request's body did not arrive within --read-timeout",
    429: "At the limit of concurrent requests (--max-concurrent-requests)",
    500: "Internal error (a kvembed bug or a failed graph call)",
    503: "Loading artifacts, loading failed, or shutting down",
    504: "The request was not served within --request-timeout",
}


def error_responses(*statuses: int, body: Any = None) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` declaring ``statuses`` with the error ``body`` model (OpenAI's by default)."""
    return {status: {"model": body or ErrorBody, "description": _DESCRIPTIONS[status]} for status in statuses}


class ApiError(Exception):
    """An expected failure: the HTTP status, a message naming the problem and the fix, the field."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        if len(message) > LONGEST_MESSAGE:
            message = f"{message[:LONGEST_MESSAGE]}... (cut at {LONGEST_MESSAGE} characters)"
        if param is not None and len(param) > LONGEST_PARAM:
            param = f"{param[:LONGEST_PARAM]}..."
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type, default_code = _KINDS.get(status, ("invalid_request_error" if status < 500 else "server_error", "error"))
        self.code = code or default_code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: dict[str, str] | None = None) -> Response:
        headers = dict(headers or {})
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return Response(json.dumps(self.body()), status_code=self.status, media_type="application/json", headers=headers)
