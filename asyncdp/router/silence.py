"""Requests in flight to an endpoint that stopped answering: abandoned within seconds, not left to hang.

Theory of operation. An endpoint can stop answering with its connections still open: its process is stopped
(SIGSTOP, a debugger, swapped out) or its host no longer answers while its TCP connections stay up. The poller sees
it first: a ``GET /load`` that times out (``--poll-timeout-s``) takes the endpoint out of the candidates and calls
the :class:`SilenceWatch` of every request there (:meth:`~asyncdp.router.poller.Poller.listen_unanswered`, with
the time that poll started), in the poller's task: one per endpoint, not one per request. A request is abandoned at the second poll in a row that goes unanswered (no poll
of that endpoint answered in between) when it heard nothing from the endpoint since the first one started (no
answer's start, no chunk of its body): one stall of an event loop for about ``--poll-timeout-s`` (a long
collection, a huge prompt tokenized) must not send a live endpoint's requests elsewhere, where they would run
twice. Its exchange is cancelled, which closes its upstream connection, so the endpoint aborts the request if it
ever runs again. A request that heard something since is alive, and its count starts over. So a request there
ends at most about three ``--poll-timeout-s`` (plus two ``--poll-interval-s``) after the endpoint froze; a slow but
live stream is not cut.

What follows depends on what the client already got (:class:`Attempt`): nothing, and the proxy sends the request
to the next best endpoint, once (:mod:`asyncdp.router.proxy`); the start of a stream of server-sent events, cut at
an event boundary, and it ends with an error event and ``data: [DONE]``, as an endpoint ends a stream that fails
(:func:`stream_error_end`); anything else, and the response ends without its end. An endpoint that dies
mid-answer (:mod:`asyncdp.router.proxy`) ends the same way, its error event with :data:`FAILED_STATUS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio

from asyncdp.api.errors import error_body
from asyncdp.api.sse import DONE, sse
from asyncdp.router.poller import Poller

SILENT_STATUS = 504  # what an abandoned request's error says: the endpoint did not answer in time
FAILED_STATUS = 502  # what a stream's error event says when its endpoint failed mid-answer (killed, reset)


@dataclass
class Attempt:
    """One request's forwarding to one endpoint, as its silence watch and its proxy see it."""

    heard_s: float  # when the endpoint last sent something for it (at first: when the request was sent)
    answered: bool = False  # the client got the response's start: the request can no longer go elsewhere
    sse: bool = False  # the response is an uncompressed text/event-stream
    at_event_boundary: bool = True  # what the client got of its body ends between two events
    done: bool = False  # the response's end is being sent: too late to abandon it
    abandoned: bool = False

    def heard(self) -> None:
        """The endpoint sent something for the request."""
        self.heard_s = anyio.current_time()

    @property
    def can_end_with_event(self) -> bool:
        return self.answered and self.sse and self.at_event_boundary


class SilenceWatch:
    """One request's forwarding to endpoint ``i``, abandoned when the endpoint goes silent: ``with
    SilenceWatch(poller, i, attempt):`` around it is a cancel scope, cancelled (and ``attempt.abandoned`` set) once
    two ``GET /load`` in a row there went unanswered and the request heard nothing from the endpoint since the first
    started. The poller's task makes the check (:meth:`~asyncdp.router.poller.Poller.listen_unanswered`) when a
    poll times out: a request costs a listener added and removed, not a watcher task of its own."""

    __slots__ = ("_listener", "_poller", "_scope", "_silent_since_s", "attempt", "i")

    def __init__(self, poller: Poller, i: int, attempt: Attempt) -> None:
        self._poller, self.i, self.attempt = poller, i, attempt
        self._scope = anyio.CancelScope()
        self._silent_since_s: float | None = None  # the start of the first of the unanswered polls in a row
        self._listener = self.unanswered

    def __enter__(self) -> anyio.CancelScope:
        scope = self._scope.__enter__()
        self._poller.listen_unanswered(self.i, self._listener)
        return scope

    def __exit__(self, *exc_info: Any) -> bool:
        self._poller.unlisten_unanswered(self.i, self._listener)
        return bool(self._scope.__exit__(*exc_info))

    def unanswered(self, poll_started_s: float) -> None:
        """A poll of the endpoint that started at ``poll_started_s`` timed out."""
        attempt = self.attempt
        if attempt.heard_s > poll_started_s or attempt.done:
            self._silent_since_s = None  # alive: it heard from the endpoint while that poll went unanswered
        elif (self._silent_since_s is None or self._poller.answered_since(self.i, self._silent_since_s)
              or attempt.heard_s > self._silent_since_s):
            self._silent_since_s = poll_started_s  # the first of a row: a single stall does not abandon a request
        elif not attempt.abandoned:
            attempt.abandoned = True
            self._scope.cancel()


def ends_an_event(chunk: bytes) -> bool:
    """Whether a chunk of a stream of events ends between two events (a blank line)."""
    return chunk.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))


def is_event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a response with these (raw) headers is server-sent events the router can add an event to."""
    kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    encoded = any(k.lower() == b"content-encoding" and v.strip().lower() != b"identity" for k, v in headers)
    return kind.split(b";")[0].strip().lower() == b"text/event-stream" and not encoded


def stream_error_end(message: str, status: int = SILENT_STATUS) -> bytes:
    """The end of a stream the router cuts short: an error event in OpenAI's shape, then ``data: [DONE]``."""
    return sse(error_body(status, message)) + DONE
