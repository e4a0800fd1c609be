"""A rank's intake: what its inbox brings (client and coordinator messages, a client gone) and whether a new
request is admitted (spec §8.1, §8.4, §8.7).

Theory of operation. :class:`RankIntake` belongs to one :class:`~asyncdp.engine.rank.EngineRank` and runs on its
busy loop (never concurrently with a step). :meth:`RankIntake.handle` dispatches one typed inbox item with
``match``; an unknown item is a :class:`~asyncdp.errors.ProtocolError`. An ``AddRequest`` is refused before it
reaches the core when the rank is shutting down or abandons everything (its drain deadline passed, its MoE group
ended): one finished ``abort`` with ``error_type="unavailable"`` naming the rank, which the API answers with 503.
A request the core refuses (:class:`~asyncdp.errors.InvalidRequestError`) is answered ``invalid_request`` (400).
A structured-output request whose grammar is not compiled yet is admitted but waits unscheduled while
:mod:`asyncdp.engine.rank_grammar` compiles it in a worker thread, without the step limiter: the rank's other
requests step meanwhile and the event loop keeps sending heartbeats; a rank stepping inline (virtual time) compiles
it in place. The grammar library's tokenizer is built in a background thread once the rank is ready
(``asyncdp.engine.grammar_warm_up``); a grammar compiled before that ended waits for it in its worker thread.
An admitted request is owned by its client (``RankState.owners``) and, in a MoE group, applies its wave stamp
(a constrained one once its grammar compiled).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from asyncdp import messages as m
from asyncdp.engine.rank_grammar import GrammarCompiles
from asyncdp.engine.rank_links import (
    ClientGone,
    ClientMessage,
    CoordinatorMessage,
    GrammarCompiled,
    InboxItem,
    Wake,
)
from asyncdp.errors import InvalidRequestError, ProtocolError

if TYPE_CHECKING:
    from asyncdp.engine.rank import EngineRank

log = logging.getLogger("asyncdp.engine.rank")  # the role's one log name


class RankIntake:
    def __init__(self, rank: EngineRank) -> None:
        self.rank = rank
        self.grammars = GrammarCompiles(rank)

    async def handle(self, item: InboxItem) -> None:
        rank = self.rank
        match item:
            case ClientMessage(msg=m.AddRequest() as msg):
                await self._add_request(msg)
            case ClientMessage(msg=m.AbortRequests() as msg):
                ids = [rid for rid in msg.request_ids if rid in rank.state.owners]
                if ids:
                    rank.core.abort_requests(ids)
            case ClientMessage(msg=m.UtilityCall() as msg):
                await rank.utility.handle(msg)
            case CoordinatorMessage(msg=m.StartWave() as msg):
                if rank.lockstep is not None:
                    rank.lockstep.on_start_wave(msg)
            case GrammarCompiled() as compiled:
                await self.grammars.on_compiled(compiled)
            case CoordinatorMessage(msg=m.CoordinatorReady()) | Wake():
                pass
            case ClientGone(client_index=ci):
                self._abort_client(ci)
            case ClientMessage(msg=msg) | CoordinatorMessage(msg=msg):
                log.warning("rank %d: dropping unexpected %s", rank.cfg.dp_rank, type(msg).__name__)
            case _:
                raise ProtocolError(f"rank {rank.cfg.dp_rank}: unknown inbox item {item!r}")

    def _abort_client(self, client_index: int) -> None:
        rank = self.rank
        ids = [rid for rid, ci in rank.state.owners.items() if ci == client_index]
        if ids:
            log.info("rank %d: aborting %d request(s) of client %d, whose link ended", rank.cfg.dp_rank,
                     len(ids), client_index)
            rank.core.abort_requests(ids)

    async def _add_request(self, msg: m.AddRequest) -> None:
        rank = self.rank
        # "unavailable": a 503 that names this rank, not the API server, which may well be serving on
        refusal = f"engine rank {rank.cfg.dp_rank} is shutting down" if rank.state.shutting_down else \
            rank.state.abandon_reason
        if refusal is not None:
            rank.reports.reject(msg, refusal, "unavailable")
            return
        try:  # the API server validated the params (asyncdp.api.params) before it sent them: not again here
            rank.core.add_request(msg.request_id, msg.prompt_token_ids, msg.sampling_params,
                                  arrival_time=msg.arrival_time, client_index=msg.client_index, validated=True,
                                  compile_grammar=rank.inline_step)
        except InvalidRequestError as exc:
            rank.reports.reject(msg, str(exc), "invalid_request", field=exc.field)
            return
        rank.state.owners[msg.request_id] = msg.client_index
        rank.state.unanswered.add(msg.request_id)
        if msg.sampling_params.structured is not None and msg.request_id in rank.core.scheduler.grammar_waiting:
            self.grammars.start(msg)  # (its wave stamp applies once compiled: GrammarCompiles.on_compiled)
        elif rank.lockstep is not None:
            await rank.lockstep.on_add_request(msg)
