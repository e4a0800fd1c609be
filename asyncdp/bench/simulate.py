"""Drive one workload through one simulated cluster with one policy (spec routing-bench §1, §5).

Theory of operation
-------------------
:func:`simulate` runs, in a fresh ``trio.run`` under ``MockClock(autojump_threshold=0)``, the harness's
:func:`~asyncdp.testing.open_sim_cluster`: the real coordinator, rank loops, schedulers and block managers, the
simulated executor with the profile's cost model, and R real ``DPClient`` routers with the policy under test
(``lb_policy``, a :func:`~asyncdp.dp.balance.make_policy` name). Requests enter through
``DPClient.generate`` of router ``req_id % R`` with ``max_tokens = output_length``, ``ignore_eos`` and the record's
``routing_key`` (C4); the executor's ``token_source`` emits each request's answer segment, so a later turn that
quotes it hits the blocks the engine cached (spec §4.0).

When a request is sent (the workload's send rule, :mod:`asyncdp.bench.records`): at ``max(t_arrival_ms or 0,
done(after_req) + think_ms)``. Records without ``after_req`` are sent by one loop in (time, req_id) order, each
routed before the next one goes; a record with ``after_req`` is scheduled when its predecessor's last token
arrives. The arrival's ``max_concurrency`` caps outstanding requests (FIFO); a :class:`~asyncdp.bench.arrivals.
Dispatch` gate (W4) issues ready requests at its rate (Poisson or uniform gaps from the ``dispatch`` stream),
at most ``max_parallel`` outstanding, in random (``dispatch/pick`` stream, apart from the gaps so that every
policy gets the same gaps, C1) or FIFO order. Nothing is sent after
``duration_s``; requests sent before ``warmup_ms`` are logged but not ``measured``.

The result is a :class:`RunLog`: the per-request event log (virtual send, first-token and last-token times at
the client, routed rank, prompt, output and cached tokens, the latter being the engine's own
``num_cached_tokens`` at first admission as carried by ``RequestOutput``), plus the ranks' preemption counters.
:mod:`asyncdp.bench.metrics` computes every number from it (C7).

Determinism (§1.2): virtual time only; every random draw from a named stream; and trio's scheduler, which
reverses each batch of runnable tasks with probability ½ from a module-level RNG, has that RNG seeded from
``(seed, policy)`` before each run, so the same arguments give the same log in one Python build. The exact
discrete-event core of §1.2 is not built: requests due at the same instant are ordered by req_id, other same-
instant events by the seeded scheduler.

One more order had to be fixed: timers that expire at the same virtual instant (ranks whose steps end together,
a snapshot period that falls on a step end) are woken in the order of trio's deadline heap, whose tie-break is
the cancel scope's ``id()``, a memory address. So a run's result depended on the heap's layout: on what ran
before it in the interpreter, on the machine (CI read a mean TTFT of 0.0239 s and 0.0256 s for two runs of the
same arguments in two fresh processes), even on unrelated code. And a run inside a test process took another
scheduling rule, the one pytest-trio turns on when hypothesis is installed. :func:`trio_orders_fixed` makes the
timers' tie-break the order in which their deadlines were set, and keeps trio's own rule, for the length of the
run. (The test suite arms the same tie-break for every test: ``tests/conftest.py``.)
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import anyio.abc
import msgspec

from asyncdp.bench.arrivals import ROUTER_ASSIGN, Dispatch, RelativeLadder, router_of
from asyncdp.bench.materialise import Materialiser
from asyncdp.bench.profiles import Profile
from asyncdp.bench.records import DEADLINE_S, DEFAULT_MAX_MODEL_LEN, Record, Workload
from asyncdp.config.flags import EngineConfig
from asyncdp.coordinator.core import CoordinatorConfig
from asyncdp.errors import AsyncDPError, ConfigError, SimulationStalled
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing.cluster import SimCluster, open_sim_cluster
from asyncdp.testing.sim import stream_rng, timer_ties_in_arming_order

#: telemetry presets (§1.1) this simulator can play: publish interval of the coordinator's periodic snapshot
#: in seconds, or None for no coordinator (each router routes on its own in-flight counts only).
#: ``oracle`` is approximated by a 1 ms period: the coordinator republishes the ranks' step-end stats within 1 ms
#: (the freshest state a rank reports; exact decision-time state would need a probe the client does not have).
TELEMETRY: dict[str, float | None] = {"vllm_coord": 0.1, "periodic_1s": 1.0, "periodic_10s": 10.0, "none": None,
                                      "oracle": 0.001}

#: ``simulate(probe=...)``: called every ``probe_every_s`` virtual seconds with the seconds since the run began and
#: the running cluster, to read the ranks' state (``cluster.ranks[i].core.scheduler``: queues, block manager,
#: preemptions); it must not change it. The probe is one more task, so a probed run can order same-instant events
#: differently from an unprobed one.
Probe = Callable[[float, SimCluster], None]


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The cluster of a comparison (C2): the same for every policy of it."""

    dp_size: int
    profile: Profile
    routers: int = 1
    lockstep: bool = False
    telemetry: str = "vllm_coord"
    router_assign: str = "index"  # how arrivals reach the routers (C5): asyncdp.bench.arrivals.router_of

    def __post_init__(self) -> None:
        if self.dp_size < 1 or self.routers < 1:
            raise ConfigError(f"--dp and --routers must be >= 1 (got {self.dp_size} and {self.routers}).")
        if self.router_assign not in ROUTER_ASSIGN:
            raise ConfigError(f"unknown router assignment {self.router_assign!r}; use {' or '.join(ROUTER_ASSIGN)}.")
        if self.telemetry not in TELEMETRY:
            raise ConfigError(f"unknown telemetry preset {self.telemetry!r}; this simulator plays "
                              f"{', '.join(TELEMETRY)}.")


