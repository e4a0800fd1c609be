"""Cross-origin requests (CORS), as vLLM's server answers them (``--allowed-origins``, ``--allowed-methods``,
``--allowed-headers``, ``--allow-credentials``; vLLM puts Starlette's ``CORSMiddleware`` in front of its app).

By default every origin, method and header is allowed without credentials, so a browser page on any origin can
call the API, as it can call vLLM's. :func:`install_cors` adds two hooks to the app:

* a preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is answered before anything
  else, the API-key check included (a browser sends no credentials with it): 200 with the allowed origin,
  methods and headers and a ``Max-Age``, or a 400 OpenAI error naming what is not allowed;
* any other response to a request with an allowed ``Origin`` gets ``Access-Control-Allow-Origin`` (``*`` when
  every origin is allowed and credentials are not, else the origin itself with ``Vary: Origin``) and, with
  ``--allow-credentials``, ``Access-Control-Allow-Credentials: true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (quart only where the hooks are installed: the launcher imports Cors without the web stack)
    from quart import Quart, Response

# What "*" allows for methods (Starlette's list), and how long a browser may cache a preflight's answer.
ALL_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")
MAX_AGE_S = 600


@dataclass(frozen=True, slots=True)
class Cors:
    """The allowed origins, methods and request headers ("*": any), and whether credentials are allowed."""

    origins: tuple[str, ...] = ("*",)
    methods: tuple[str, ...] = ("*",)
    headers: tuple[str, ...] = ("*",)
    credentials: bool = False

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin in self.origins

    def allow_origin(self, origin: str) -> tuple[str, bool]:
        """The ``Access-Control-Allow-Origin`` value for an allowed ``origin``, and whether it varies by origin."""
        if "*" in self.origins and not self.credentials:
            return "*", False
        return origin, True

    def refusal(self, method: str, headers: str) -> str | None:
        """Why a preflight asking for ``method`` and ``headers`` (``Access-Control-Request-Headers``) is refused."""
        if "*" not in self.methods and method.upper() not in (m.upper() for m in self.methods):
            return f"the method {method} is not allowed for cross-origin requests (--allowed-methods)"
        if "*" not in self.headers:
            allowed = {h.lower() for h in self.headers}
            asked = [h.strip() for h in headers.split(",") if h.strip()]
            refused = [h for h in asked if h.lower() not in allowed]
            if refused:
                return f"the header(s) {', '.join(refused)} are not allowed for cross-origin requests (--allowed-headers)"
        return None


def install_cors(app: Quart, cors: Cors) -> None:
    """Answer preflights and mark cross-origin responses (call before any other ``before_request`` hook)."""
    from quart import Response, request

    from asyncdp.api.context import json_response
    from asyncdp.api.errors import error_body

    @app.before_request
    async def _preflight() -> Response | None:
        origin = request.headers.get("Origin")
        method = request.headers.get("Access-Control-Request-Method")
        if request.method != "OPTIONS" or origin is None or method is None:
            return None
        if not cors.origin_allowed(origin):
            return json_response(error_body(400, f"the origin {origin} is not allowed (--allowed-origins)"), 400)
        why = cors.refusal(method, request.headers.get("Access-Control-Request-Headers", ""))
        if why is not None:
            return json_response(error_body(400, why), 400)
        response = Response(b"OK", status=200, content_type="text/plain")
        value, varies = cors.allow_origin(origin)
        response.headers["Access-Control-Allow-Origin"] = value
        if varies:
            response.headers["Vary"] = "Origin"
        response.headers["Access-Control-Allow-Methods"] = ", ".join(
            ALL_METHODS if "*" in cors.methods else cors.methods)
        asked = request.headers.get("Access-Control-Request-Headers")
        if "*" in cors.headers:
            if asked:
                response.headers["Access-Control-Allow-Headers"] = asked
        else:
            response.headers["Access-Control-Allow-Headers"] = ", ".join(cors.headers)
        response.headers["Access-Control-Max-Age"] = str(MAX_AGE_S)
        if cors.credentials:
            response.headers["Access-Control-Allow-Credentials"] = "true"
        return response

    @app.after_request
    async def _mark(response: Response) -> Response:
        origin = request.headers.get("Origin")
        if origin is None or not cors.origin_allowed(origin) or "Access-Control-Allow-Origin" in response.headers:
            return response
        value, varies = cors.allow_origin(origin)
        response.headers["Access-Control-Allow-Origin"] = value
        if varies:
            response.headers.add("Vary", "Origin")
        if cors.credentials:
            response.headers["Access-Control-Allow-Credentials"] = "true"
        return response


ALLOW_ALL = Cors()  # vLLM's default: any origin, method and header, no credentials
