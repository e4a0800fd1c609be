"""The last ``send`` of a response, shielded under trio, so that Hypercorn keeps its keep-alive bookkeeping.

Under trio, Quart runs a request in a nursery beside a task that reads the ASGI messages; when Hypercorn finishes
a response it reports the stream closed (``http.disconnect``) from inside the app's last ``send``, Quart's reader
returns and cancels the nursery, and the rest of that ``send`` runs cancelled. Hypercorn restarts the connection's
idle timer there, so on a keep-alive connection the timer never started: the connection waited for its client's
next request whatever happened, ignoring the keep-alive timeout and the server's stop. At shutdown every such
connection held Hypercorn until its drain deadline, long after the last request had finished (a trio API server
then outlasted the launcher's stop deadline and was killed). Asyncio's Quart has no such nursery.

Shielding that one ``send`` lets Hypercorn finish it, as it would under asyncio: it is short (Hypercorn shields its
socket write already), and bounded here all the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

# The most the shielded last send may take: a socket write Hypercorn already shields, then its bookkeeping.
LAST_SEND_S = 10.0


def with_last_send_shielded(asgi_app: Callable[..., Any]) -> Callable[..., Any]:
    """``asgi_app`` wrapped so that the final ``http.response.body`` message of each response is sent shielded."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await asgi_app(scope, receive, send)
            return

        async def send_last_shielded(message: Any) -> None:
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                with anyio.CancelScope(shield=True, deadline=anyio.current_time() + LAST_SEND_S):
                    await send(message)
            else:
                await send(message)

        await asgi_app(scope, receive, send_last_shielded)

    return wrapped
