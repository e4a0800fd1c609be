"""The router's HTTP side: a plain ASGI app that forwards each API request to the best endpoint and streams the
answer back as it arrives.

Theory of operation. Served by :func:`asyncdp.api.serve.serve_http` (Hypercorn). Routes:

* ``POST|GET|... /v1/*``, ``/tokenize``, ``/detokenize``, ``/tokenizer_info``: proxied. The body is held whole when it is at most
  ``--replay-buffer-bytes``, and streamed to the endpoint as it arrives when larger (:mod:`.body`); over
  ``--max-request-body-bytes`` it is a 413. The request goes with the method, path, query and headers unchanged,
  ``Authorization`` included, less the hop-by-hop ones, plus ``X-Forwarded-For``/``X-Forwarded-Proto``
  (:mod:`.headers`). The endpoint is the first of :meth:`Poller.candidates`; when the connection to it fails
  before anything was sent (refused, reset or timed out on connect), or it answers the 503 of its drain gate (it
  is stopping and did not read the request), it is marked down and the next best is tried, each endpoint once,
  as long as the body can be sent again (a streamed body cannot once the endpoint read past what is held). With
  none left the answer is a 503 in OpenAI's error shape. The endpoint's status and headers (less hop-by-hop ones,
  and ``date``/``server``, which Hypercorn sets) come back first, then its body chunk by chunk as httpx reads it,
  undecoded (``aiter_raw``): SSE events are not buffered.
* ``GET /health``: 200 while at least one endpoint is usable and the router is not draining, else 503; the body
  lists every endpoint's score and state. ``GET /load``: the endpoints' last ``/load`` answers, merged
  (:meth:`Poller.load`).
* anything else: 404 in OpenAI's error shape, as is a proxied path with a dot segment; the path routed on and the
  target forwarded are :func:`.target.request_target`'s (an absolute-form target's path; a target httpx cannot
  send is a 400). A WebSocket handshake gets a 400 (404 off these routes) (:func:`.target.refuse_websocket`).

Every error the router makes itself once the body started to arrive (413, 502, 503) is sent after the rest of
the body was read and discarded (for up to ``BODY_DRAIN_S``), so it reaches the client instead of a reset. A
client that sends no part of its body for ``body_idle_timeout_s`` (60 s) gets a 408 at once (a streamed body's
endpoint sees the request cut off).
A disconnect watcher reads the client's side once the body is in (or the endpoint answered without it): when the
client goes away before the answer's last body event was handed to Hypercorn (which ends the response inside that
``send``, delivering an ``http.disconnect`` of its own), the exchange is cancelled and the upstream response
closed before it was read to the end, which closes its connection, so the endpoint aborts the request. An endpoint that fails mid-body (killed: its
connection reset or closed early) ends an uncompressed stream of events the client got whole events of with an
error event (502) and ``data: [DONE]``, as ``asyncdp serve`` ends a stream that fails; any other response ends
without its end (the app returns without the last body event, and Hypercorn closes the connection): the client
sees an incomplete response, never a truncated one that looks whole (a whole answer's 200 went out already).
Every upstream wait is bounded by the connect (and write) timeout; reading the answer is not (a long generation,
or the gaps of a stream, are the endpoint's business), but an endpoint that stops answering its polls has the
requests in flight there abandoned (:mod:`.silence`): one whose client got nothing yet goes to the next best
endpoint, once, while its body is held (:meth:`RouterApp._forward_to_best`); with none usable the answer is the
503 above, and a 504 when it cannot go elsewhere; a stream of events that started ends with an error event.
While draining, new requests get 503; :meth:`cancel_all` (a second signal) ends the requests in flight at once,
as a client's leaving would.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson

from asyncdp.api.context import DRAINING_MESSAGE
from asyncdp.api.errors import error_body
from asyncdp.router.body import BODY_IDLE_TIMEOUT_S, BodyTooLarge, ClientGone, ClientTooSlow, RequestBody
from asyncdp.router.headers import NOT_RETURNED, forwarded_headers, upstream_headers
from asyncdp.router.poller import Poller, error_text
from asyncdp.router.settings import DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_REPLAY_BUFFER_BYTES
from asyncdp.router.silence import (
    FAILED_STATUS,
    SILENT_STATUS,
    Attempt,
    SilenceWatch,
    ends_an_event,
    is_event_stream,
    stream_error_end,
)
from asyncdp.router.target import is_proxied, not_a_route, refuse_websocket, request_target

log = logging.getLogger("asyncdp.router")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MAX_BODY_BYTES = DEFAULT_MAX_REQUEST_BODY_BYTES  # RouterApp's default limit
BODY_DRAIN_S = 30.0  # bound on discarding the rest of a body before a router-made error answer
_CLOSE_UPSTREAM_S = 2.0  # bound on closing an upstream response (shielded cleanup)


@dataclass
class _Exchange:
    """One request's state shared with its disconnect watcher."""

    target: bytes  # path and query to send upstream (:func:`.target.request_target`)
    responded: bool = False  # the last body event of the answer was handed to the server
    client_gone: bool = False
    too_large: bool = False
    too_slow: bool = False