@dataclass(slots=True)
class RequestEvent:
    """One request as the client saw it; times in virtual seconds from the start of the run."""

    req_id: int
    router: int
    rank: int
    t_send_s: float
    prompt_tokens: int
    measured: bool
    t_first_s: float | None = None
    t_last_s: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    turn: int = 0  # the record's round (multi-turn workloads), for the per-round hit rate of §8


@dataclass(slots=True)
class RunLog:
    dp_size: int
    events: list[RequestEvent] = field(default_factory=list)
    preemptions: int = 0
    unsent: int = 0  # records never sent (after duration_s, or behind one that was not)


def engine_config(spec: ClusterSpec, workload: Workload) -> EngineConfig:
    p = spec.profile
    return EngineConfig(executor="sim", sim_cost=p.cost(), block_size=workload.block_size,
                        num_kv_blocks=workload.kv_blocks_per_rank or p.kv_blocks, max_num_seqs=p.max_num_seqs,
                        max_num_batched_tokens=p.max_num_batched_tokens, seed=0)


@contextmanager
def trio_orders_fixed(seed: int, policy: str) -> Iterator[None]:
    """Meanwhile, trio's orders of same-instant events are this module's, so that a run's result is a function of
    its arguments (module docstring, Determinism):

    - tasks that became runnable together: trio reverses the batch with probability ½ from a module-level RNG,
      seeded here from ``(seed, policy)``; and that rule, not the one trio switches to when pytest-trio finds
      hypothesis installed (its ``_ALLOW_DETERMINISTIC_SCHEDULING``: sort, then shuffle), so that a run inside a
      test process gives what the command gives;
    - timers due at the same instant: woken in the order their deadlines were set, not by the address of their
      cancel scopes (:func:`~asyncdp.testing.sim.timer_ties_in_arming_order`)."""
    run_module: Any = importlib.import_module("trio._core._run")  # private: no stubs to check against
    original_mode = run_module._ALLOW_DETERMINISTIC_SCHEDULING
    run_module._r.seed(stream_rng(seed, f"trio/{policy}").getrandbits(64))
    run_module._ALLOW_DETERMINISTIC_SCHEDULING = False
    try:
        with timer_ties_in_arming_order():
            yield
    finally:
        run_module._ALLOW_DETERMINISTIC_SCHEDULING = original_mode


