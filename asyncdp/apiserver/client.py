"""The DP client of an API-server process: routes requests to engine ranks and streams their outputs back.

Theory of operation
-------------------
The client owns a listener that every managed engine connects to (spec §5.1 "client link"); the first frame on
each link is ``EngineReady``. ``serve()`` accepts links until every managed rank is ready (E9 deadline), then
reports readiness through ``task_status`` and keeps one reader task per link. A second task subscribes to the
coordinator's ``StatsSnapshot`` stream and feeds the load balancer (:mod:`asyncdp.dp.balance`).

Admission: ``admit(n)`` reserves the slots of one HTTP request's ``n`` sequences at once against
``--max-queued-requests`` (all or nothing; with a node table the cap is the node's pool, see
:mod:`asyncdp.apiserver.node_table`), and ``generate(..., admission=)`` takes one of them; ``generate`` alone admits
itself. ``num_inflight`` counts requests in flight plus reserved slots.

``generate()`` asks the balancer for a rank, sends ``AddRequest`` on that rank's link and yields the output
deltas the reader task posts into the request's collector. Leaving the generator early (client disconnect,
cancellation) sends ``AbortRequests`` to the owning rank only and waits (bounded, ``ABORT_ACK_TIMEOUT_S``) for
the engine to confirm. Every finished id an engine reports releases the balancer's in-flight count, so an idle
deployment has zero in-flight everywhere (spec §7.3). Every other way out releases the slot too: a send the
encoder refuses (400), a broken link, an engine that never confirms the abort, a rank that dies after the
generator was closed.

Abandoned requests: after ``begin_shutdown(reason)``, ``abort_all()`` (``--shutdown-timeout 0``, the drain
deadline, a teardown) fails every in-flight request with ``ShuttingDownError`` naming the cause, and an
``abort`` the engines report that this client did not ask for fails the same way. Only a caller's own early
exit, and an abort outside shutdown (``POST /pause?mode=abort``), end as a normal output with reason ``abort``.

When a rank dies (``EngineDead`` or link EOF) it leaves the balancer, its in-flight requests fail with
``EngineDeadError`` (and are released), ``asyncdp:dp_engine_up`` and its engine gauges drop to 0; the other
ranks keep serving (dense, spec §13).

The coordinator link is followed for the client's life: a lost link (the coordinator dropped this client for
missed heartbeats) is connected and subscribed again with capped backoff (state ``reconnecting``).
MoE: the client stamps each request with its wave and sends ``FirstRequest`` when it believes the group is
paused (spec §6.5).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import msgspec

from asyncdp import messages as m
from asyncdp.api.engine_client import Admission, RankHint
from asyncdp.apiserver.coordinator_follower import CoordinatorFollower
from asyncdp.apiserver.node_table import (
    HEARTBEAT_INTERVAL_S,
    NodeTable,
    monotonic_ms,
    node_admits,
    stuck_siblings,
)
from asyncdp.dp.balance import LoadBalancer
from asyncdp.errors import (
    AsyncDPError,
    EngineDeadError,
    InvalidRequestError,
    ProtocolError,
    QueueFullError,
    ShuttingDownError,
    StartupError,
    UnavailableError,
)
from asyncdp.sampling_params import SamplingParams
from asyncdp.transport import Link

log = logging.getLogger(__name__)

ABORT_SEND_TIMEOUT_S = 2.0
# How long a closed request waits for its engine to confirm the abort before its slot is released anyway: an
# engine that never answers must not hold a slot (and the balancer's in-flight count) forever.
ABORT_ACK_TIMEOUT_S = 5.0
ENGINE_READY_FRAME_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class ClientConfig:
    client_index: int
    client_count: int
    managed_ranks: tuple[int, ...]
    dp_size: int
    model_name: str
    max_model_len: int
    is_moe: bool = False
    lb_policy: str = "vllm"
    max_queued_requests: int | None = None
    engine_ready_timeout_s: float = 600.0
    coordinator_client_addr: str | None = None
    mode: str = "internal"
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0  # --dp-heartbeat-timeout-s: a coordinator silent this long is dead
    enable_expert_parallel: bool = False
    utility_timeout_s: float = 600.0


@dataclass(slots=True)
class _Request:
    request_id: str
    dp_rank: int
    arrival: float
    num_prompt_tokens: int
    pending: deque[m.RequestOutput] = field(default_factory=deque)
    changed: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)  # finished, or failed
    client_abort: bool = False  # this client asked the engine to abort it (the caller left early)
    error: Exception | None = None
    finished: bool = False
    first_token_at: float | None = None
    last_token_at: float | None = None
    num_generated: int = 0
    itls_s: list[float] = field(default_factory=list)

    def post(self, out: m.RequestOutput, now: float) -> None:
        n = len(out.new_token_ids)
        if n:
            if self.first_token_at is None:
                self.first_token_at = now
            elif self.last_token_at is not None:
                gap = (now - self.last_token_at) / n
                self.itls_s.extend([gap] * n)
            self.last_token_at = now
            self.num_generated += n
        self.pending.append(out)
        self.changed.set()

    def fail(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        self.changed.set()
        self.done.set()


class ClientAdmission:
    """Admission slots reserved by :meth:`DPClient.admit` for one HTTP request (the ``Admission`` protocol)."""

    __slots__ = ("_client", "remaining")

    def __init__(self, client: DPClient, num_sequences: int) -> None:
        self._client = client
        self.remaining = num_sequences

    def take(self) -> bool:
        """Turn one reserved slot into a request's slot; False when none is left."""
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        self._client._unreserve(1)
        return True

    def release(self) -> None:
        n, self.remaining = self.remaining, 0
        if n:
            self._client._unreserve(n)


