"""The DP client of an API-server process: routes requests to engine ranks and streams their outputs back.

Theory of operation
-------------------
``serve()`` accepts the links of the managed engines (:class:`~asyncdp.apiserver.engine_links.EngineLinks`,
spec §5.1) until every rank sent ``EngineReady`` (E9 deadline), reports readiness through ``task_status``, and
follows the coordinator, whose ``StatsSnapshot`` stream feeds the load balancer (:mod:`asyncdp.dp.balance`).

Admission (:mod:`asyncdp.apiserver.admission`): ``admit(n)`` reserves one HTTP request's ``n`` slots at once
against ``--max-queued-requests`` (all or nothing; with a node table, the node's pool), ``generate(...,
admission=)`` takes one; ``num_inflight`` counts requests in flight plus reserved slots.

``generate()`` asks the balancer for a rank, sends ``AddRequest`` and yields the deltas the link's reader posts
into the request's :class:`~asyncdp.apiserver.request_stream.RequestStream`. The balancer is the one owner of
request -> rank and of the per-rank in-flight counts; this client keeps only the streams. Leaving the generator
early (disconnect, cancellation) sends ``AbortRequests`` to the owning rank only and waits (``ABORT_ACK_TIMEOUT_S``)
for the engine to confirm. Every finished id an engine reports releases the balancer's in-flight count, so an idle
deployment has zero in-flight everywhere (spec §7.3). Every other way out releases the slot too: a send the
encoder refuses (400), a broken link, an engine that never confirms the abort, a rank that dies after the
generator was closed.

Abandoned requests: after ``begin_shutdown(reason)``, ``abort_all()`` (``--shutdown-timeout 0``, the drain
deadline, a teardown) fails every in-flight request with ``ShuttingDownError`` naming the cause, and an
``abort`` the engines report that this client did not ask for fails the same way. Only a caller's own early
exit, and an abort outside shutdown (``POST /pause?mode=abort``), end as a normal output with reason ``abort``.

Every wait on an engine has a deadline (:mod:`asyncdp.apiserver.engine_links`): sends (``ENGINE_SEND_TIMEOUT_S``),
utility calls (``utility_timeout_s``), abort confirmations (``ABORT_ACK_TIMEOUT_S``); output streams end when
the rank's link does. What arrives on the links (outputs, utility results, ``RankDraining``, a rank's death) and
the coordinator's snapshots are handled by :class:`~asyncdp.apiserver.engine_events.EngineEvents`, which the
client composes over its balancer and request streams.

The coordinator link is followed for the client's life (:mod:`asyncdp.apiserver.coordinator_follower`): a
lost link, or one silent for ``heartbeat_timeout_s``, is connected and subscribed again with capped backoff;
meanwhile the client routes on its own in-flight counts.
MoE: the client stamps each request with its wave and sends ``FirstRequest`` when it believes the group is
paused (spec §6.5).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import msgspec

from asyncdp import messages as m
from asyncdp.api.engine_client import Admission, RankHint, SequenceGroup
from asyncdp.apiserver.admission import AdmissionSlots, ClientAdmission
from asyncdp.apiserver.client_config import ClientConfig
from asyncdp.apiserver.coordinator_follower import CoordinatorFollower
from asyncdp.apiserver.engine_events import EngineEvents
from asyncdp.apiserver.engine_links import EngineLink, EngineLinks, UtilityCalls, send_to_engine
from asyncdp.apiserver.load_view import LoadView
from asyncdp.apiserver.node_table import NodeTable, monotonic_ms, run_heartbeat, stuck_problem, stuck_siblings
from asyncdp.apiserver.request_stream import RequestStream, now_us
from asyncdp.apiserver.server_info import client_server_info, node_processes
from asyncdp.apiserver.stats_export import refresh_coordinator_gauges
from asyncdp.dp.balance import LoadBalancer
from asyncdp.errors import InvalidRequestError, ShuttingDownError, UnavailableError
from asyncdp.sampling_params import SamplingParams
from asyncdp.transport import Link

log = logging.getLogger(__name__)
__all__ = ["ABORT_ACK_TIMEOUT_S", "ClientAdmission", "ClientConfig", "DPClient"]

# How long a closed request waits for its engine to confirm the abort before its slot is released anyway: an
# engine that never answers must not hold a slot (and the balancer's in-flight count) forever.
ABORT_ACK_TIMEOUT_S = 5.0


class DPClient:
    """Implements :class:`asyncdp.api.engine_client.EngineClient` over engine links."""

    def __init__(self, cfg: ClientConfig, tokenizer: Any, *, metrics: Any = None,
                 node_table: NodeTable | None = None) -> None:
        self.cfg = cfg
        self._node = node_table
        self._tokenizer = tokenizer
        self.metrics = metrics
        self.lb = LoadBalancer(list(cfg.managed_ranks), cfg.client_index, cfg.client_count, cfg.lb_policy,
                               seed=cfg.lb_seed)
        self._requests: dict[str, RequestStream] = {}  # streams only: the balancer owns request -> rank
        self._slots = AdmissionSlots(cfg.max_queued_requests, node_table, cfg.client_index,
                                     lambda: len(self._requests))
        self._utility = UtilityCalls(cfg.client_index)
        self._shutting_down = False
        self._abandon_reason = "the server is shutting down"
        self._num_drained = 0  # requests completed since begin_shutdown
        self.current_wave = 0
        self.wave_running = False
        self._load = LoadView(cfg.managed_ranks, is_moe=cfg.is_moe)  # GET /load
        self._events = EngineEvents(self.lb, self._requests, self._utility, self._load, metrics, is_moe=cfg.is_moe,
                                    release=self._release, abandoned=self._abandoned, on_wave=self._on_wave)
        self._links = EngineLinks(cfg.managed_ranks, cfg.client_index, on_ready=self._on_engine_ready,
                                  on_message=self._events.on_message, on_dead=self._events.on_dead,
                                  heartbeat_timeout_s=cfg.heartbeat_timeout_s, link_secret=cfg.link_secret)
        self.coordinator = CoordinatorFollower(
            cfg.client_index, cfg.heartbeat_interval_s, self._events.on_snapshot, lambda: self._shutting_down,
            state="none" if cfg.coordinator_client_addr is None and cfg.dp_size == 1 else "starting",
            heartbeat_timeout_s=cfg.heartbeat_timeout_s, on_lost=self.lb.forget_snapshot,
            on_placed=lambda msg: self.lb.on_prefix_placed(msg.rank, msg.prompt_tokens), link_secret=cfg.link_secret)
        self.processes: list[dict[str, Any]] = []
        self.nodes: list[dict[str, Any]] = []  # the deployment's launches, as the launcher last published them
        if metrics is not None:
            metrics.on_render(lambda: refresh_coordinator_gauges(metrics, self.coordinator_state,
                                                                 self.snapshot_age_s()))

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
        return {rank: (e.alive, e.last_seen) for rank, e in self._links.engines.items()}

    def is_healthy(self) -> bool:
        """Ready, not shutting down, some rank alive, and no sibling API process of the node stuck (its event
        loop blocked: the kernel still hands it connections, so the node is not healthy)."""
        return self.health_problem() is None

    def health_problem(self) -> str | None:
        """Why :meth:`is_healthy` is false (``/health``'s message), or None."""
        if self._shutting_down:
            return "The server is shutting down."
        if (starting := self._links.starting_problem()) is not None:
            return starting
        if not self.can_serve():
            return "No engine can serve requests."
        stuck = self.stuck_siblings()
        return stuck_problem(stuck) if stuck else None

    def can_serve(self) -> bool:
        """Every managed rank became ready once and at least one is alive now (what the watchdog checks)."""
        return self._links.all_ready.is_set() and self._links.any_alive()

    def stuck_siblings(self) -> list[int]:
        """Client indexes of this node's API processes whose heartbeat stopped (none without a node table)."""
        if self._node is None:
            return []
        return stuck_siblings(self._node.slots(), self.cfg.client_index, monotonic_ms())

    def node_processes(self) -> list[dict[str, Any]] | None:
        """The node table as this process reads it (``/server_info``), or None without one."""
        return None if self._node is None else node_processes(self._node, self.cfg.client_index)

    async def run_node_heartbeat(self) -> None:
        """Task: claim this process's slot of the node table and keep its heartbeat fresh."""
        if self._node is not None:
            await run_heartbeat(self._node, self.cfg.client_index, self._slots.publish)

    @property
    def num_inflight(self) -> int:
        """Admission slots in use: requests in flight plus slots reserved by :meth:`admit` and not yet taken."""
        return self._slots.num_inflight

    @property
    def num_drained(self) -> int:
        """Requests that completed normally since :meth:`begin_shutdown` (the "drained" of the stopped line); one
        that failed or was aborted meanwhile does not count."""
        return self._num_drained

    async def wait_idle(self) -> None:
        """Return once no request of this client is in flight and no admission slot is reserved."""
        await self._slots.wait_idle()

    def admit(self, num_sequences: int) -> ClientAdmission:
        """Reserve ``num_sequences`` slots at once (all or nothing) against ``--max-queued-requests``."""
        self._check_can_admit()
        return self._slots.admit(num_sequences)

    def _check_can_admit(self) -> None:
        if self._shutting_down:
            raise ShuttingDownError("the server is shutting down")
        if not self._links.all_ready.is_set():
            raise UnavailableError("the server is starting: not every data-parallel rank is ready yet")
        if not self._links.any_alive():
            raise UnavailableError(self._links.none_alive())

    def begin_shutdown(self, reason: str = "the server is shutting down") -> None:
        """New requests get 503 from now on; a request the engines abort from now on (their own drain deadline,
        a teardown) fails with ``ShuttingDownError(reason)`` instead of ending as a normal ``abort``."""
        self._shutting_down = True
        self._abandon_reason = reason

    def _abandoned(self) -> str | None:
        """While shutting down, the reason a request this client did not end is abandoned; else None."""
        return self._abandon_reason if self._shutting_down else None

    async def abort_all(self, reason: str | None = None) -> None:
        """Abandon every in-flight request (``--shutdown-timeout 0``, the drain deadline, a teardown): each
        fails at once with ``ShuttingDownError`` naming ``reason`` (an error status or SSE error event, never a
        200 with ``finish_reason="abort"``), and its engine is told to abort it."""
        reason = reason or self._abandon_reason
        for req in list(self._requests.values()):
            if not req.finished:
                req.fail(ShuttingDownError(f"the request was abandoned: {reason}"))
        for rank, ids in self.lb.group_by_owner(list(self._requests)).items():
            await self._links.send_abort(rank, ids)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        rank_hint: RankHint | None = None,
        admission: Admission | None = None,
        routing_key: str | None = None,
        group: SequenceGroup | None = None,
    ) -> AsyncGenerator[m.RequestOutput, None]:
        arrival = time.monotonic()  # TTFT and e2e start here: the directory's answer is part of the caller's wait
        # A new prefix among several API servers: the coordinator says where it goes (before the slot is taken).
        directed = None if rank_hint is not None or not self.can_serve() or self._shutting_down else \
            await self.coordinator.direct(self.lb, request_id, prompt_token_ids, params.max_tokens or 16, now_us(),
                                          routing_key, params.cache_salt)
        # The slot: one of the HTTP request's reserved ones, or a fresh one. From the take on, the count stays
        # right on every path: nothing awaits until the request is registered below, and every path out after
        # that goes through the finally, which releases it.
        if not isinstance(admission, ClientAdmission) or not admission.take():
            self.admit(1).take()
        else:
            self._check_can_admit()
        dp_rank, engine = self._route(request_id, prompt_token_ids, params, rank_hint, directed, routing_key)
        req = RequestStream(request_id, arrival, len(prompt_token_ids), group=group,
                            max_tokens=params.max_tokens or self.cfg.max_model_len - len(prompt_token_ids))
        self._requests[request_id] = req
        self._slots.publish()  # the slot moved from "reserved" to this request: the node sees it again
        self._update_inflight_metric(dp_rank)
        try:
            await self._send_add(engine, req, m.AddRequest(
                request_id=request_id,
                client_index=self.cfg.client_index,
                wave=self.current_wave,
                prompt_token_ids=prompt_token_ids,
                sampling_params=params,
                arrival_time=time.time(),
                pinned=rank_hint is not None and (rank_hint.local_index is not None
                                                  or rank_hint.global_rank is not None),
            ))
            await self._start_wave(dp_rank)
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
                if req.error is None and self._links.alive(dp_rank):
                    req.client_abort = True
                    with anyio.CancelScope(shield=True):
                        await self._links.send_abort(dp_rank, [request_id])
                        with anyio.move_on_after(ABORT_ACK_TIMEOUT_S):
                            await req.done.wait()
                self._release(req)

    def _route(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
               rank_hint: RankHint | None, directed: int | None, key: str | None) -> tuple[int, EngineLink]:
        """The balancer's pick (hints resolved there, once; else the directory's rank, if any) and that rank's
        link; undone if the rank is gone."""
        local_index = rank_hint.local_index if rank_hint else None
        global_rank = rank_hint.global_rank if rank_hint else None
        dp_rank = self.lb.select(request_id, prompt_token_ids, local_index, global_rank_hint=global_rank,
                                 max_tokens=params.max_tokens or 16, now_us=now_us(), directed=directed,
                                 routing_key=key, cache_salt=params.cache_salt)
        engine = self._links.engines.get(dp_rank)
        if engine is None or not engine.alive:
            self.lb.on_finish(request_id)
            raise UnavailableError(f"data_parallel_rank {dp_rank} is not available")
        if self.metrics is not None:
            pinned = local_index is not None or global_rank is not None
            self.metrics.inc_lb_decision(dp_rank, "hint" if pinned else "directory" if directed is not None else "score")
        return dp_rank, engine

    async def _start_wave(self, dp_rank: int) -> None:
        """MoE: the first request of a paused group asks the coordinator to start a wave (spec §6.5)."""
        if self.cfg.is_moe and not self.wave_running and self.coordinator.link is not None:
            self.wave_running = True
            await self.coordinator.send_first_request(dp_rank, self.current_wave)

    async def _send_add(self, engine: EngineLink, req: RequestStream, msg: m.AddRequest) -> None:
        """Send ``AddRequest``; a failure fails ``req`` (the engine does not have it: nothing to abort)."""
        try:
            await send_to_engine(engine, msg)
        except (OverflowError, TypeError, ValueError, msgspec.EncodeError) as exc:
            req.fail(InvalidRequestError(f"the request cannot be encoded for the engine: {exc}"))
            raise req.error from exc  # type: ignore[misc]
        except UnavailableError as exc:  # EngineDeadError, EngineTimeoutError: the rank and the wait named
            req.fail(exc)
            raise

    async def call_utility(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on every live managed engine; the first engine's value, or raise if any failed.

        Bounded by ``utility_timeout_s``: a pause waits for running requests (mode ``wait``) or for the MoE
        group's consensus, but never forever; a rank that dies meanwhile fails the call at once."""
        if self._links.engines and not self._links.any_alive():
            raise UnavailableError(self._links.none_alive())
        return await self._utility.call(list(self._links.engines.values()), method, args, kwargs,
                                        self.cfg.utility_timeout_s)

    async def serve(self, listener: anyio.abc.SocketListener, *,
                    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Accept engine links; report ready once every managed rank sent EngineReady; then run forever."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._links.accept, listener, tg)
            await self.wait_engines_ready()
            if self.cfg.coordinator_client_addr:
                tg.start_soon(self.coordinator.follow_addr, self.cfg.coordinator_client_addr)
            task_status.started()

    async def wait_engines_ready(self) -> None:
        await self._links.wait_ready(self.cfg.engine_ready_timeout_s)

    async def attach_engine(self, link: Link) -> None:
        """Serve one engine link (public for in-memory harnesses): first frame EngineReady, then outputs."""
        await self._links.serve_link(link)

    def _on_engine_ready(self, engine: EngineLink) -> None:
        if self.metrics is not None:
            self.metrics.init_engine(engine.dp_rank, is_moe=self.cfg.is_moe)
            self.metrics.set_engine_up(engine.dp_rank, True)
        if self.lb.mark_alive(engine.dp_rank):  # a restarted node brought a dead rank back (dense, spec §13)
            log.info("engine rank %d is back (pid %s); it rejoins the load balancer", engine.dp_rank,
                     engine.ready.pid)
        addr = engine.ready.coordinator_client_addr
        if addr and self.cfg.coordinator_client_addr is None:
            self.cfg = self.cfg.with_coordinator(addr)
        ready = [e.ready for e in self._links.engines.values()]
        if len(ready) == len(self.cfg.managed_ranks):  # every managed engine is known: tell the policy their KV
            self.lb.set_engine_params({"kv_blocks_per_rank": min(r.num_kv_blocks for r in ready),
                                       "block_size_tokens": ready[0].block_size})

    def _release(self, req: RequestStream) -> None:
        """Give back the request's slot and its balancer count (idempotent)."""
        if self._requests.pop(req.request_id, None) is not None:
            if self._shutting_down and req.completed:
                self._num_drained += 1
            self._slots.changed()
            rank = self.lb.on_finish(req.request_id, now_us())
            if rank is not None:
                self._update_inflight_metric(rank)

    def inflight_of(self, dp_rank: int) -> int:
        return self.lb.inflight_of(dp_rank)

    def _update_inflight_metric(self, dp_rank: int) -> None:
        if self.metrics is not None:
            self.metrics.set_inflight(dp_rank, self.inflight_of(dp_rank))

    async def follow_coordinator(self, connect: Callable[[], Awaitable[Link]]) -> None:
        """See :meth:`CoordinatorFollower.follow` (public for in-memory harnesses)."""
        await self.coordinator.follow(connect)

    async def attach_coordinator(self, link: Link) -> None:
        """See :meth:`CoordinatorFollower.attach` (public for in-memory harnesses)."""
        await self.coordinator.attach(link)

    @property
    def coordinator_state(self) -> str:
        return self.coordinator.state

    def snapshot_age_s(self) -> float | None:
        return self.coordinator.snapshot_age_s()

    def _on_wave(self, wave: int, running: bool) -> None:
        """The wave the coordinator last published (MoE: stamped on each request, spec §6.5)."""
        self.current_wave, self.wave_running = wave, running

    def server_info(self) -> dict[str, Any]:
        return client_server_info(self)

    def load(self) -> dict[str, Any]:
        """The ``GET /load`` document (:mod:`.load_view`)."""
        return self._load.document(self.cfg, self.engine_states(), now=time.monotonic(), wave=self.current_wave,
                                   wave_running=self.wave_running, inflight_of=self.inflight_of)