def simulate(workload: Workload, policy: str, seed: int, spec: ClusterSpec, *,
             closed_concurrency: int | None = None, probe: Probe | None = None, probe_every_s: float = 1.0) -> RunLog:
    """Run ``workload`` (resolved: final send times) through a fresh cluster; see the module docstring.

    ``closed_concurrency``: ignore send times and dependencies, and keep that many requests outstanding (the
    R_sat measurement of §4.0). ``probe``: see :data:`Probe` (``bench/rank_timeline.py`` uses it)."""
    import trio.testing  # (binds trio too)

    run = partial(simulate_async, workload, policy, seed, spec, closed_concurrency=closed_concurrency, probe=probe,
                  probe_every_s=probe_every_s)
    with trio_orders_fixed(seed, policy):
        log: RunLog = trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0),
                               restrict_keyboard_interrupt_to_checkpoints=True)  # Ctrl-C: see runner.py
    return log


async def simulate_async(workload: Workload, policy: str, seed: int, spec: ClusterSpec, *,
                         closed_concurrency: int | None = None, probe: Probe | None = None,
                         probe_every_s: float = 1.0) -> RunLog:
    """:func:`simulate` in the running event loop (its clock decides whether time is virtual)."""
    if probe is not None and not probe_every_s > 0:
        raise ConfigError(f"probe_every_s must be > 0, not {probe_every_s!r}.")
    if closed_concurrency is None and not workload.resolved and isinstance(workload.arrival, RelativeLadder):
        raise ConfigError(f"workload {workload.name}: a relative ladder's send times are in units of R_sat until "
                          "it is resolved: asyncdp.bench.records.resolve(workload, rate_scale, r_sat_rps) first.")
    answers: dict[str, list[int]] = {}

    def token_source(request_id: str, index: int) -> int | None:
        tokens = answers.get(request_id)
        return tokens[index] if tokens is not None and index < len(tokens) else None

    coordinator = None
    publish_s = TELEMETRY[spec.telemetry]
    if publish_s is not None:
        coordinator = CoordinatorConfig(dp_size=spec.dp_size, wave_mode=spec.lockstep,
                                        publish_interval_s=publish_s)
    drivers: list[_Driver] = []
    try:
        with anyio.fail_after(DEADLINE_S):
            async with open_sim_cluster(
                    spec.dp_size, spec.routers, engine_config=engine_config(spec, workload),
                    vocab_size=workload.vocab_size, max_model_len=workload.max_model_len or DEFAULT_MAX_MODEL_LEN,
                    lb_policy=policy, with_coordinator=coordinator is not None, coordinator_config=coordinator,
                    is_moe=spec.lockstep, token_source=token_source, lb_seed=seed) as cluster:
                driver = _Driver(workload, cluster, answers, seed, closed_concurrency, spec.router_assign)
                drivers.append(driver)
                if probe is None:
                    await driver.run()
                else:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_probe_loop, probe, probe_every_s, cluster)
                        await driver.run()
                        tg.cancel_scope.cancel()
                driver.log.preemptions = sum(r.core.scheduler.num_preemptions for r in cluster.ranks)
                return driver.log
    except TimeoutError:
        state = drivers[0].state() if drivers else "the cluster never started"
        raise SimulationStalled(
            f"the simulated run of {workload.name} under {policy!r} (seed {seed}) did not finish within "
            f"{DEADLINE_S / 3600:.3g} virtual hours ({state}): a simulator or policy bug; please report it") from None


async def _probe_loop(probe: Probe, every_s: float, cluster: SimCluster) -> None:
    start = anyio.current_time()
    while True:
        await anyio.sleep(every_s)
        probe(anyio.current_time() - start, cluster)


