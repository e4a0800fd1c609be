"""Cleanup that runs when a request's ASGI call ends, however it ends.

A streamed response starts its engine work in the handler (admission, producers, the first output: so errors
before the first token keep their HTTP status) and closes it in the ``finally`` of the response body's
generator. Quart sends ``http.response.start`` before it enters the body: a client that disconnects while the
headers are being written gets the handler task cancelled inside that ``send``, the generator never starts, its
``finally`` never runs, and the request would keep its admission and its sequences generating with nobody
reading. ``after_request`` and ``teardown_request`` cannot help: they run before the response is sent.

``with_close_callbacks`` wraps the app's ASGI callable (``app.asgi_app``, as Quart documents for middleware):
every HTTP request gets a list in its scope, and whatever ``on_close`` put there runs in a ``finally`` once the
ASGI call returns or is cancelled. Callbacks are plain sync callables and must be idempotent (``Fanout.close``
is), since the body's own ``finally`` usually ran first. When the server cancels the call (its shutdown
deadline), Quart on asyncio leaves the handler task running, so a callback can close a fanout under a live
handler or body: ``asyncdp.api.generate`` treats that as the request's end (a 503 before the first output; the
body cut short, no ``[DONE]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quart import request

_KEY = "asyncdp.on_close"


def on_close(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the current request's ASGI call ends (no-op outside a wrapped app's request)."""
    callbacks: list[Callable[[], None]] | None = request.scope.get(_KEY)  # type: ignore[assignment]
    if callbacks is not None:
        callbacks.append(callback)


def with_close_callbacks(asgi_app: Callable[..., Any]) -> Callable[..., Any]:
    """``asgi_app`` wrapped so that the ``on_close`` callbacks of each HTTP request run when its call ends."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await asgi_app(scope, receive, send)
            return
        callbacks: list[Callable[[], None]] = []
        scope[_KEY] = callbacks
        try:
            await asgi_app(scope, receive, send)
        finally:
            for callback in callbacks:
                callback()

    return wrapped