@dataclass(slots=True)
class _Engine:
    dp_rank: int
    link: Link
    ready: m.EngineReady
    alive: bool = True
    last_seen: float = 0.0


class DPClient:
    """Implements :class:`asyncdp.api.engine_client.EngineClient` over engine links."""

    def __init__(self, cfg: ClientConfig, tokenizer: Any, *, metrics: Any = None,
                 node_table: NodeTable | None = None) -> None:
        self.cfg = cfg
        self._node = node_table
        self._tokenizer = tokenizer
        self.metrics = metrics
        self.lb = LoadBalancer(list(cfg.managed_ranks), cfg.client_index, cfg.client_count, cfg.lb_policy)
        self._engines: dict[int, _Engine] = {}
        self._requests: dict[str, _Request] = {}
        self._reserved = 0  # admission slots reserved by admit() and not yet taken by generate()
        self._idle = anyio.Event()  # replaced while requests are in flight; set when the last one is released
        self._utility_results: dict[int, tuple[anyio.Event, list[m.UtilityResult]]] = {}
        self._call_ids = itertools.count(1)
        self._all_ready = anyio.Event()
        self._shutting_down = False
        self._abandon_reason = "the server is shutting down"
        self.current_wave = 0
        self.wave_running = False
        self.coordinator = CoordinatorFollower(
            cfg.client_index, cfg.heartbeat_interval_s, self._on_snapshot, lambda: self._shutting_down,
            state="none" if cfg.coordinator_client_addr is None and cfg.dp_size == 1 else "starting",
            heartbeat_timeout_s=cfg.heartbeat_timeout_s, on_lost=self.lb.forget_snapshot)
        self.processes: list[dict[str, Any]] = []
        if metrics is not None:
            metrics.on_render(self._refresh_render_gauges)

    # ------------------------------------------------------------------ EngineClient surface

    @property
    def model_name(self) -> str:
        return self.cfg.model_name

    @property
    def max_model_len(self) -> int:
        return self.cfg.max_model_len

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def engine_states(self) -> dict[int, tuple[bool, float]]:
        """Per managed rank that sent EngineReady: (alive, monotonic time last heard from)."""
        return {rank: (e.alive, e.last_seen) for rank, e in self._engines.items()}

    def is_healthy(self) -> bool:
        """Ready, not shutting down, some rank alive, and no sibling API process of the node stuck (its event
        loop blocked: the kernel still hands it connections, so the node is not healthy)."""
        return self.can_serve() and not self._shutting_down and not self.stuck_siblings()

    def can_serve(self) -> bool:
        """Every managed rank became ready once and at least one is alive now (what the watchdog checks)."""
        return self._all_ready.is_set() and any(e.alive for e in self._engines.values())

    def stuck_siblings(self) -> list[int]:
        """Client indexes of this node's API processes whose heartbeat stopped (none without a node table)."""
        if self._node is None:
            return []
        return stuck_siblings(self._node.slots(), self.cfg.client_index, monotonic_ms())

    def node_processes(self) -> list[dict[str, Any]] | None:
        """The node table as this process reads it (``/server_info``), or None without one."""
        if self._node is None:
            return None
        now = monotonic_ms()
        stuck = set(self.stuck_siblings())
        return [{"client_index": s.client_index, "pid": s.pid or None, "inflight": s.inflight,
                 "heartbeat_age_s": round((now - s.heartbeat_ms) / 1000, 3) if s.pid else None,
                 "stuck": s.client_index in stuck} for s in self._node.slots()]

    async def run_node_heartbeat(self) -> None:
        """Task: claim this process's slot of the node table and keep its heartbeat fresh."""
        if self._node is None:
            return
        import os

        self._node.register(self.cfg.client_index, os.getpid())
        self._publish_inflight()
        while True:
            self._node.beat(self.cfg.client_index)
            await anyio.sleep(HEARTBEAT_INTERVAL_S)

    @property
    def num_inflight(self) -> int:
        """Admission slots in use: requests in flight plus slots reserved by :meth:`admit` and not yet taken."""
        return len(self._requests) + self._reserved

    async def wait_idle(self) -> None:
        """Return once no request of this client is in flight and no admission slot is reserved."""
        while self.num_inflight:
            if self._idle.is_set():
                self._idle = anyio.Event()
            await self._idle.wait()

    def admit(self, num_sequences: int) -> ClientAdmission:
        """Reserve ``num_sequences`` slots at once (all or nothing) against ``--max-queued-requests``."""
        self._check_can_admit()
        limit = self.cfg.max_queued_requests
        if limit is not None:
            if self._node is None:
                if self.num_inflight + num_sequences > limit:
                    raise QueueFullError(
                        f"too many requests in flight ({self.num_inflight} in flight + {num_sequences} requested > "
                        f"--max-queued-requests {limit}); retry later")
            else:  # the node's pool: K slots per API process, usable by any of them
                siblings = self._node.sibling_inflight(self.cfg.client_index)
                count = self._node.num_processes
                if not node_admits(self.num_inflight, siblings, num_sequences, limit, count):
                    raise QueueFullError(
                        f"too many requests in flight on this node ({self.num_inflight + siblings} in flight + "
                        f"{num_sequences} requested > --max-queued-requests {limit} x {count} API servers); "
                        "retry later")
        self._reserved += num_sequences
        self._publish_inflight()
        return ClientAdmission(self, num_sequences)

    def _check_can_admit(self) -> None:
        if self._shutting_down:
            raise ShuttingDownError("the server is shutting down")
        if not self._all_ready.is_set():
            raise UnavailableError("the server is starting: not every data-parallel rank is ready yet")
        if not any(e.alive for e in self._engines.values()):
            raise UnavailableError("no data-parallel rank can serve requests")

    def _unreserve(self, n: int) -> None:
        self._reserved -= n
        self._on_slots_changed()

    def _on_slots_changed(self) -> None:
        self._publish_inflight()
        if not self.num_inflight:
            self._idle.set()

    def _publish_inflight(self) -> None:
        if self._node is not None:
            self._node.set_inflight(self.cfg.client_index, self.num_inflight)

    def begin_shutdown(self, reason: str = "the server is shutting down") -> None:
        """New requests get 503 from now on; a request the engines abort from now on (their own drain deadline,
        a teardown) fails with ``ShuttingDownError(reason)`` instead of ending as a normal ``abort``."""
        self._shutting_down = True
        self._abandon_reason = reason

    async def abort_all(self, reason: str | None = None) -> None:
        """Abandon every in-flight request (``--shutdown-timeout 0``, the drain deadline, a teardown): each
        fails at once with ``ShuttingDownError`` naming ``reason`` (an error status or SSE error event, never a
        200 with ``finish_reason="abort"``), and its engine is told to abort it."""
        reason = reason or self._abandon_reason
        by_rank: dict[int, list[str]] = {}
        for req in list(self._requests.values()):
            if not req.finished:
                req.fail(ShuttingDownError(f"the request was abandoned: {reason}"))
            by_rank.setdefault(req.dp_rank, []).append(req.request_id)
        for rank, ids in by_rank.items():
            await self._send_abort(rank, ids)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        rank_hint: RankHint | None = None,
        admission: Admission | None = None,
    ) -> AsyncGenerator[m.RequestOutput, None]:
        # The slot: one of the HTTP request's reserved ones, or a fresh one. From the take on, the count stays
        # right on every path: nothing awaits until the request is registered below, and every path out after
        # that goes through the finally, which releases it.
        if not isinstance(admission, ClientAdmission) or not admission.take():
            self.admit(1).take()
        else:
            self._check_can_admit()
        local_index = rank_hint.local_index if rank_hint else None
        global_rank = rank_hint.global_rank if rank_hint else None
        dp_rank = self.lb.select(request_id, prompt_token_ids, local_index, global_rank_hint=global_rank,
                                 max_tokens=params.max_tokens or 16)
        engine = self._engines.get(dp_rank)
        if engine is None or not engine.alive:
            self.lb.on_finish(request_id)
            raise UnavailableError(f"data_parallel_rank {dp_rank} is not available")
        pinned = rank_hint is not None and (local_index is not None or global_rank is not None)
        if self.metrics is not None:
            self.metrics.inc_lb_decision(dp_rank, "hint" if pinned else "score")
        req = _Request(request_id, dp_rank, time.monotonic(), len(prompt_token_ids))
        self._requests[request_id] = req
        self._publish_inflight()  # the slot moved from "reserved" to this request: the node sees it again
        self._update_inflight_metric(dp_rank)
        try:
            await self._send_add(engine, req, m.AddRequest(
                request_id=request_id,
                client_index=self.cfg.client_index,
                wave=self.current_wave,
                prompt_token_ids=prompt_token_ids,
                sampling_params=params,
                arrival_time=time.time(),
                pinned=pinned,
            ))
            coordinator = self.coordinator.link
            if self.cfg.is_moe and not self.wave_running and coordinator is not None:
                self.wave_running = True
                await coordinator.send(m.FirstRequest(exclude_rank=dp_rank, wave=self.current_wave))
            while True:
                await req.changed.wait()
                req.changed = anyio.Event()
                while req.pending:
                    out = req.pending.popleft()
                    yield out
                    if out.finished:
                        return
                if req.error is not None:
                    raise req.error
        finally:
            if not req.finished:
                # Left early (caller gone, cancelled) or failed: abort it on its engine and give its slot back
                # once the engine confirms, or after a deadline - never leave it counted for good (issue #12).
                if req.error is None and self._engine_alive(dp_rank):
                    req.client_abort = True
                    with anyio.CancelScope(shield=True):
                        await self._send_abort(dp_rank, [request_id])
                        with anyio.move_on_after(ABORT_ACK_TIMEOUT_S):
                            await req.done.wait()
                self._release(req)

    async def _send_add(self, engine: _Engine, req: _Request, msg: m.AddRequest) -> None:
        """Send ``AddRequest``; a failure fails ``req`` (the engine does not have it: nothing to abort)."""
        try:
            await engine.link.send(msg)
        except (OverflowError, TypeError, ValueError, msgspec.EncodeError) as exc:
            req.fail(InvalidRequestError(f"the request cannot be encoded for the engine: {exc}"))
            raise req.error from exc  # type: ignore[misc]
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            req.fail(EngineDeadError(f"engine rank {engine.dp_rank}: its link broke ({type(exc).__name__})"))
            raise req.error from exc  # type: ignore[misc]

    async def call_utility(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on every live managed engine; the first engine's value, or raise if any failed.

        Bounded by ``utility_timeout_s``: a pause waits for running requests (mode ``wait``) or for the MoE
        group's consensus, but never forever."""
        try:
            with anyio.fail_after(self.cfg.utility_timeout_s):
                return await self._call_utility(method, *args, **kwargs)
        except TimeoutError:
            raise UnavailableError(f"{method} did not complete on every rank within "
                                   f"{self.cfg.utility_timeout_s:g} s") from None

    async def _call_utility(self, method: str, *args: Any, **kwargs: Any) -> Any:
        live = [e for e in self._engines.values() if e.alive]
        if not live:
            raise UnavailableError("no data-parallel rank can serve requests")
        call_id = next(self._call_ids)
        done = anyio.Event()
        results: list[m.UtilityResult] = []
        self._utility_results[call_id] = (done, results)
        try:
            for e in live:
                await e.link.send(
                    m.UtilityCall(client_index=self.cfg.client_index, call_id=call_id, method=method,
                                  args=list(args), kwargs=dict(kwargs))
                )
            while len(results) < len(live):
                await done.wait()
                done = anyio.Event()
                self._utility_results[call_id] = (done, results)
                if any(not e.alive for e in live):
                    raise EngineDeadError(f"a rank died during utility call {method!r}")
        finally:
            del self._utility_results[call_id]
        failed = [r for r in results if not r.ok]
        if failed:
            raise AsyncDPError(f"{method} failed: {failed[0].error}")
        return results[0].value

    # ------------------------------------------------------------------ serving

    async def serve(
        self, listener: anyio.abc.SocketListener, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Accept engine links; report ready once every managed rank sent EngineReady; then run forever."""
        from asyncdp.transport.links import StreamLink

        async with anyio.create_task_group() as tg:

            async def accept() -> None:
                async with listener:
                    while True:
                        stream = await listener.accept()
                        tg.start_soon(self._engine_link, StreamLink(stream, name="engine"))

            tg.start_soon(accept)
            await self.wait_engines_ready()
            if self.cfg.coordinator_client_addr:
                tg.start_soon(self._follow_coordinator, self.cfg.coordinator_client_addr)
            task_status.started()

    async def wait_engines_ready(self) -> None:
        with anyio.move_on_after(self.cfg.engine_ready_timeout_s) as scope:
            await self._all_ready.wait()
        if scope.cancelled_caught:
            missing = sorted(set(self.cfg.managed_ranks) - set(self._engines))
            raise StartupError(
                f"engine ranks {missing} did not send EngineReady within --engine-ready-timeout-s "
                f"{self.cfg.engine_ready_timeout_s:g}"
            )

    async def attach_engine(self, link: Link) -> None:
        """Serve one engine link (public for in-memory harnesses): first frame EngineReady, then outputs."""
        await self._engine_link(link)

    async def _engine_link(self, link: Link) -> None:
        try:
            with anyio.fail_after(ENGINE_READY_FRAME_TIMEOUT_S):  # a connected engine is ready: it says so at once
                first = await link.receive()
        except (anyio.EndOfStream, ProtocolError, TimeoutError) as exc:
            log.error("client %d: dropping an engine link without a valid EngineReady (%s)",
                      self.cfg.client_index, type(exc).__name__)
            await link.aclose()
            return
        if not isinstance(first, m.EngineReady) or first.dp_rank not in self.cfg.managed_ranks:
            log.error("client %d: unexpected first frame %r on an engine link", self.cfg.client_index, first)
            await link.aclose()
            return
        rank = first.dp_rank
        self._engines[rank] = _Engine(rank, link, first, last_seen=time.monotonic())
        if self.metrics is not None:
            self.metrics.set_engine_up(rank, True)
        if first.coordinator_client_addr and self.cfg.coordinator_client_addr is None:
            self.cfg = _with_coordinator(self.cfg, first.coordinator_client_addr)
        if set(self.cfg.managed_ranks) <= set(self._engines):
            self._all_ready.set()
        reason = "link closed"
        try:
            async for msg in link:
                self._engines[rank].last_seen = time.monotonic()
                if isinstance(msg, m.EngineOutputs):
                    self._on_outputs(msg)
                elif isinstance(msg, m.UtilityResult):
                    slot = self._utility_results.get(msg.call_id)
                    if slot is not None:
                        slot[1].append(msg)
                        slot[0].set()
                elif isinstance(msg, m.EngineDead):
                    reason = msg.reason
                    break
        finally:
            self._on_engine_dead(rank, reason)
            await link.aclose()

    def _on_outputs(self, msg: m.EngineOutputs) -> None:
        now = time.monotonic()
        for out in msg.outputs:
            req = self._requests.get(out.request_id)
            if req is not None:
                if out.error_type is not None:  # refused by the engine: an error status, not an empty answer
                    req.fail(_rejection(out))
                elif out.finish_reason == "abort" and self._shutting_down and not req.client_abort:
                    # Aborted by the server side (a rank's drain deadline, a teardown), not by the caller.
                    req.fail(ShuttingDownError(f"the request was abandoned: {self._abandon_reason}"))
                else:
                    req.post(out, now)
        for rid in msg.finished_request_ids:
            req = self._requests.get(rid)
            if req is not None:
                req.finished = True
                req.done.set()
                self._release(req)
                self._record_finished(req, msg, now)
        if msg.scheduler_stats is not None and self.metrics is not None:
            self._export_stats(msg.dp_rank, msg.scheduler_stats)

    def _export_stats(self, rank: int, s: m.SchedulerStats) -> None:
        """Gauges are set; counters arrive as deltas since the rank last attached stats to any client (see
        ``SchedulerStats``), so adding them here keeps the sum over API processes exact."""
        metrics = self.metrics
        metrics.set_engine_state(rank, s.num_running, s.num_waiting, s.kv_cache_usage)
        metrics.add_engine_counters(rank, preemptions=s.num_preemptions, prefix_cache_queries=s.prefix_cache_queries,
                                    prefix_cache_hits=s.prefix_cache_hits)
        if self.cfg.is_moe:
            metrics.set_wave(rank, s.wave, s.wave_running)
            if s.num_dummy_steps:
                metrics.add_dummy_steps(rank, s.num_dummy_steps)
            if s.waves_completed:
                metrics.inc_waves_completed(rank, s.waves_completed)

    def _record_finished(self, req: _Request, msg: m.EngineOutputs, now: float) -> None:
        if self.metrics is None:
            return
        reason = "abort"
        for out in msg.outputs:
            if out.request_id == req.request_id and out.finish_reason:
                reason = out.finish_reason
        self.metrics.record_request_finished(
            engine=req.dp_rank,
            finished_reason=reason,
            prompt_tokens=req.num_prompt_tokens,
            generation_tokens=req.num_generated,
            ttft_s=None if req.first_token_at is None else req.first_token_at - req.arrival,
            itls_s=req.itls_s,
            e2e_s=now - req.arrival,
        )

    def _release(self, req: _Request) -> None:
        """Give back the request's slot and its balancer count (idempotent)."""
        if self._requests.pop(req.request_id, None) is not None:
            self._on_slots_changed()
            self.lb.on_finish(req.request_id)
            self._update_inflight_metric(req.dp_rank)

    def inflight_of(self, dp_rank: int) -> int:
        return self.lb.inflight_of(dp_rank)

    def _update_inflight_metric(self, dp_rank: int) -> None:
        if self.metrics is not None:
            self.metrics.set_inflight(dp_rank, self.inflight_of(dp_rank))

    def _engine_alive(self, dp_rank: int) -> bool:
        e = self._engines.get(dp_rank)
        return e is not None and e.alive

    def _on_engine_dead(self, rank: int, reason: str) -> None:
        engine = self._engines.get(rank)
        if engine is None or not engine.alive:
            return
        engine.alive = False
        if not self._shutting_down:
            log.error("engine rank %d is dead (%s); it leaves the load balancer", rank, reason)
        self.lb.mark_dead(rank)
        if self.metrics is not None:
            self.metrics.set_engine_up(rank, False)
            self.metrics.clear_engine_state(rank)
        for req in [r for r in self._requests.values() if r.dp_rank == rank]:
            req.fail(EngineDeadError(f"engine rank {rank} died: {reason}"))
            # Released here, not by the generator: a generator that was already closed will never run again.
            self._release(req)

    async def _send_abort(self, dp_rank: int, ids: list[str]) -> None:
        engine = self._engines.get(dp_rank)
        if engine is None or not engine.alive:
            return
        with anyio.move_on_after(ABORT_SEND_TIMEOUT_S):
            try:
                await engine.link.send(m.AbortRequests(request_ids=ids))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass

    # ------------------------------------------------------------------ coordinator

    async def _follow_coordinator(self, addr: str) -> None:
        await self.coordinator.follow_addr(addr)

    async def follow_coordinator(self, connect: Callable[[], Awaitable[Link]]) -> None:
        """See :meth:`CoordinatorFollower.follow` (public for in-memory harnesses)."""
        await self.coordinator.follow(connect)

    async def attach_coordinator(self, link: Link) -> None:
        """See :meth:`CoordinatorFollower.attach` (public for in-memory harnesses)."""
        await self.coordinator.attach(link)

    @property
    def coordinator_state(self) -> str:
        return self.coordinator.state

    @property
    def snapshot_received_at(self) -> float | None:
        return self.coordinator.snapshot_received_at

    def snapshot_age_s(self) -> float | None:
        return self.coordinator.snapshot_age_s()

    def _on_snapshot(self, snap: m.StatsSnapshot) -> None:
        self.current_wave = snap.wave
        self.wave_running = snap.running
        if snap.counts is not None:
            self.lb.on_snapshot([list(c) for c in snap.counts])

    def _refresh_render_gauges(self) -> None:
        """At scrape time: the snapshot's real age (it keeps growing once the coordinator is gone) and whether
        the coordinator is followed."""
        if self.coordinator_state == "none":
            return
        age = self.snapshot_age_s()
        if age is not None:
            self.metrics.set_snapshot_age(age)
        self.metrics.set_coordinator_up(self.coordinator_state == "alive")

    # ------------------------------------------------------------------ /server_info

    def server_info(self) -> dict[str, Any]:
        from asyncdp.apiserver.server_info import client_server_info

        return client_server_info(self)


def _rejection(out: m.RequestOutput) -> Exception:
    reason = out.error or "the engine refused the request"
    if out.error_type == "invalid_request":
        return InvalidRequestError(reason)
    if out.error_type == "unavailable":
        return ShuttingDownError(reason)
    return UnavailableError(reason)


def _with_coordinator(cfg: ClientConfig, addr: str) -> ClientConfig:
    import dataclasses

    return dataclasses.replace(cfg, coordinator_client_addr=addr)