class _Driver:
    """Sends the workload's records per the send rule and logs what the clients see (module docstring)."""

    def __init__(self, workload: Workload, cluster: SimCluster, answers: dict[str, list[int]], seed: int,
                 closed_concurrency: int | None, router_assign: str) -> None:
        self.w, self.router_assign = workload, router_assign
        self.cluster = cluster
        self.answers = answers
        self.mat = Materialiser(workload.seed, workload.vocab_size)
        self.closed = closed_concurrency
        self.log = RunLog(dp_size=cluster.dp_size)
        self.dependents: dict[int, list[Record]] = {}
        if closed_concurrency is None:
            for r in workload.records:
                if r.after_req is not None:
                    self.dependents.setdefault(r.after_req, []).append(r)
        arrival = workload.arrival
        cap = closed_concurrency or arrival.max_concurrency
        self.dispatch = arrival if isinstance(arrival, Dispatch) and closed_concurrency is None else None
        if self.dispatch is not None:
            cap = min(cap or self.dispatch.max_parallel, self.dispatch.max_parallel)
        self.slots = anyio.Semaphore(cap) if cap else None
        self.rng = stream_rng(seed, "dispatch")  # the gaps: the same sequence under every policy (C1)
        self.pick_rng = stream_rng(seed, "dispatch/pick")  # the ready-queue picks (their draws vary with its size)
        self.ready: list[Record] = []
        # Two waiters, two events: the dispatcher waits for a ready record, the drain for any change (one shared
        # event, each replacing it before waiting, lost the dispatcher's wake-up: W4 full hung to the deadline).
        self.ready_added = anyio.Event()
        self.state_changed = anyio.Event()
        self.end_s = math.inf if workload.duration_s is None or closed_concurrency else workload.duration_s
        self.t0 = 0.0
        self.tg: anyio.abc.TaskGroup | None = None

    def now(self) -> float:
        return anyio.current_time() - self.t0

    def state(self) -> str:
        """Where the run stands, for a stall's error message."""
        return (f"{len(self.log.events)} of {len(self.w.records)} records sent, {self._outstanding} in flight, "
                f"{len(self.ready)} ready, {self._later_count} waiting out a think time")

    async def run(self) -> None:
        self.t0 = anyio.current_time()
        async with anyio.create_task_group() as tg:
            self.tg = tg
            if self.dispatch is not None:
                tg.start_soon(self._dispatcher)
            roots = [r for r in self.w.records if r.after_req is None or self.closed]
            if not self.closed:
                roots.sort(key=lambda r: (r.t_arrival_ms or 0.0, r.req_id))
            for rec in roots:
                if not self.closed:
                    due = (rec.t_arrival_ms or 0.0) / 1e3
                    if due > self.end_s:
                        break
                    await anyio.sleep_until(self.t0 + due)
                await self._submit(tg, rec)
            if self.dispatch is not None:
                await self._wait_drained()
                tg.cancel_scope.cancel()
        self.log.unsent = len(self.w.records) - len(self.log.events)
        self.log.events.sort(key=lambda e: e.req_id)

    async def _submit(self, tg: anyio.abc.TaskGroup, rec: Record) -> None:
        if self.dispatch is not None:
            self.ready.append(rec)
            self.ready_added.set()
            self.state_changed.set()
            return
        if self.slots is not None:
            await self.slots.acquire()
        await tg.start(self._one, rec)

    async def _dispatcher(self) -> None:
        d = self.dispatch
        assert d is not None and self.slots is not None and self.tg is not None
        while True:
            while not self.ready:
                self.ready_added = anyio.Event()
                await self.ready_added.wait()
            await self.slots.acquire()
            pick = self.pick_rng.randrange(len(self.ready)) if d.order == "random" else 0
            rec = self.ready.pop(pick)
            await self.tg.start(self._one, rec)
            gap = self.rng.expovariate(d.rate_rps) if d.process == "poisson" else 1.0 / d.rate_rps
            await anyio.sleep(round(gap * 1e6) / 1e6)

    async def _wait_drained(self) -> None:
        while self.ready or self._outstanding or self._later_count:
            self.state_changed = anyio.Event()
            with anyio.move_on_after(1.0):
                await self.state_changed.wait()

    _outstanding = 0  # requests in flight
    _later_count = 0  # dependents waiting out their think time

    async def _one(self, rec: Record, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        rid = f"r{rec.req_id}"
        router = router_of(rec.req_id, rec.routing_key, self.cluster.num_clients, self.router_assign)
        self.answers[rid] = self.mat.answer(rec)
        params = SamplingParams(max_tokens=rec.output_length, ignore_eos=True)
        t_send = self.now()
        ev = RequestEvent(req_id=rec.req_id, router=router, rank=-1, t_send_s=t_send, prompt_tokens=rec.input_length,
                          turn=rec.turn, measured=self.closed is None and t_send * 1e3 >= self.w.warmup_ms)
        self.log.events.append(ev)
        self._outstanding += 1
        gen = self.cluster.clients[router].generate(rid, self.mat.prompt(rec), params, routing_key=rec.routing_key)
        task_status.started()  # as SimCluster.complete_all: this task runs into generate() until routed
        try:
            async with aclosing(gen):
                async for out in gen:
                    if out.new_token_ids:
                        t = self.now()
                        if ev.t_first_s is None:
                            ev.t_first_s = t
                        ev.t_last_s = t
                        ev.output_tokens += len(out.new_token_ids)
                    ev.cached_tokens = max(ev.cached_tokens, out.num_cached_tokens)
        except AsyncDPError as exc:
            ev.error = f"{type(exc).__name__}: {exc}"
        finally:
            ev.rank = self.cluster.routed.get(rid, -1)
            del self.answers[rid]
            self._outstanding -= 1
            if self.slots is not None:
                self.slots.release()
            self.state_changed.set()
        if ev.error is None:
            self._release_dependents(rec, ev)

    def _release_dependents(self, rec: Record, ev: RequestEvent) -> None:
        assert self.tg is not None
        done_s = ev.t_last_s if ev.t_last_s is not None else self.now()
        for nxt in self.dependents.pop(rec.req_id, ()):
            due = max((nxt.t_arrival_ms or 0.0) / 1e3, done_s + nxt.think_ms / 1e3)
            if due <= self.end_s:
                self._later_count += 1
                self.tg.start_soon(self._later, nxt, due)

    async def _later(self, rec: Record, due_s: float) -> None:
        await anyio.sleep_until(self.t0 + round(due_s * 1e6) / 1e6)
        assert self.tg is not None
        try:
            await self._submit(self.tg, rec)
        finally:
            self._later_count -= 1


def expand_sweep(workload: Workload, label: str = "") -> list[tuple[str, Workload]]:
    """A workload with ``sweep_rates_rps`` (W4) as one workload per rate, each run on a fresh cluster, labelled
    ``label`` (default: its name) and ``@<rate>rps`` (``w4@pressure@8rps``)."""
    if not workload.sweep_rates_rps or not isinstance(workload.arrival, Dispatch):
        return [(label or workload.name, workload)]
    return [(f"{label or workload.name}@{rate:g}rps",
             msgspec.structs.replace(workload, arrival=msgspec.structs.replace(workload.arrival, rate_rps=rate)))
            for rate in workload.sweep_rates_rps]


def measure_r_sat(workload: Workload, spec: ClusterSpec, seed: int,
                  run: Callable[..., RunLog] = simulate) -> float:
    """R_sat (§4.0): ``round_robin`` in closed loop at concurrency 64·dp over the workload's records,
    completions per second over the second half of the saturated part of the run: until the last record is
    sent (a finite workload drains after that, and its tail would understate the rate); when every record fits
    in the first wave, over the second half of the whole run."""
    log = run(workload, "round_robin", seed, spec, closed_concurrency=64 * spec.dp_size)
    ends = sorted(e.t_last_s for e in log.events if e.t_last_s is not None)
    if not ends or ends[-1] <= 0:
        raise ConfigError(f"{workload.name}: cannot measure R_sat (nothing completed).")
    saturated_until = max(e.t_send_s for e in log.events)
    if saturated_until <= 0:
        saturated_until = ends[-1]
    half = saturated_until / 2
    return sum(1 for t in ends if half <= t <= saturated_until) / half