class RouterApp:
    """The ASGI application (see the module docstring). ``draining`` is set by the process on a signal."""

    def __init__(self, poller: Poller, http: httpx.AsyncClient, *, connect_timeout_s: float,
                 max_body_bytes: int | None = None, replay_body_bytes: int = DEFAULT_REPLAY_BUFFER_BYTES,
                 body_idle_timeout_s: float = BODY_IDLE_TIMEOUT_S) -> None:
        self.poller = poller
        self.http = http
        self.timeout = httpx.Timeout(connect=connect_timeout_s, read=None, write=connect_timeout_s,
                                     pool=connect_timeout_s)
        self.max_body_bytes = MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes
        self.replay_body_bytes = replay_body_bytes
        self.body_idle_timeout_s = body_idle_timeout_s
        self.draining = False
        self._exchanges: set[anyio.CancelScope] = set()  # one per request being forwarded

    def cancel_all(self) -> int:
        """Cancel every request being forwarded (a second signal: stop draining now); how many there were. Each
        closes its upstream response, so its endpoint aborts it, and its client sees the response cut off."""
        for scope in self._exchanges:
            scope.cancel()
        return len(self._exchanges)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
        elif scope["type"] == "http":
            target = request_target(scope)
            path, method = target.path, scope["method"]
            if path == "/health" and method in ("GET", "HEAD"):
                await self._health(send)
            elif path == "/load" and method in ("GET", "HEAD"):
                await _send_json(send, 200, self.poller.load())
            elif is_proxied(path) and target.error:
                await _send_error(send, target.error, f"{method} {scope['path']}: {target.message}")
            elif is_proxied(path):
                await self._proxy(scope, target.raw, receive, send)
            else:
                await _send_error(send, 404, not_a_route(method, path))
        elif scope["type"] == "websocket":
            await refuse_websocket(scope, receive, send)

    async def _health(self, send: Send) -> None:
        usable = self.poller.num_usable()
        status = 200 if usable and not self.draining else 503
        body = {"status": "ok" if status == 200 else ("draining" if self.draining else "no usable endpoint"),
                "num_usable": usable, "endpoints": self.poller.statistics()}
        await _send_json(send, status, body)

    async def _proxy(self, scope: Scope, target: bytes, receive: Receive, send: Send) -> None:
        body = RequestBody(receive, max_bytes=self.max_body_bytes, replay_bytes=self.replay_body_bytes,
                           content_length=_content_length(scope), idle_timeout_s=self.body_idle_timeout_s)
        try:
            await body.read_replayable()
        except BodyTooLarge:
            await self._refuse_too_large(body, send)
            return
        except ClientGone:  # the client left before its body arrived
            return
        except ClientTooSlow:
            await self._refuse_too_slow(send)
            return
        if self.draining:
            await _answer_error(body, send, 503, "the router is shutting down")
            return
        exchange = _Exchange(target)
        send = _tracked(send, exchange)
        failures: list[str] | None = None  # stays None when the client leaves first (the watcher cancels)
        async with anyio.create_task_group() as tg:
            self._exchanges.add(tg.cancel_scope)
            try:
                tg.start_soon(_watch_disconnect, receive, body, tg.cancel_scope, exchange)
                failures = await self._forward_to_best(scope, body, send, exchange)
                tg.cancel_scope.cancel()
            finally:
                self._exchanges.discard(tg.cancel_scope)
        if exchange.too_large:
            await self._refuse_too_large(body, send)
        elif exchange.too_slow:
            await self._refuse_too_slow(send)
        elif failures is not None and not exchange.client_gone:
            tried = "; ".join(failures) or "no endpoint is usable: " + _endpoint_states(self.poller)
            await _answer_error(body, send, 503, f"no endpoint can take the request ({tried})")

    async def _refuse_too_large(self, body: RequestBody, send: Send) -> None:
        await _answer_error(body, send, 413, f"the request body is larger than the router's limit of "
                            f"{self.max_body_bytes} bytes (--max-request-body-bytes)")

    async def _refuse_too_slow(self, send: Send) -> None:
        """A 408 at once (the client stalled: there is nothing to drain); the connection closes after it."""
        await _send_error(send, 408, f"the client sent no part of its request body for {self.body_idle_timeout_s:g} s")

    async def _forward_to_best(self, scope: Scope, body: RequestBody, send: Send,
                               exchange: _Exchange) -> list[str] | None:
        """Forward to the best endpoint, then the next when one cannot be connected to (or drains) and the body
        can be sent again. None once an answer (or the client's leaving) ended the exchange, else what failed on
        each endpoint tried."""
        tried: set[int] = set()
        failures: list[str] = []
        resent = False  # a request abandoned on a silent endpoint goes to one more endpoint, once
        while order := [i for i in self.poller.candidates() if i not in tried]:
            i = order[0]
            tried.add(i)
            ep = self.poller.endpoints[i]
            ep.request_started()
            attempt = Attempt(anyio.current_time())
            try:
                error = await self._forward_watched(i, scope, body, send, exchange, attempt)
            finally:
                ep.request_finished()
            if attempt.abandoned:
                silent = (f"{ep.url} stopped answering (a GET /load got no answer within "
                          f"{self.poller.poll_timeout_s:g} s, --poll-timeout-s) and the request was abandoned there")
                if attempt.answered or resent or not body.replayable:
                    await _end_abandoned(body, send, attempt, silent, resent)
                    return None
                log.warning("%s before it answered; sending the request to the next endpoint", silent)
                failures.append(silent)
                resent = True
                continue
            if error is None:
                return None
            ep.mark_down(error)
            failures.append(f"{ep.url}: {error}")
            if not body.replayable:
                log.warning("endpoint %s marked down: %s; the request's body (over %d bytes, streamed to it) "
                            "cannot be sent to another endpoint", ep.url, error, self.replay_body_bytes)
                failures.append(f"the request body was larger than {self.replay_body_bytes} bytes "
                                "(--replay-buffer-bytes) and streamed to it, so it cannot be sent to another "
                                "endpoint; send the request again")
                return failures
            log.warning("endpoint %s marked down: %s; trying the next one", ep.url, error)
        return failures

    async def _forward_watched(self, i: int, scope: Scope, body: RequestBody, send: Send, exchange: _Exchange,
                               attempt: Attempt) -> str | None:
        """:meth:`_forward` to endpoint ``i``, cancelled when the endpoint goes silent (``attempt.abandoned``)."""
        with SilenceWatch(self.poller, i, attempt):
            return await self._forward(self.poller.endpoints[i].url, scope, body, send, exchange, attempt)
        return None  # abandoned: the watch cancelled it

    async def _forward(self, base: str, scope: Scope, body: RequestBody, send: Send,
                       exchange: _Exchange, attempt: Attempt) -> str | None:
        """Send the request to ``base``; None once the exchange ended, else why the endpoint did not take it.
        ``attempt`` follows what the endpoint sent and what the client got."""
        url = httpx.URL(base).copy_with(raw_path=exchange.target)
        content = body.content()
        streamed_length = None
        if not isinstance(content, bytes) and body.content_length is not None:
            streamed_length = str(body.content_length).encode()
        request = httpx.Request(scope["method"], url, content=content,
                                headers=upstream_headers(scope, streamed_length),
                                extensions={"timeout": self.timeout.as_dict()})
        try:
            response = await self.http.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent
            return error_text(exc)
        except BodyTooLarge:  # while it streamed: the endpoint sees the request cut off
            exchange.too_large = True
            return None
        except ClientGone:
            exchange.client_gone = True
            return None
        except ClientTooSlow:  # while it streamed: the endpoint sees the request cut off
            exchange.too_slow = True
            return None
        except httpx.TransportError as exc:  # sent (perhaps in part): another endpoint might run it twice
            why = error_text(exc)
            log.warning("endpoint %s failed before answering %s %s: %s", base, scope["method"], scope["path"], why)
            await _answer_error(body, send, 502, f"the endpoint {base} failed before answering ({why}); the request "
                                "is not sent again, as it may have run there")
            return None
        attempt.heard()
        try:
            read = response.status_code == 503  # (an error's JSON: read whole, to tell a drain from the rest)
            if read and await _is_draining(response):  # it did not look at the request
                return f"draining (503: {DRAINING_MESSAGE})"
            body.release()  # this answer is the one: the watcher may read the client's side now
            attempt.answered, attempt.sse = True, is_event_stream(response.headers.raw)
            attempt.done = read  # (read whole: nothing left to wait for)
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": forwarded_headers(response.headers.raw, NOT_RETURNED)})
            if read:
                await send({"type": "http.response.body", "body": response.content, "more_body": False})
                return None
            try:
                async for chunk in response.aiter_raw():
                    attempt.heard()
                    attempt.at_event_boundary = False  # until the client has it whole
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    attempt.at_event_boundary = ends_an_event(chunk)
            except httpx.TransportError as exc:  # the endpoint went away mid-answer (killed, reset)
                why = error_text(exc)
                log.warning("endpoint %s failed while answering %s %s: %s", base, scope["method"],
                            scope["path"], why)
                attempt.done = True
                if attempt.can_end_with_event:  # as asyncdp serve ends a stream that fails
                    message = (f"the endpoint {base} failed mid-answer ({why}) after the stream started; send the "
                               "request again")
                    await send({"type": "http.response.body", "body": stream_error_end(message, FAILED_STATUS),
                                "more_body": False})
                return None  # else no end of body: Hypercorn closes the connection, the response reads as cut off
            attempt.done = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_UPSTREAM_S):
                await response.aclose()
        return None


