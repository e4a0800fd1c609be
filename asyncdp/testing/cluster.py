"""A whole DP deployment (dense, or MoE in lockstep) in one anyio event loop, over in-memory links (the simulation
harness).

Theory of operation
-------------------
:func:`open_sim_cluster` builds, in the caller's event loop, the same roles a real deployment runs in separate
processes, and wires them with in-memory links instead of sockets:

* ``dp_size`` engine ranks: an :class:`~asyncdp.engine.core.EngineCore` over a :class:`SimRankExecutor`
  driven by :class:`~asyncdp.engine.rank.EngineRank` with ``inline_step=True``, so each step's modelled
  duration is slept on the anyio clock (virtual time under trio's ``MockClock(autojump_threshold=0)``);
* the real :func:`~asyncdp.coordinator.core.serve_coordinator` over two :class:`MemoryLinkListener` objects
  (optional: ``with_coordinator=False`` routes on in-flight counts only);
* ``num_clients`` real :class:`~asyncdp.apiserver.client.DPClient` objects whose engine links come through
  ``attach_engine(link)`` and whose coordinator link through ``attach_coordinator(link)``.

MoE (``is_moe=True``): every rank also gets a member of one :class:`~asyncdp.engine.dp_group.MemoryDPGroup` and
runs the lockstep loop (dummy batches, sync all-reduces, waves); the coordinator runs in wave mode and the clients
send ``FirstRequest`` to wake an idle group, as in a real MoE deployment. :meth:`SimCluster.group_running` reads
each rank's lockstep state.

Startup mirrors the process roles: the coordinator accepts links; every rank subscribes to it and waits for
``CoordinatorReady``, then sends ``EngineReady`` to every client; the context manager yields once every client
saw every rank ready and, with a coordinator, got its welcome snapshot (:mod:`asyncdp.testing.cluster_start`).

Observation without mocks: every link end is a :class:`SimLink` wired by
:class:`~asyncdp.testing.cluster_links.ClusterLinks`, which records per client the virtual time of every
``StatsSnapshot`` (``snapshots``), the rank each request was sent to (``routed``), and per rank how many requests
it reported finished (``finished_counts()``). Nothing in the production roles changes.

Faults: :meth:`SimCluster.kill_rank` cancels a rank and closes its links (a SIGKILL: peers see EOF);
:meth:`SimCluster.crash_rank` makes its next step raise, so the rank runs its real death path and sends
``EngineDead`` to every peer (a rank with no work takes no step: it is refused at once). A dead rank's error is kept in ``rank_errors``; the rest of the cluster serves on.
:meth:`SimCluster.stall_client` makes a client stop reading (with a small ``client_outbox_size`` the ranks
then cut its links; :meth:`SimCluster.wait_link_cut`).

Determinism (routing-bench spec §1.2): modelled step times are rounded to whole microseconds; request ids are
``c{client_index}-{n}`` from per-client counters; random inputs come from :func:`stream_rng`, a
``random.Random`` seeded with a BLAKE2b of ``"{seed}/{stream}"``; :meth:`SimCluster.complete_all` routes the
requests due at one instant one after another in submission order. Placements therefore repeat run to run for
requests sent together; beyond that, two events at exactly the same virtual instant (an arrival and an output,
say) are still ordered by trio's scheduler, so tests assert bounds, not exact placements. The exact,
event-ordered simulator of spec §1.2 is the benchmark's, not this harness's.

Teardown: leaving the context marks every client as shutting down, cancels every task of the cluster and closes
every memory stream it created (also the ranks' inboxes), so nothing leaks and no ``ResourceWarning`` fires.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import Any

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp.apiserver.client import DPClient
from asyncdp.config.flags import EngineConfig, SimCostProfile
from asyncdp.coordinator.core import CoordinatorConfig, serve_coordinator
from asyncdp.engine.rank import EngineRank
from asyncdp.engine.rank_links import OUTBOX_SIZE
from asyncdp.engine.sim_executor import TokenSource
from asyncdp.errors import AsyncDPError, ConfigError, leaf_exceptions, unwrap_sole_error
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing.cluster_args import check_count, check_index, check_unique_ids
from asyncdp.testing.cluster_links import ClusterLinks
from asyncdp.testing.cluster_start import start_cluster
from asyncdp.testing.links import LINK_BUFFER, MemoryLinkListener, SimLink  # noqa: F401 - re-exported
from asyncdp.testing.sim import SimCoordinator, SimRankExecutor, SimRequest

DEFAULT_VOCAB_SIZE = 32_000
DEFAULT_SIM_COST = SimCostProfile(a_ms=5.0, b_ms_per_token=0.02, c_ms_per_seq=0.01, d_ms_per_kv_token=1e-5)
DEFAULT_ENGINE_CONFIG = EngineConfig(executor="sim", sim_cost=DEFAULT_SIM_COST, num_kv_blocks=4096,
                                     max_num_seqs=256, max_num_batched_tokens=2048)


# ---------------------------------------------------------------------------------------- the cluster


class SimCluster:
    """The running cluster :func:`open_sim_cluster` yields. See the module docstring."""

    def __init__(self, *, dp_size: int, num_clients: int, codec: bool, link_buffer: int = LINK_BUFFER) -> None:
        self.dp_size = dp_size
        self.num_clients = num_clients
        self.codec = codec
        self.wiring = ClusterLinks(dp_size=dp_size, num_clients=num_clients, codec=codec, link_buffer=link_buffer)
        self.clients: list[DPClient] = []
        self.ranks: list[EngineRank] = []
        self._executors: list[SimRankExecutor] = []
        self.coordinator: SimCoordinator | None = None
        self.rank_errors: dict[int, BaseException] = {}
        #: per client: (virtual receive time, snapshot) of every StatsSnapshot, in arrival order
        self.snapshots = self.wiring.snapshots
        #: request id -> the rank its client sent it to
        self.routed = self.wiring.routed
        self._request_counters = [0] * num_clients
        self._rank_scopes = [anyio.CancelScope() for _ in range(dp_size)]
        self._rank_done = [anyio.Event() for _ in range(dp_size)]

    # ------------------------------------------------------------------ observation

    def finished_counts(self) -> list[int]:
        """Per rank: requests it reported finished (any reason, aborts included), as sent to the clients."""
        return list(self.wiring.finished)

    def group_running(self) -> list[bool]:
        """MoE: per rank, whether its lockstep state says the group's wave is running (False on a dense rank)."""
        return [r.lockstep is not None and r.lockstep.state.engines_running for r in self.ranks]

    def inflight_counts(self) -> list[int]:
        """Per client: requests it still tracks as in flight."""
        return [c.num_inflight for c in self.clients]

    def kv_usage(self) -> list[float]:
        """Per rank: referenced KV blocks / usable blocks, read from the block manager."""
        return [r.core.block_manager.usage for r in self.ranks]

    def is_idle(self) -> bool:
        """No client has a request in flight and no live rank has unfinished work."""
        return not any(self.inflight_counts()) and not any(
            r.core.has_unfinished() for i, r in enumerate(self.ranks) if not self._rank_done[i].is_set())

    async def wait_idle(self, *, recheck_s: float = 0.1, timeout_s: float = 3600.0) -> None:
        """Wait until :meth:`is_idle`. Rechecks whenever a message passes a rank or client link, and at least
        every ``recheck_s`` (on the anyio clock: virtual time in tests) for transitions no link shows."""
        with anyio.fail_after(timeout_s):
            while not self.is_idle():
                activity = self.wiring.activity
                with anyio.move_on_after(recheck_s):
                    await activity.wait()

    # ------------------------------------------------------------------ requests

    def next_request_id(self, client_index: int) -> str:
        n = self._request_counters[check_index("client_index", client_index, self.num_clients)]
        self._request_counters[client_index] = n + 1
        return f"c{client_index}-{n}"

    async def complete(self, client_index: int, prompt_token_ids: list[int], params: SamplingParams, *,
                       request_id: str | None = None) -> list[m.RequestOutput]:
        """Send one request through client ``client_index`` and return all its output deltas. ``params`` are
        validated here, as the HTTP layer does: a rank trusts what a client sends (``InvalidSamplingParams``)."""
        check_index("client_index", client_index, self.num_clients)
        params.validate()
        rid = request_id if request_id is not None else self.next_request_id(client_index)
        async with aclosing(self.clients[client_index].generate(rid, list(prompt_token_ids), params)) as gen:
            return [out async for out in gen]

    async def complete_all(self, requests: Iterable[SimRequest]) -> dict[str, list[m.RequestOutput] | Exception]:
        """Run requests concurrently, each sent ``delay_s`` after the call; per request id its deltas or its
        ``AsyncDPError``, in the given order.

        Ids are assigned in the given order before anything runs; a batch that names one id twice (given, or
        given and generated), or a client index out of range, is refused with ``ValueError`` before any request
        is sent. One dispatcher sends the requests in (``delay_s``, position) order and waits until each one's
        rank is chosen before sending the next, so requests due at the same instant are routed in a fixed order,
        not in trio's scheduling order.
        """
        requests = list(requests)
        for r in requests:
            check_index("client_index", r.client_index, self.num_clients)
        jobs = [(r, r.request_id if r.request_id is not None else self.next_request_id(r.client_index))
                for r in requests]
        check_unique_ids(rid for _, rid in jobs)
        results: dict[str, list[m.RequestOutput] | Exception] = {}

        async def one(req: SimRequest, rid: str, *, task_status: anyio.abc.TaskStatus[None]) -> None:
            try:
                req.params.validate()  # as the HTTP layer does: a rank trusts what a client sends
            except AsyncDPError as exc:
                results[rid] = exc
                task_status.started()
                return
            gen = self.clients[req.client_index].generate(rid, list(req.prompt_token_ids), req.params)
            outs: list[m.RequestOutput] = []
            # started() first: this task runs on, without yielding, into generate() until the request is
            # routed and its send checkpoints; only then does the dispatcher resume.
            task_status.started()
            try:
                async with aclosing(gen):
                    async for out in gen:
                        outs.append(out)
                results[rid] = outs
            except AsyncDPError as exc:
                results[rid] = exc

        start = anyio.current_time()
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i][0].delay_s, i))
        async with anyio.create_task_group() as tg:
            for i in order:
                req, rid = jobs[i]
                if req.delay_s > 0:
                    await anyio.sleep_until(start + req.delay_s)
                await tg.start(one, req, rid)
        return {rid: results[rid] for _, rid in jobs}

    # ------------------------------------------------------------------ faults

    async def kill_rank(self, dp_rank: int) -> None:
        """Stop a rank abruptly (cancel it, close its links, as SIGKILL would); returns once every client has
        dropped it from its balancer."""
        check_index("dp_rank", dp_rank, self.dp_size)
        self._rank_scopes[dp_rank].cancel()
        self.wiring.close_rank(dp_rank)
        await self._wait_released(dp_rank)

    async def crash_rank(self, dp_rank: int, reason: str = "injected fault") -> None:
        """Make the rank's next step raise :class:`InjectedFault`; returns once it is dead and every client has
        dropped it.

        The rank must have work now (a request it can schedule, or on MoE a running wave): an idle rank takes no
        step, so the fault would never fire (heartbeats keep virtual time moving: no stall is detected) and would
        stay armed for a later request. Such a call raises ``RuntimeError`` at once, the rank untouched; wait
        until the rank has work (e.g. :meth:`complete_all` in a task, then a short virtual sleep). If the call is
        cancelled before the rank died, the fault is disarmed."""
        executor = self._executors[check_index("dp_rank", dp_rank, self.dp_size)]
        rank = self.ranks[dp_rank]
        wave = rank.lockstep is not None and rank.lockstep.state.engines_running
        if not self._rank_done[dp_rank].is_set() and not (wave or rank.core.scheduler.has_steppable_work()):
            raise RuntimeError(f"crash_rank: rank {dp_rank} has no work, so it takes no step and the fault would "
                               "never fire; give it a request first")
        executor.fail_reason = reason
        try:
            await self._rank_done[dp_rank].wait()
        finally:
            if not self._rank_done[dp_rank].is_set():
                executor.fail_reason = None  # cancelled before it fired: a later request must not die of it
        await self._wait_released(dp_rank)

    async def _wait_released(self, dp_rank: int) -> None:
        for released in self.wiring.released:
            await released[dp_rank].wait()

    def stall_client(self, client_index: int) -> None:
        """Client ``client_index`` stops reading from every rank (its links' buffers, then the ranks' outboxes to
        it, fill up) until :meth:`unstall_client`; the other clients are unaffected."""
        self.wiring.stall_client(check_index("client_index", client_index, self.num_clients))

    def unstall_client(self, client_index: int) -> None:
        self.wiring.unstall_client(check_index("client_index", client_index, self.num_clients))

    async def wait_link_cut(self, dp_rank: int, client_index: int) -> None:
        """Until rank ``dp_rank``'s end of its link to client ``client_index`` is closed (the rank cut it)."""
        check_index("client_index", client_index, self.num_clients)
        await self.wiring.rank_closed[check_index("dp_rank", dp_rank, self.dp_size)][client_index].wait()

    # ------------------------------------------------------------------ wiring

    async def _run_rank(self, dp_rank: int, coordinator_link: SimLink | None) -> None:
        rank = self.ranks[dp_rank]
        try:
            with self._rank_scopes[dp_rank]:
                if coordinator_link is not None:  # as rank_process.start_rank, minus the handshake
                    await coordinator_link.send(m.Subscribe(dp_rank=dp_rank))
                    while not isinstance(await coordinator_link.receive(), m.CoordinatorReady):
                        pass
                core = rank.core
                for link in rank.links.clients.values():
                    await link.send(m.EngineReady(dp_rank=dp_rank, max_model_len=core.max_model_len,
                                                  num_kv_blocks=core.executor.num_kv_blocks,
                                                  block_size=core.block_manager.block_size,
                                                  coordinator_client_addr=None))
                await rank.run()
        except Exception as exc:  # the rank died (it already sent EngineDead); the cluster serves on
            leaves = leaf_exceptions(exc)
            self.rank_errors[dp_rank] = leaves[0] if len(leaves) == 1 else exc
        finally:
            self.wiring.close_rank(dp_rank)
            rank.close()
            rank.core.shutdown()
            self._rank_done[dp_rank].set()

    async def _run_coordinator(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                               ) -> None:
        coord = self.coordinator
        assert coord is not None
        try:
            await serve_coordinator(coord.config, coord.engine_listener, coord.client_listener,
                                    task_status=task_status)
        except AsyncDPError as exc:
            coord.error = exc
        finally:
            coord.done.set()

    def _close_everything(self) -> None:
        for rank in self.ranks:
            rank.close()
        self.wiring.close_all()
        if self.coordinator is not None:
            self.coordinator.engine_listener.close()
            self.coordinator.client_listener.close()


