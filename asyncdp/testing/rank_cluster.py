"""A rank-level harness: MoE engine ranks in lockstep driven by a scripted client, for tests of the rank role.

Theory of operation. :func:`open_rank_cluster` starts, in the caller's event loop, ``n`` real
:class:`~asyncdp.engine.rank.EngineRank` objects (MoE, dp = ``n``; a :func:`sim_rank_core` each: the sim
executor, inline steps unless ``inline_step=False``), one :class:`~asyncdp.engine.dp_group.MemoryDPGroup`, the
real coordinator (wave mode) over in-memory links, and :class:`FakeRankClient`: client 0, which follows the
coordinator's wave like the DP client (spec §6.5) but sends each request to the rank the test names, and records
every output (:class:`RankResult`), utility result, ``EngineDead`` and the scheduler stats each rank reports. It
yields a :class:`RankCluster` once every rank runs. Unlike :func:`~asyncdp.testing.cluster.open_sim_cluster`
(real DP clients, the balancer chooses), nothing here routes: the test places every request.

Under trio's ``MockClock(autojump_threshold=0)`` everything runs in virtual time: a step sleeps its modelled
cost. Faults: ``RankCluster.kill_coordinator``, a rank's ``rank_scopes[r].cancel()``, or a wrapped coordinator
link (``wrap_coordinator_link``). Leaving the context cancels every task and closes every link.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp.config.flags import EngineConfig, SimCostProfile
from asyncdp.coordinator.core import CoordinatorConfig, serve_coordinator
from asyncdp.engine.core import EngineCore
from asyncdp.engine.dp_group import MemoryDPGroup
from asyncdp.engine.rank import EngineRank, RankConfig
from asyncdp.engine.sim_executor import SimExecutor
from asyncdp.errors import leaf_exceptions, unwrap_sole_error
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing.links import MemoryLinkListener
from asyncdp.transport import Link, memory_link_pair

VOCAB = 300
EOS = 299
RANK_SIM_COST = SimCostProfile(a_ms=2.0, b_ms_per_token=0.01, c_ms_per_seq=0.1)  # a dummy step costs 2 ms


@dataclass
class RankResult:
    """One request's outputs as :class:`FakeRankClient` saw them."""

    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error_type: str | None = None  # set on the last output when the rank refused or abandoned the request
    error: str | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    finished_at: float | None = None


class FakeRankClient:
    """Client 0: follows the coordinator's wave like the DP client (spec §6.5), sends requests to chosen
    ranks, collects outputs, utility results and the scheduler stats each rank reports."""

    def __init__(self, n: int) -> None:
        self.links: dict[int, Link] = {}
        self.engine_ends: dict[int, Link] = {}
        for r in range(n):
            ours, theirs = memory_link_pair(name=f"client0-rank{r}")
            self.links[r], self.engine_ends[r] = ours, theirs
        self.coord, self.coord_end = memory_link_pair(name="client0-coordinator")
        self.current_wave = 0
        self.wave_running = False
        self.results: dict[str, RankResult] = {}
        self.utility: dict[int, m.UtilityResult] = {}
        self._utility_done: dict[int, anyio.Event] = {}
        self.stats: dict[int, list[m.SchedulerStats]] = {r: [] for r in range(n)}
        self.dead: dict[int, str] = {}
        self.draining: dict[int, float] = {}  # rank -> when its RankDraining arrived
        self._ids = itertools.count(1)
        self.send_first_request = True
        self.stats_arrived = anyio.Event()

    async def run(self, *, follow_coordinator: bool = True) -> None:
        async with anyio.create_task_group() as tg:
            for r, link in self.links.items():
                tg.start_soon(self._read_engine, r, link)
            if follow_coordinator:
                tg.start_soon(self._follow_coordinator)

    async def _read_engine(self, rank: int, link: Link) -> None:
        async for msg in link:
            if isinstance(msg, m.EngineOutputs):
                if msg.scheduler_stats is not None:
                    self.stats[rank].append(msg.scheduler_stats)
                    self.stats_arrived.set()
                    self.stats_arrived = anyio.Event()
                for out in msg.outputs:
                    res = self.results.setdefault(out.request_id, RankResult())
                    res.tokens += out.new_token_ids
                    if out.finished:
                        res.finish_reason = out.finish_reason
                        res.error_type, res.error = out.error_type, out.error
                        res.finished_at = anyio.current_time()
                        res.done.set()
            elif isinstance(msg, m.UtilityResult):
                self.utility[msg.call_id] = msg
                self._utility_done.setdefault(msg.call_id, anyio.Event()).set()
            elif isinstance(msg, m.EngineDead):
                self.dead[rank] = msg.reason
            elif isinstance(msg, m.RankDraining):
                self.draining[rank] = anyio.current_time()

    async def _follow_coordinator(self) -> None:
        await self.coord.send(m.Subscribe(client_id=0))
        async with anyio.create_task_group() as tg:

            async def heartbeat() -> None:
                for seq in itertools.count(1):
                    await anyio.sleep(1.0)
                    try:
                        await self.coord.send(m.Heartbeat(sender="client-0", seq=seq))
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return

            tg.start_soon(heartbeat)
            async for msg in self.coord:
                if isinstance(msg, m.StatsSnapshot):
                    self.current_wave, self.wave_running = msg.wave, msg.running
            tg.cancel_scope.cancel()

    async def add(self, rank: int, request_id: str, *, max_tokens: int = 4, prompt_len: int = 8,
                  wave: int | None = None) -> RankResult:
        """Send one request to ``rank`` (stamped with the client's wave unless given), as DPClient does."""
        res = self.results.setdefault(request_id, RankResult())
        stamp = self.current_wave if wave is None else wave
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        await self.links[rank].send(m.AddRequest(
            request_id=request_id, client_index=0, wave=stamp, prompt_token_ids=list(range(1, prompt_len + 1)),
            sampling_params=params, arrival_time=0.0, pinned=True))
        if self.send_first_request and not self.wave_running:
            self.wave_running = True
            await self.coord.send(m.FirstRequest(exclude_rank=rank, wave=stamp))
        return res

    async def call_nowait(self, rank: int, method: str, **kwargs: Any) -> int:
        call_id = next(self._ids)
        self._utility_done[call_id] = anyio.Event()
        await self.links[rank].send(m.UtilityCall(client_index=0, call_id=call_id, method=method, kwargs=kwargs))
        return call_id

    async def wait_utility(self, call_id: int) -> m.UtilityResult:
        await self._utility_done[call_id].wait()
        return self.utility[call_id]

    async def call(self, rank: int, method: str, **kwargs: Any) -> m.UtilityResult:
        return await self.wait_utility(await self.call_nowait(rank, method, **kwargs))