async def _is_draining(response: httpx.Response) -> bool:
    """Whether a 503 is an endpoint's drain gate (``asyncdp serve`` stopping answers every new request so, before
    it reads it): another endpoint can take the request at no risk of running it twice. Reads the body."""
    try:
        await response.aread()
        return bool(orjson.loads(response.content)["error"]["message"] == DRAINING_MESSAGE)
    except (httpx.TransportError, orjson.JSONDecodeError, KeyError, TypeError):
        return False


async def _end_abandoned(body: RequestBody, send: Send, attempt: Attempt, silent: str, resent: bool) -> None:
    """End a request abandoned on a silent endpoint that cannot go to another one (:mod:`.silence`): a 504 when the
    client got nothing yet, an error event when a stream of events started, else the response cut off."""
    log.warning("%s%s", silent, "; the client's response ends here" if attempt.answered else "")
    if attempt.can_end_with_event:
        message = f"the endpoint {silent} after the stream started; send the request again"
        await send({"type": "http.response.body", "body": stream_error_end(message), "more_body": False})
    elif not attempt.answered:
        why = ("it was sent to another endpoint once already" if resent else
               "its body was streamed to it, so it cannot be sent to another endpoint")
        await _answer_error(body, send, SILENT_STATUS, f"the endpoint {silent}; {why}; send the request again")


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` (Hypercorn checked it), or None (chunked, or none)."""
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _watch_disconnect(receive: Receive, body: RequestBody, scope: anyio.CancelScope,
                            exchange: _Exchange) -> None:
    """Cancel the exchange when the client disconnects. Reads the client's side once nothing else does: the body
    is in, or the endpoint answered without reading all of it (the rest is discarded)."""
    await body.wait_released()
    while (message := await receive())["type"] != "http.disconnect":
        body.complete = not message.get("more_body", False)
    if not exchange.responded:  # else the server closes the connection (or readies it for the next request)
        exchange.client_gone = True
        scope.cancel()


def _tracked(send: Send, exchange: _Exchange) -> Send:
    """``send`` that sets ``exchange.responded`` before it hands over the answer's last body event. Hypercorn ends
    the response inside that ``send`` (closing the connection, or starting its idle timer) and delivers the
    ``http.disconnect`` that says so before it returns (on trio): the watcher must not cancel that end."""

    async def tracked(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            exchange.responded = True
        await send(message)

    return tracked


def _endpoint_states(poller: Poller) -> str:
    return ", ".join(f"{s['url']} ({s['error'] or 'no rank up or stale'})" for s in poller.statistics())


async def _answer_error(body: RequestBody, send: Send, status: int, message: str) -> None:
    """A router-made error, once the rest of the body was read and discarded (see the module docstring)."""
    if not body.complete:
        await body.drain(BODY_DRAIN_S)
    await _send_error(send, status, message)


async def _send_json(send: Send, status: int, body: Any) -> None:
    data = orjson.dumps(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data, "more_body": False})


async def _send_error(send: Send, status: int, message: str) -> None:
    await _send_json(send, status, error_body(status, message))
