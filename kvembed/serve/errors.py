"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

#: HTTP status -> (OpenAI error type, default code)
_KINDS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    422: ("invalid_request_error", "validation_error"),
    429: ("rate_limit_error", "too_many_concurrent_requests"),
    500: ("server_error", "internal_error"),
    503: ("server_error", "unavailable"),
}


class ApiError(Exception):
    """An expected failure: the HTTP status, a message naming the problem and the fix, the field."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type, default_code = _KINDS.get(status, ("invalid_request_error" if status < 500 else "server_error", "error"))
        self.code = code or default_code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return Response(json.dumps(self.body()), status_code=self.status, media_type="application/json", headers=headers)