@asynccontextmanager
async def open_sim_cluster(
    dp_size: int = 2,
    num_clients: int = 2,
    *,
    engine_config: EngineConfig = DEFAULT_ENGINE_CONFIG,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    max_model_len: int = 8192,
    eos_token_ids: Sequence[int] = (),
    tokenizer: Any = None,
    lb_policy: str = "vllm",
    with_coordinator: bool = True,
    coordinator_config: CoordinatorConfig | None = None,
    heartbeat_interval_s: float = 1.0,
    heartbeat_timeout_s: float = 5.0,
    codec: bool = False,
    is_moe: bool = False,
    sync_interval: int = 32,
    sync_cadence: str = "asyncdp",
    client_outbox_size: int = OUTBOX_SIZE,
    link_buffer: int = LINK_BUFFER,
    token_source: TokenSource | None = None,
    lb_seed: int | None = None,
) -> AsyncIterator[SimCluster]:
    """Start a DP deployment in this event loop; yield it once every client can route to every rank.

    ``is_moe=True`` runs the ranks in lockstep (with ``sync_interval`` and ``sync_cadence``, see
    :mod:`asyncdp.dp.lockstep`) and the coordinator in wave mode.

    ``engine_config.executor`` must be ``"sim"``. ``eos_token_ids`` are never sampled (outputs run to
    ``max_tokens``). ``codec=True`` round-trips every message through the msgpack codec (slower; exercises the
    wire format). ``client_outbox_size`` is each rank's outbox per client (a full one cuts that client's link)
    and ``link_buffer`` each in-memory link's buffer: small values play a client that stops reading (with
    :meth:`SimCluster.stall_client`). ``token_source`` is handed to every rank's simulated executor (see
    :mod:`asyncdp.engine.sim_executor`: it picks each request's output tokens). ``lb_seed`` seeds client i's
    policy stream with ``stream_rng(lb_seed, "policy/{i}")`` (routing-bench §1.2); without it every client's
    stream is seeded 0. ``dp_size``, ``num_clients`` and ``vocab_size`` must be ints >= 1 and ``max_model_len``
    >= 2, else :class:`ConfigError` names the argument; the cluster's methods refuse a client index or rank out of
    range with ``ValueError``. See the module docstring for what the yielded :class:`SimCluster` offers.
    """
    if engine_config.executor != "sim":
        raise ConfigError(f"open_sim_cluster needs engine_config.executor='sim' (got {engine_config.executor!r}).")
    engine_config.validate()
    for name, value, minimum in (("dp_size", dp_size, 1), ("num_clients", num_clients, 1),
                                 ("vocab_size", vocab_size, 1),
                                 ("max_model_len", max_model_len, 2)):  # 2: a one-token prompt, one output
        check_count(name, value, minimum)
    if coordinator_config is None:
        coordinator_config = CoordinatorConfig(dp_size=dp_size, wave_mode=is_moe,
                                               heartbeat_interval_s=heartbeat_interval_s,
                                               heartbeat_timeout_s=heartbeat_timeout_s)
    if coordinator_config.dp_size != dp_size or coordinator_config.wave_mode != is_moe:
        raise ConfigError("coordinator_config must have the cluster's dp_size, and wave_mode exactly when is_moe.")
    moe = (sync_interval, sync_cadence) if is_moe else None

    cluster = SimCluster(dp_size=dp_size, num_clients=num_clients, codec=codec, link_buffer=link_buffer)
    ranks = tuple(range(dp_size))
    try:
        with unwrap_sole_error():
            async with anyio.create_task_group() as tg:
                try:
                    await start_cluster(cluster, tg, engine_config, vocab_size, max_model_len, eos_token_ids,
                                        tokenizer, lb_policy, coordinator_config if with_coordinator else None,
                                        ranks, heartbeat_interval_s, heartbeat_timeout_s, moe, client_outbox_size,
                                        token_source, lb_seed)
                    yield cluster
                finally:
                    for client in cluster.clients:
                        client.begin_shutdown()
                    tg.cancel_scope.cancel()
    finally:
        cluster._close_everything()
