"""A rank's grammar compilations: a structured-output request waits for its grammar without stalling the rank
(vLLM's WAITING_FOR_FSM).

Theory of operation. :class:`GrammarCompiles` belongs to one rank's intake. A structured-output request whose
grammar is not compiled yet is admitted at once (owned by its client, counted as waiting in the load reports) but
queued unscheduled (``EngineCore.add_request(compile_grammar=False)``); :meth:`GrammarCompiles.start` compiles
its grammar (``GrammarMatchers.prepare``: tens of ms for a small JSON schema, 0.65 s for 200 tools' schemas, longer
while the grammar library's tokenizer is still built by ``asyncdp.engine.grammar_warm_up``) in a worker thread,
one compilation at a time per rank (:data:`COMPILE_THREADS`; the others queue), in a child task of the rank's task
group, and posts :class:`~asyncdp.engine.rank_links.GrammarCompiled` to the rank's inbox. Meanwhile the busy loop
steps the rank's other requests and handles its inbox; only the loop touches the core, so the request joins the
scheduler's queue (``EngineCore.grammar_compiled``) when the loop takes that item, between steps.

Invariants. The compilation takes neither the step limiter nor the execution thread: it issues no collective, so
a MoE group's collectives stay in the same order on every rank. A MoE request's wave stamp applies once it is
compiled (``LockstepLoop.on_add_request``), as if it arrived then: until then it is no wave work
(``num_unfinished_for_sync``), so the group neither dummy-steps for it nor syncs without it, and an idle group is
woken for it when it is ready. A grammar that does not compile answers its request ``invalid_request`` (400), that
request only. An abort (its client gone) while it compiles aborts it like any queued request (one ``abort`` output,
nothing else): the compilation's result is then dropped, and so is an earlier compilation's for a request id used
again (``ticket``). A rank stepping inline (virtual time) compiles in place instead, with no thread.

Shutdown. A compiling request keeps a draining rank until it finished or the drain deadline aborted it; the rank's
task group cancels what still compiles when the rank ends (the worker thread is abandoned, as a cancelled step's is).
"""

from __future__ import annotations

import itertools
import logging
from contextlib import suppress
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp.engine.rank_links import GrammarCompiled, InboxItem
from asyncdp.errors import InvalidRequestError

if TYPE_CHECKING:
    from asyncdp.engine.rank import EngineRank
    from asyncdp.engine.structured import GrammarMatchers

log = logging.getLogger("asyncdp.engine.rank")  # the role's one log name

COMPILE_THREADS = 1  # a rank's grammar compilations at a time, each in a worker thread (queued beyond)


class GrammarCompiles:
    def __init__(self, rank: EngineRank) -> None:
        self.rank = rank
        self._tickets = itertools.count()
        self.compiling: dict[str, int] = {}  # request id -> the ticket of the compilation it waits for
        self._tg: anyio.abc.TaskGroup | None = None
        self._inbox: anyio.abc.ObjectSendStream[InboxItem] | None = None
        self._limiter: anyio.CapacityLimiter | None = None

    def open(self, tg: anyio.abc.TaskGroup, inbox: anyio.abc.ObjectSendStream[InboxItem]) -> None:
        """Compile in ``tg`` (the rank's) from now on, posting the results to ``inbox``."""
        self._tg, self._inbox = tg, inbox
        # One compilation at a time: the grammar library holds the GIL for most of one, so more threads would
        # not compile faster, only take more turns of the GIL from the steps (anyio's default limiter allows 40).
        self._limiter = anyio.CapacityLimiter(COMPILE_THREADS)

    def start(self, msg: m.AddRequest) -> None:
        """Compile the grammar of ``msg``, admitted and waiting for it, in a worker thread."""
        if self._tg is None:
            raise RuntimeError("GrammarCompiles.start before open: the rank is not running")
        ticket = next(self._tickets)
        self.compiling[msg.request_id] = ticket
        matchers = self.rank.core.grammar_matchers()  # (made by add_request: the core itself stays the loop's)
        self._tg.start_soon(self._compile, matchers, msg, ticket, name=f"grammar of {msg.request_id}")

    async def _compile(self, matchers: GrammarMatchers, msg: m.AddRequest, ticket: int) -> None:
        structured = msg.sampling_params.structured
        if structured is None or self._inbox is None:
            raise RuntimeError(f"request {msg.request_id} has no grammar to compile")
        error: InvalidRequestError | None = None
        try:  # the rank's compile limiter, not the step limiter: the steps go on meanwhile
            await anyio.to_thread.run_sync(matchers.prepare, structured, limiter=self._limiter,
                                           abandon_on_cancel=True)
        except InvalidRequestError as exc:
            error = exc
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):  # the rank is ending
            await self._inbox.send(GrammarCompiled(msg, ticket, error))

    async def on_compiled(self, item: GrammarCompiled) -> None:
        """On the busy loop, between steps: queue the request for a step (and apply its wave stamp), or answer
        it ``invalid_request``; nothing for a request no longer waiting (aborted)."""
        rank, msg = self.rank, item.msg
        rid = msg.request_id
        if self.compiling.get(rid) != item.ticket:
            return  # a compilation for an earlier request of that id, aborted
        del self.compiling[rid]
        if item.error is not None:
            if rid in rank.core.scheduler.grammar_waiting and rank.state.owners.pop(rid, None) is not None:
                rank.core.abort_requests([rid])  # freed by the next step; its abort goes nowhere (no owner now)
                rank.state.unanswered.discard(rid)
                rank.reports.reject(msg, str(item.error), "invalid_request", field=item.error.field)
            return
        queued = rank.core.grammar_compiled(rid)
        if queued is False:  # its template was evicted meanwhile (many grammars at once): compile it again
            log.debug("rank %d: compiling the grammar of %s again", rank.cfg.dp_rank, rid)
            self.start(msg)
        elif queued and rank.lockstep is not None:
            await rank.lockstep.on_add_request(msg)
