"""A rank's utility calls: ``pause``/``resume``/``is_paused``/``reset_prefix_cache``/``stats``/``ping`` from a client
(spec §8.6).

Theory of operation. :class:`UtilityCalls` belongs to one :class:`~asyncdp.engine.rank.EngineRank` and runs on
its busy loop (never concurrently with a step). Every ``UtilityCall`` gets exactly one ``UtilityResult``, posted
to the calling client only (``UtilityCall.client_index``). ``pause`` answers only once the pause is complete
(dense: the rank is idle; MoE: the group reached consensus and stopped): the call waits in ``pending`` and
:meth:`complete_pauses`, called by the loops after every iteration, answers it. A ``resume`` before that answers
the pending pauses with a :class:`~asyncdp.errors.PauseError`. ``reset_prefix_cache`` is vLLM's (refused with a
:class:`~asyncdp.errors.PrefixCacheBusyError` while a request holds KV blocks, unless ``reset_running_requests``); a
reset is told to every client (``PrefixCacheReset``; the caller's comes before its answer) and then to the
coordinator, so that no router keeps sending requests here for prefixes the rank dropped. A rank that is shutting
down refuses every call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from asyncdp import messages as m
from asyncdp.errors import AsyncDPError, PrefixCacheBusyError

if TYPE_CHECKING:
    from asyncdp.engine.core import EngineCore
    from asyncdp.engine.lockstep_loop import LockstepLoop
    from asyncdp.engine.rank_links import RankLinks


class _RankState(Protocol):
    shutting_down: bool


class _RankConfig(Protocol):
    @property
    def dp_rank(self) -> int: ...


class UtilityHost(Protocol):
    """What the utility calls use of their rank (an :class:`~asyncdp.engine.rank.EngineRank`)."""

    @property
    def cfg(self) -> _RankConfig: ...
    @property
    def core(self) -> EngineCore: ...
    @property
    def state(self) -> _RankState: ...
    @property
    def links(self) -> RankLinks: ...
    @property
    def lockstep(self) -> LockstepLoop | None: ...
    @property
    def coordinator(self) -> object | None: ...
    async def send_coordinator(self, msg: m.Message) -> None: ...


class UtilityCalls:
    def __init__(self, rank: UtilityHost) -> None:
        self.rank = rank
        self.pending: list[m.UtilityCall] = []  # pause calls waiting for the pause to complete

    async def handle(self, call: m.UtilityCall) -> None:
        rank = self.rank
        try:
            if rank.state.shutting_down:
                raise AsyncDPError("server shutting down")
            if call.method == "pause":
                await self._pause(call.kwargs.get("mode", call.args[0] if call.args else "abort"))
                self.pending.append(call)  # answered by complete_pauses() once the pause is done
                self.complete_pauses()
                return
            if call.method == "resume":
                value = await self._resume()
            else:
                value = self._run(call.method, *call.args, **call.kwargs)
            result = m.UtilityResult(call_id=call.call_id, ok=True, value=value)
        except (AsyncDPError, TypeError, ValueError) as exc:
            kind = next((k for k, error in m.ERROR_KINDS.items() if isinstance(exc, error)), None)
            result = m.UtilityResult(call_id=call.call_id, ok=False, error=str(exc), error_kind=kind)
        rank.links.post_nowait(call.client_index, result)
        if result.ok and call.method == "reset_prefix_cache" and rank.coordinator is not None:
            # its prefix directory forgets the prefixes placed here (outside the try: a lost link may end the rank)
            await rank.send_coordinator(m.PrefixCacheReset(dp_rank=rank.cfg.dp_rank))

    async def _pause(self, mode: str) -> None:
        self.rank.core.pause(mode)  # type: ignore[arg-type]  # the scheduler validates the mode
        if self.rank.lockstep is not None:
            await self.rank.lockstep.begin_pause(mode)

    def pause_done(self) -> bool:
        rank = self.rank
        if rank.lockstep is not None:
            return rank.lockstep.pause_done()
        return rank.core.is_paused() and not rank.core.has_steppable_work()

    def complete_pauses(self) -> None:
        """Answer the pending pause calls once the pause is complete (spec §8.6 step 3)."""
        if self.pending and self.pause_done():
            calls, self.pending = self.pending, []
            for call in calls:
                self.rank.links.post_nowait(call.client_index,
                                            m.UtilityResult(call_id=call.call_id, ok=True, value=True))

    async def _resume(self) -> bool:
        rank = self.rank
        if rank.lockstep is not None:
            await rank.lockstep.resume()
            return True
        rank.core.resume()
        calls, self.pending = self.pending, []
        for call in calls:
            rank.links.post_nowait(call.client_index, m.UtilityResult(
                call_id=call.call_id, ok=False, error="resumed before the pause completed", error_kind=m.PAUSE_ERROR))
        return True

    def _reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        rank = self.rank
        if not rank.core.reset_prefix_cache(bool(reset_running_requests)):
            bm = rank.core.block_manager
            raise PrefixCacheBusyError(f"engine rank {rank.cfg.dp_rank}: {bm.num_usable_blocks - bm.num_free_blocks} "
                                       f"KV blocks are in use by requests in flight")
        notice = m.PrefixCacheReset(dp_rank=rank.cfg.dp_rank)
        for client in rank.links.clients:  # (the caller's comes before its answer: the same outbox)
            rank.links.post_nowait(client, notice)
        return True

    def _run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        core = self.rank.core
        if method == "is_paused":
            return core.is_paused()
        if method == "reset_prefix_cache":
            return self._reset_prefix_cache(*args, **kwargs)
        if method == "stats":
            s = core.stats()
            return {"num_running": s.num_running, "num_waiting": s.num_waiting, "kv_cache_usage": s.kv_cache_usage}
        if method == "ping":
            return self.rank.cfg.dp_rank
        raise ValueError(f"unknown utility method {method!r}")
