"""The one mapping from asyncdp exceptions to HTTP status codes and OpenAI error JSON.

Every error the HTTP layer returns has OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``,
whether it comes from an ``asyncdp.errors`` exception, a malformed body, an unknown route or a bug. Bugs become a
500 with a generic message; the traceback goes to the log, never into the body. Streaming responses that fail
after their first event carry the same object as an SSE ``data:`` event (see ``asyncdp.api.sse``).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from asyncdp.errors import (
    AsyncDPError,
    HTTPError,
    InvalidRequestError,
    ModelNotServedError,
    PauseError,
    QueueFullError,
    UnavailableError,
)

log = logging.getLogger("asyncdp.api")

# OpenAI's error "type" for each status, as the official client maps them to exception classes.
_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": _TYPES.get(status, HTTPStatus(status).phrase.replace(" ", "")),
                      "param": param, "code": status}}


def status_and_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """Map one exception to ``(status, OpenAI error JSON)``; unknown exceptions are logged and become 500."""
    if isinstance(exc, HTTPError):
        return exc.status, error_body(exc.status, str(exc), exc.param)
    if isinstance(exc, InvalidRequestError):
        return 400, error_body(400, str(exc), exc.field)
    if isinstance(exc, ModelNotServedError):
        return 404, error_body(404, str(exc), "model")
    if isinstance(exc, QueueFullError):
        return 429, error_body(429, str(exc) or "too many requests")
    if isinstance(exc, UnavailableError):
        return 503, error_body(503, str(exc) or "service unavailable")
    if isinstance(exc, PauseError):
        return 409, error_body(409, str(exc))
    if isinstance(exc, AsyncDPError):
        log.error("unmapped asyncdp error in request", exc_info=exc)
        return 500, error_body(500, "internal server error")
    log.error("unexpected error while handling a request", exc_info=exc)
    return 500, error_body(500, "internal server error")
