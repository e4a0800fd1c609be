"""The engine rank role: one DP rank's busy loop, its links, and the process around it.

Theory of operation
-------------------
A rank owns one :class:`~asyncdp.engine.core.EngineCore`. It receives ``AddRequest``, ``AbortRequests`` and
``UtilityCall`` from every client link and ``StartWave``/``Teardown``/``Heartbeat`` from the coordinator link.
Reader tasks decode frames and post them into one bounded *inbox* stream; the busy loop is the only task that
touches the core. Each step runs ``EngineCore.step()`` on the device's execution thread (one
``CapacityLimiter(1)``) and the completion is posted back into the rank's task group, which sends each output
only to the client that owns the request (``AddRequest.client_index``). The simulated executor steps inline and
sleeps its modelled step time on the anyio clock, so whole clusters run in trio's virtual time.

Stats: when a coordinator exists, the rank sends ``RankStats`` before and after every step if (running,
waiting) changed or KV usage moved by >= 0.01 (spec §8.1).

Shutdown (spec §8.7): ``request_shutdown()`` stops intake; with ``shutdown_timeout_s == 0`` every request is
aborted at once, otherwise the rank drains until the deadline and then aborts the rest; the loop then returns.
A fatal error sends ``EngineDead`` to every client and the coordinator, flushes for up to 5 s and ends the
process with exit code 1 even if the execution thread is stuck (spec §8.8).

Dense ranks run the plain loop (no collectives, no waves). MoE ranks run the lockstep loop of
:mod:`asyncdp.engine.lockstep_loop`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp.config import EngineConfig
from asyncdp.errors import AsyncDPError, InvalidRequestError
from asyncdp.transport import Link

if TYPE_CHECKING:
    from asyncdp.engine.core import EngineCore

log = logging.getLogger(__name__)

INBOX_SIZE = 4096
OUTBOX_SIZE = 1024
EOF_FLUSH_S = 5.0
KV_USAGE_PUBLISH_DELTA = 0.01


@dataclass(frozen=True, slots=True)
class RankConfig:
    dp_rank: int
    dp_size: int
    engine: EngineConfig
    is_moe: bool = False
    external_lb: bool = False
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    shutdown_timeout_s: float = 0.0
    sync_interval: int = 32
    prefill_schedule_interval: int = 1


@dataclass(slots=True)
class _Inbox:
    """Items the readers post to the busy loop."""

    kind: str  # "client" | "coordinator" | "wake"
    msg: Any = None
    client_index: int = -1


@dataclass
class RankState:
    """Observable state of a rank, for tests and /server_info."""

    steps: int = 0
    dummy_steps: int = 0
    waves_completed: int = 0
    shutting_down: bool = False
    dead_reason: str | None = None
    last_stats: tuple[int, int, float] | None = None
    owners: dict[str, int] = field(default_factory=dict)


class EngineRank:
    """The steady-state part of a rank: links are already connected and the core is built."""

    def __init__(
        self,
        cfg: RankConfig,
        core: EngineCore,
        clients: dict[int, Link],
        coordinator: Link | None,
        *,
        inline_step: bool = False,
    ) -> None:
        self.cfg = cfg
        self.core = core
        self.clients = clients
        self.coordinator = coordinator
        self.inline_step = inline_step
        self.state = RankState()
        self._limiter = anyio.CapacityLimiter(1)
        self._inbox_send, self._inbox = anyio.create_memory_object_stream[_Inbox](INBOX_SIZE)
        self._outboxes: dict[int, anyio.abc.ObjectSendStream[m.Message]] = {}
        self._shutdown_deadline: float | None = None
        self._coordinator_seen = 0.0
        self._stats_client = min(clients) if clients else 0

    # ------------------------------------------------------------------ public

    def request_shutdown(self) -> None:
        """Stop intake and start draining (idempotent). Safe to call from any task."""
        if self.state.shutting_down:
            return
        self.state.shutting_down = True
        self._shutdown_deadline = anyio.current_time() + self.cfg.shutdown_timeout_s
        try:
            self._inbox_send.send_nowait(_Inbox("wake"))
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def run(self) -> None:
        """Run until shut down. Raises on a fatal error (after telling every peer)."""
        try:
            async with anyio.create_task_group() as tg:
                for ci, link in self.clients.items():
                    send, recv = anyio.create_memory_object_stream[m.Message](OUTBOX_SIZE)
                    self._outboxes[ci] = send
                    tg.start_soon(self._write_link, link, recv)
                    tg.start_soon(self._read_client, ci, link)
                if self.coordinator is not None:
                    self._coordinator_seen = anyio.current_time()
                    tg.start_soon(self._read_coordinator, self.coordinator)
                    tg.start_soon(self._heartbeat, self.coordinator)
                await self._loop()
                tg.cancel_scope.cancel()
        except BaseException as exc:
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                await self._announce_death(_describe(exc))
            raise
        finally:
            for out in self._outboxes.values():
                out.close()

    # ------------------------------------------------------------------ readers / writers

    async def _read_client(self, client_index: int, link: Link) -> None:
        async for msg in link:
            await self._inbox_send.send(_Inbox("client", msg, client_index))
        if not self.state.shutting_down:
            log.warning("rank %d: client %d closed its link", self.cfg.dp_rank, client_index)

    async def _read_coordinator(self, link: Link) -> None:
        async for msg in link:
            self._coordinator_seen = anyio.current_time()
            if isinstance(msg, m.Heartbeat):
                continue
            await self._inbox_send.send(_Inbox("coordinator", msg))
        if not self.state.shutting_down:
            await self._coordinator_lost("the coordinator closed its link")

    async def _heartbeat(self, link: Link) -> None:
        seq = 0
        while True:
            await anyio.sleep(self.cfg.heartbeat_interval_s)
            seq += 1
            await link.send(m.Heartbeat(sender=f"engine-{self.cfg.dp_rank}", seq=seq))
            silence = anyio.current_time() - self._coordinator_seen
            if silence > self.cfg.heartbeat_timeout_s:
                await self._coordinator_lost(f"no heartbeat from the coordinator for {silence:.1f} s")
                return

    async def _coordinator_lost(self, reason: str) -> None:
        if self.cfg.is_moe and self.cfg.dp_size > 1:
            raise RankTornDown(f"rank {self.cfg.dp_rank}: {reason}")
        log.warning("rank %d: %s; serving on without load reports", self.cfg.dp_rank, reason)
        self.coordinator = None

    @staticmethod
    async def _write_link(link: Link, outbox: anyio.abc.ObjectReceiveStream[m.Message]) -> None:
        async with outbox:
            async for msg in outbox:
                try:
                    await link.send(msg)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    return  # the client is gone; its requests are aborted when its link reader ends

    async def _send_to_client(self, client_index: int, msg: m.Message) -> None:
        out = self._outboxes.get(client_index)
        if out is None:
            log.warning("rank %d: no link to client %d", self.cfg.dp_rank, client_index)
            return
        try:
            await out.send(msg)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    async def _send_coordinator(self, msg: m.Message) -> None:
        if self.coordinator is None:
            return
        try:
            await self.coordinator.send(msg)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await self._coordinator_lost("the coordinator link broke")

    # ------------------------------------------------------------------ the busy loop (dense)

    async def _loop(self) -> None:
        core = self.core
        while True:
            if not core.has_unfinished():
                if self.state.shutting_down:
                    return
                self._handle(await self._inbox.receive())
            await self._drain_inbox()
            if self.state.shutting_down:
                self._apply_shutdown_policy()
            await self._publish_stats()
            if core.has_unfinished():
                await self._step()
                await self._publish_stats()
            else:
                await anyio.lowlevel.checkpoint()

    async def _drain_inbox(self) -> None:
        while True:
            try:
                item = self._inbox.receive_nowait()
            except anyio.WouldBlock:
                return
            self._handle(item)
        await anyio.lowlevel.checkpoint()

    def _apply_shutdown_policy(self) -> None:
        assert self._shutdown_deadline is not None
        if anyio.current_time() >= self._shutdown_deadline and self.core.has_unfinished():
            self.core.abort_requests(list(self.state.owners))

    async def _step(self) -> None:
        core = self.core
        if self.inline_step:
            result = core.step()
            step_s = getattr(core.executor, "last_step_s", 0.0)
            await anyio.sleep(step_s)
        else:
            result = await anyio.to_thread.run_sync(core.step, limiter=self._limiter, abandon_on_cancel=True)
        self.state.steps += 1
        await self._dispatch_outputs(result.outputs)

    async def _dispatch_outputs(self, outputs: list[m.RequestOutput]) -> None:
        per_client: dict[int, tuple[list[m.RequestOutput], list[str]]] = {}
        owners = self.state.owners
        for out in outputs:
            ci = owners.get(out.request_id)
            if ci is None:
                continue
            outs, finished = per_client.setdefault(ci, ([], []))
            outs.append(out)
            if out.finished:
                finished.append(out.request_id)
                del owners[out.request_id]
        stats = self.core.stats()
        stats_to = next(iter(per_client), None)
        now = time.time()
        for ci, (outs, finished) in per_client.items():
            await self._send_to_client(
                ci,
                m.EngineOutputs(
                    dp_rank=self.cfg.dp_rank,
                    outputs=outs,
                    finished_request_ids=finished,
                    scheduler_stats=stats if ci == stats_to else None,
                    timestamp=now,
                ),
            )

    # ------------------------------------------------------------------ message handling

    def _handle(self, item: _Inbox) -> None:
        msg = item.msg
        if item.kind == "wake":
            return
        if isinstance(msg, m.AddRequest):
            self._add_request(msg)
        elif isinstance(msg, m.AbortRequests):
            ids = [rid for rid in msg.request_ids if rid in self.state.owners]
            if ids:
                self.core.abort_requests(ids)
        elif isinstance(msg, m.UtilityCall):
            self._utility(msg)
        elif isinstance(msg, m.Teardown):
            raise RankTornDown(f"rank {self.cfg.dp_rank}: teardown from the coordinator: {msg.reason}")
        elif isinstance(msg, (m.StartWave, m.CoordinatorReady)):
            pass  # dense ranks have no waves
        else:
            log.warning("rank %d: dropping unexpected %s", self.cfg.dp_rank, type(msg).__name__)

    def _add_request(self, msg: m.AddRequest) -> None:
        self.state.owners[msg.request_id] = msg.client_index
        if self.state.shutting_down:
            self._reject(msg, "server shutting down")
            return
        try:
            self.core.add_request(
                msg.request_id,
                msg.prompt_token_ids,
                msg.sampling_params,
                arrival_time=msg.arrival_time,
                client_index=msg.client_index,
            )
        except InvalidRequestError as exc:
            self._reject(msg, str(exc))

    def _reject(self, msg: m.AddRequest, reason: str) -> None:
        log.info("rank %d: rejecting %s: %s", self.cfg.dp_rank, msg.request_id, reason)
        del self.state.owners[msg.request_id]
        out = m.EngineOutputs(
            dp_rank=self.cfg.dp_rank,
            outputs=[m.RequestOutput(request_id=msg.request_id, finished=True, finish_reason="abort")],
            finished_request_ids=[msg.request_id],
            scheduler_stats=None,
            timestamp=time.time(),
        )
        self._post_nowait(msg.client_index, out)

    def _utility(self, call: m.UtilityCall) -> None:
        try:
            if self.state.shutting_down:
                raise AsyncDPError("server shutting down")
            value = self._run_utility(call.method, *call.args, **call.kwargs)
            result = m.UtilityResult(call_id=call.call_id, ok=True, value=value)
        except (AsyncDPError, TypeError, ValueError) as exc:
            result = m.UtilityResult(call_id=call.call_id, ok=False, error=str(exc))
        self._post_nowait(call.client_index, result)

    def _run_utility(self, method: str, *args: Any, **kwargs: Any) -> Any:
        core = self.core
        if method == "pause":
            core.pause(kwargs.get("mode", args[0] if args else "abort"))
            return True
        if method == "resume":
            core.resume()
            return True
        if method == "is_paused":
            return core.is_paused()
        if method == "stats":
            s = core.stats()
            return {"num_running": s.num_running, "num_waiting": s.num_waiting, "kv_cache_usage": s.kv_cache_usage}
        if method == "ping":
            return self.cfg.dp_rank
        raise ValueError(f"unknown utility method {method!r}")

    def _post_nowait(self, client_index: int, msg: m.Message) -> None:
        out = self._outboxes.get(client_index)
        if out is None:
            return
        try:
            out.send_nowait(msg)
        except anyio.WouldBlock:
            log.warning("rank %d: outbox of client %d is full; dropping %s", self.cfg.dp_rank, client_index,
                        type(msg).__name__)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    # ------------------------------------------------------------------ stats / death

    async def _publish_stats(self) -> None:
        if self.coordinator is None or self.cfg.external_lb:
            return
        s = self.core.stats()
        last = self.state.last_stats
        if last is not None and last[0] == s.num_running and last[1] == s.num_waiting and abs(
            last[2] - s.kv_cache_usage
        ) < KV_USAGE_PUBLISH_DELTA:
            return
        self.state.last_stats = (s.num_running, s.num_waiting, s.kv_cache_usage)
        await self._send_coordinator(
            m.RankStats(
                dp_rank=self.cfg.dp_rank,
                num_waiting=s.num_waiting,
                num_running=s.num_running,
                kv_cache_usage=s.kv_cache_usage,
                step=s.step,
                wave=s.wave,
            )
        )

    async def _announce_death(self, reason: str) -> None:
        """Tell every client and the coordinator that this rank is dead; bounded flush (spec §8.8)."""
        self.state.dead_reason = reason
        dead = m.EngineDead(dp_rank=self.cfg.dp_rank, reason=reason)
        with anyio.CancelScope(shield=True), anyio.move_on_after(EOF_FLUSH_S):
            for link in [*self.clients.values(), *([self.coordinator] if self.coordinator else [])]:
                try:
                    await link.send(dead)
                except Exception:  # noqa: BLE001 - best effort: the peer may be gone too
                    pass


class RankTornDown(AsyncDPError):
    """The group was torn down (coordinator Teardown, lost coordinator in MoE mode)."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"
