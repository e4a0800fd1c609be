"""Request bodies over ``--max-request-body-bytes``: refused with a 413 that reaches the client.

Quart's own check raises as soon as the limit is crossed (at once when ``Content-Length`` says so), so the
handler answers while the client is still sending; the server then closes a connection with unread data, the
kernel answers the client's next segment with a reset, and the client sees a transport error instead of the 413
(a reset also discards a response it has not read yet). The body class here keeps receiving past the limit,
discarding every byte (nothing over the limit is held in memory), and raises ``RequestEntityTooLarge`` only
once the client has finished sending, so the connection ends cleanly after the 413. ``BODY_TIMEOUT`` (Quart's
deadline on reading a body) bounds how long a client can keep the server draining.

Any answer sent before the body was read (a 401 for a missing API key, the drain gate's 503, a 404 or 405, a
route that ignores its body) has the same problem: answered while a large body is still arriving, it reaches the
client as a broken pipe or a reset, and a proxy in front (``asyncdp route``) turns that into a 502. An
``after_request`` hook of the app (they run for every answer) calls ``read_rest_of_body``, which reads and drops what the client still sends before
the answer goes out, holding nothing, until the same deadline counted from the request's start (so a body that
already timed out, Quart's 408, is not waited for again); a body already read costs nothing.
"""

from __future__ import annotations

from typing import Any

import anyio
from werkzeug.exceptions import RequestEntityTooLarge


async def read_rest_of_body(body: Any, timeout_s: float) -> None:
    """Read the rest of a request's body and drop it (a chunk at a time, nothing kept), until ``timeout_s`` after
    the body began; a body over the limit ends the same way. Nothing to do once the body has arrived whole."""
    if body.arrived:
        return
    with anyio.move_on_after(body.started + timeout_s - anyio.current_time()):
        try:
            async for _ in body:
                pass
        except RequestEntityTooLarge:
            pass


def draining_request_class(base: Any) -> Any:
    """A subclass of the app's request class (Quart's or QuartTrio's) whose body drains past the limit."""

    class DrainingBody(base.body_class):
        def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
            super().__init__(expected_content_length, max_content_length)
            # Content-Length over the limit: drain it all the same, and raise once it has arrived.
            self.too_large = getattr(self, "_must_raise", None) is not None
            self._must_raise: Exception | None = None
            self.arrived = False  # the client has sent all of it
            self.started = anyio.current_time()  # BODY_TIMEOUT runs from here, for Quart's read and for ours

        def append(self, data: bytes) -> None:
            if self.too_large or not data:
                return
            self._data.extend(data)
            self._has_data.set()
            if self._max_content_length is not None and len(self._data) > self._max_content_length:
                self.too_large = True
                self._data.clear()

        def set_complete(self) -> None:
            self.arrived = True
            if self.too_large:
                self._must_raise = RequestEntityTooLarge()
            super().set_complete()

    class DrainingRequest(base):
        body_class = DrainingBody

    return DrainingRequest