def sim_rank_core(cost: SimCostProfile = RANK_SIM_COST) -> EngineCore:
    """An engine core over the sim executor: a 300-token vocabulary (EOS 299, never sampled), 512 KV blocks."""
    cfg = EngineConfig(executor="sim", sim_cost=cost, num_kv_blocks=512, block_size=16,
                       max_num_batched_tokens=256).validate()
    return EngineCore(cfg, SimExecutor(cfg, VOCAB, max_model_len=1024, avoid_token_ids={EOS}), None,
                      eos_token_ids={EOS})


@dataclass
class RankCluster:
    """What :func:`open_rank_cluster` yields: the ranks, their groups, client 0 and how each part ended."""

    n: int
    client: FakeRankClient
    ranks: list[EngineRank]
    groups: list[MemoryDPGroup]
    coordinator_links: dict[int, Link]  # the engine ends
    outcomes: dict[int, BaseException | None] = field(default_factory=dict)  # None: run() returned
    ended: dict[int, anyio.Event] = field(default_factory=dict)
    coordinator_outcome: list[BaseException | None] = field(default_factory=list)
    rank_scopes: dict[int, anyio.CancelScope] = field(default_factory=dict)
    coordinator_peer_links: dict[int, Link] = field(default_factory=dict)  # the coordinator's ends
    coordinator_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    coordinator_ended: anyio.Event = field(default_factory=anyio.Event)

    async def kill_coordinator(self) -> None:
        self.coordinator_scope.cancel()
        for link in self.coordinator_peer_links.values():
            await link.aclose()

    def ls(self, r: int) -> Any:
        lockstep = self.ranks[r].lockstep
        assert lockstep is not None
        return lockstep.state

    async def wait_reported_idle(self) -> None:
        """Until client 0 has every rank's stats for the end of its current wave."""
        def reported(r: int) -> bool:
            stats = self.client.stats[r]
            return bool(stats) and not stats[-1].wave_running and stats[-1].wave == self.ls(r).current_wave

        while not all(reported(r) for r in range(self.n)) or any(self.ls(r).engines_running for r in range(self.n)):
            await self.client.stats_arrived.wait()

    async def wait_ended(self) -> None:
        for ev in self.ended.values():
            await ev.wait()

    async def wait_idle(self) -> None:
        """Until no rank is running a wave (every wave transition sends stats to client 0, which wakes us)."""
        while any(self.ls(r).engines_running for r in range(self.n)):
            await self.client.stats_arrived.wait()

    async def _run_coordinator(self, config: CoordinatorConfig, engine_listener: MemoryLinkListener,
                               client_listener: MemoryLinkListener, stopping: anyio.Event | None) -> None:
        with self.coordinator_scope:
            try:
                await serve_coordinator(config, engine_listener, client_listener, stopping=stopping)
                self.coordinator_outcome.append(None)
            except BaseException as exc:
                # Under trio the coordinator's teardown can come wrapped with stray Cancelled leaves from its
                # link tasks (anyio re-raises them from inner task groups); the real error is the other leaf.
                errors = [e for e in leaf_exceptions(exc) if not isinstance(e, anyio.get_cancelled_exc_class())]
                if not errors:
                    raise
                self.coordinator_outcome.append(errors[0])
            finally:
                self.coordinator_ended.set()

    async def _run_rank(self, r: int, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Subscribe rank ``r`` (as the rank process does, minus the handshake), then run it to its end."""
        link = self.coordinator_links[r]
        await link.send(m.Subscribe(dp_rank=r))
        while not isinstance(await link.receive(), m.CoordinatorReady):
            pass
        with anyio.CancelScope() as scope:
            self.rank_scopes[r] = scope
            task_status.started()
            try:
                await self.ranks[r].run()
                self.outcomes[r] = None
            except Exception as exc:  # noqa: BLE001 - recorded for the test to check
                self.outcomes[r] = exc
        self.ended[r].set()


@asynccontextmanager
async def open_rank_cluster(n: int = 2, *, sync_interval: int = 32, cadence: str = "asyncdp",
                            shutdown_timeout_s: float = 0.0, prefill_schedule_interval: int = 1,
                            cost: SimCostProfile = RANK_SIM_COST,
                            wrap_coordinator_link: Callable[[int, Link], Link] | None = None,
                            inline_step: bool = True, stopping: anyio.Event | None = None
                            ) -> AsyncIterator[RankCluster]:
    """Start the coordinator, ``n`` MoE ranks and client 0; yield once every rank runs. ``stopping`` is the
    coordinator's "the deployment is stopping in order" event. A single error of the body (or of one task) is
    re-raised as itself, not inside an ``ExceptionGroup``, as :func:`~asyncdp.testing.cluster.open_sim_cluster`
    does."""
    client = FakeRankClient(n)
    engine_listener = MemoryLinkListener(name="coordinator-engines")
    client_listener = MemoryLinkListener(name="coordinator-clients")
    groups = MemoryDPGroup.create(n)
    coord_ends: dict[int, Link] = {}
    peer_ends: dict[int, Link] = {}
    every_link: list[Link] = [*client.links.values(), *client.engine_ends.values(), client.coord, client.coord_end]
    for r in range(n):
        ours, theirs = memory_link_pair(name=f"coordinator-rank{r}")
        every_link += [ours, theirs]
        peer_ends[r] = theirs
        coord_ends[r] = ours if wrap_coordinator_link is None else wrap_coordinator_link(r, ours)
        engine_listener.offer(theirs)
    client_listener.offer(client.coord_end)
    ranks = []
    for r in range(n):
        cfg = RankConfig(dp_rank=r, dp_size=n, engine=sim_rank_core(cost).config, is_moe=True,
                         shutdown_timeout_s=shutdown_timeout_s, sync_interval=sync_interval,
                         prefill_schedule_interval=prefill_schedule_interval, sync_cadence=cadence)
        ranks.append(EngineRank(cfg, sim_rank_core(cost), {0: client.engine_ends[r]}, coord_ends[r],
                                inline_step=inline_step, dp_group=groups[r]))
    cluster = RankCluster(n, client, ranks, groups, coord_ends, coordinator_peer_links=peer_ends)
    ccfg = CoordinatorConfig(dp_size=n, wave_mode=True, subscribe_timeout_s=30.0)

    try:
        with unwrap_sole_error():  # as open_sim_cluster: the body's one error comes out as itself
            async with anyio.create_task_group() as tg:
                tg.start_soon(cluster._run_coordinator, ccfg, engine_listener, client_listener, stopping)
                tg.start_soon(client.run)
                for r in range(n):
                    cluster.ended[r] = anyio.Event()
                async with anyio.create_task_group() as starting:
                    for r in range(n):
                        starting.start_soon(tg.start, cluster._run_rank, r)
                yield cluster
                tg.cancel_scope.cancel()
    finally:
        engine_listener.close()
        client_listener.close()
        for link in every_link:
            await link.aclose()

