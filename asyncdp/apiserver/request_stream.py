"""One request's stream of output deltas inside the DP client, from ``AddRequest`` to its last output.

Theory of operation. The engine-link reader posts each ``RequestOutput`` (``post``) or an error (``fail``); the
``generate()`` generator waits on ``changed`` and yields what was posted. ``done`` is set once the engine
reported the request finished or it failed. The stream also keeps the timings the request metrics need (first and
last token times). Which rank owns the request is not kept here: the load balancer
(:class:`asyncdp.dp.balance.LoadBalancer`) is the one owner of request -> rank.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import anyio

from asyncdp import messages as m
from asyncdp.api.engine_client import SequenceGroup
from asyncdp.dp.balance import LoadBalancer
from asyncdp.errors import InvalidRequestError, ShuttingDownError, UnavailableError


@dataclass(slots=True)
class RequestStream:
    request_id: str
    arrival: float
    num_prompt_tokens: int
    pending: deque[m.RequestOutput] = field(default_factory=deque)
    changed: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)  # finished, or failed
    client_abort: bool = False  # this client asked the engine to abort it (the caller left early)
    error: Exception | None = None
    finished: bool = False
    finish_reason: str | None = None  # of the last output, once the engine finished the request
    first_token_at: float | None = None
    last_token_at: float | None = None
    num_generated: int = 0
    queue_s: float | None = None  # the engine's queue time (seconds waiting before first scheduled)
    max_tokens: int | None = None  # the request's limit, as vLLM resolves it (None: up to max_model_len)
    group: SequenceGroup | None = None  # the sequences of its prompt, when it is one of several (n, best_of)

    def post(self, out: m.RequestOutput, now: float) -> None:
        self.note(out, now)
        self.pending.append(out)
        self.changed.set()

    def note(self, out: m.RequestOutput, now: float) -> None:
        """Keep what the metrics need of an output (its tokens, timings and finish reason), without yielding it."""
        n = len(out.new_token_ids)
        if n:
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now
            self.num_generated += n
        if out.queue_time_s is not None:
            self.queue_s = out.queue_time_s
        if out.finished:
            self.finish_reason = out.finish_reason

    @property
    def completed(self) -> bool:
        """The engine finished it with an answer: it neither failed nor ended with ``abort`` (by the caller, an
        operator's pause, a drain deadline). At shutdown, only these count as drained."""
        return self.finished and self.error is None and self.finish_reason != "abort"

    def fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        self.changed.set()
        self.done.set()


def rejection(out: m.RequestOutput) -> Exception:
    """The error for an output the engine refused or failed (``error_type`` set): a status, never an empty or
    cut-short answer. ``invalid_request`` (refused at admission, or its grammar failed mid-generation) is the
    request's fault: a 400 naming ``error_field``."""
    reason = out.error or "the engine refused the request"
    if out.error_type == "invalid_request":
        return InvalidRequestError(reason, field=out.error_field)
    if out.error_type == "unavailable":
        return ShuttingDownError(reason)
    return UnavailableError(reason)


def apply_outputs(requests: dict[str, RequestStream], msg: m.EngineOutputs, now: float,
                  abandoned: str | None) -> list[RequestStream]:
    """Post one ``EngineOutputs`` frame to its streams; returns the streams it finished.

    A refused request fails with its rejection; with ``abandoned`` (the shutdown reason) an ``abort`` this client
    did not ask for (a rank's drain deadline, a teardown) fails with ``ShuttingDownError`` instead of ending.
    A rank that abandons a request at its own drain deadline while this client is not shutting down (the rank
    alone was stopped, or its node's launcher died) marks it ``abandoned``: a ``ShuttingDownError`` naming the
    rank, never a normal end."""
    for out in msg.outputs:
        req = requests.get(out.request_id)
        if req is None:
            continue
        if out.error_type == "abandoned" and not req.client_abort:
            req.fail(ShuttingDownError(f"the request was abandoned: {abandoned}" if abandoned is not None
                                       else out.error or f"engine rank {msg.dp_rank} stopped"))
        elif out.error_type == "abandoned":
            req.post(out, now)  # the caller asked for the abort and has left: a normal end
        elif out.error_type is not None:  # refused or failed by the engine: an error status, not an answer
            req.note(out, now)  # "error": the engine ran it and failed it, which the metrics count (as vLLM)
            req.fail(rejection(out))
        elif out.finish_reason == "abort" and abandoned is not None and not req.client_abort:
            req.fail(ShuttingDownError(f"the request was abandoned: {abandoned}"))
        else:
            req.post(out, now)
    finished = []
    for rid in msg.finished_request_ids:
        req = requests.get(rid)
        if req is not None:
            req.finished = True
            req.done.set()
            finished.append(req)
    return finished


def tell_policy(lb: LoadBalancer, requests: dict[str, RequestStream], msg: m.EngineOutputs) -> None:
    """Report first tokens and token counts to the balancer, for the policies that model them (the peers'),
    before :func:`apply_outputs` posts the frame (which sets ``first_token_at``)."""
    now: int | None = None
    for out in msg.outputs:
        req = requests.get(out.request_id)
        if req is None or not out.new_token_ids:
            continue
        now = now_us() if now is None else now  # read the clock only for a frame that carries tokens
        if req.first_token_at is None:
            lb.on_first_token(out.request_id, now)
        lb.on_tokens(out.request_id, len(out.new_token_ids), now)


def now_us() -> int:
    """The policies' clock: the event loop's (virtual under a mock clock), in whole microseconds."""
    return int(anyio.current_time() * 1_000_000)
