"""The MoE rank loop with dp > 1 (spec §8.3-8.7): every rank steps in lockstep with its peers.

Theory of operation. :class:`LockstepLoop` is the I/O shell around the pure :class:`~asyncdp.dp.lockstep.Lockstep`
state machine; it borrows the links, the inbox and the step helpers of its :class:`~asyncdp.engine.rank.EngineRank`
(through the :class:`LockstepHost` protocol, so this module never imports the rank) and adds the one collective, the DP group's all-reduce. One iteration::

    process inputs, blocking only while the group is idle and this rank has nothing steppable
    publish stats; step if there is steppable work (throttled per §8.5); publish stats
    if nothing executed: a dummy batch when the group is running, else back to the inputs
    advance the wave step; on a sync step all-reduce (sum) [local_unfinished, pending_pause, horizon row, step time,
        stopping, leaving]
    end_step: when the group went idle the wave is complete (rank 0 sends WaveComplete)

Invariant: each iteration that reaches ``advance`` runs exactly one forward (real or dummy), and the sync
schedule depends only on the shared step counter and earlier all-reduce results (the adaptive cadence of
:mod:`asyncdp.dp.lockstep`), so the k-th all-reduce of every rank is the same collective. The drain horizon this
rank contributes (:func:`forwards_to_drain`) is local, but it only enters the schedule through the all-reduce;
so does the mean time of its steps since its last sync (measured here on the anyio clock, virtual in tests), from
which the group caps the gap between syncs at ``MAX_SYNC_GAP_S``.
The resume barrier (a max all-reduce) only runs while the whole group is stopped by a completed pause, so it
pairs with the peers' resume barriers.

Wave messages (§8.4): ``StartWave`` wakes this rank unless it is excluded, stale or paused; an ``AddRequest``
that reaches an idle, unpaused group wakes it through ``StartWaveRequest``, whatever its wave stamp (a stale one:
the client's wave already completed; a current one: the client's ``FirstRequest`` may have been lost, see
:meth:`~asyncdp.dp.lockstep.Lockstep.on_add_request`). After every wave
transition the rank sends its scheduler stats (wave, running flag, dummy-step and wave counters) to client 0.

Shutdown (§8.7): a draining rank keeps dummy-stepping while its peers have work. When the group is idle it wakes
it (``StartWaveRequest``, as a rank with new work would) and raises the leaving flag of that wave's first sync.
Its peers may never go idle (steady traffic), so once it is drained and ``LEAVE_WAIT_S`` past its drain deadline
(``ready_to_leave``) it raises the leaving flag of the next sync; from its drain deadline on it raises the
stopping flag of every sync, so that the group syncs every step until then and that sync comes one step after
the bound at most (the first sync after the deadline comes within ``MAX_SYNC_GAP_S`` of steps, at the step time
the last sync measured). Either way that sync is the group's last
collective on every rank; no rank leaves between collectives, so no peer can start a wave (a request arriving
meanwhile) whose all-reduce meets a departed rank. Only a group paused by consensus, which ignores the wake-up,
is left at once. The leaver says ``Goodbye``; every other rank
abandons its requests (an error naming the cause, never a cut-short answer), refuses new ones, never steps again,
and waits for the coordinator's ``Teardown`` or its own stop. A request that reached a peer just before the sync
that ended the group was admitted before the peer could know; so the outputs of a wave's first step (the idle
leave's sync) wait for its sync (``step(hold=True)``), and the group's end refuses (``unavailable``) every request
whose client has seen nothing yet, as it would a moment later; only those that showed output are abandoned. Without that agreement the leaver could only hang in
dummy steps until its launcher killed it, or vanish and leave its peers blocked in a collective.
Teardown is handled by the rank's coordinator reader,
which aborts the DP group so that a pending all-reduce raises at once; the loop turns that into
:class:`~asyncdp.engine.rank.RankTornDown`.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Protocol

import anyio

from asyncdp import messages as m
from asyncdp.dp.lockstep import LEAVE_WAIT_S, Lockstep, StartWaveRequest, WaveCompleted
from asyncdp.engine.dp_group import DPGroup
from asyncdp.errors import DPGroupAborted, RankTornDown

if TYPE_CHECKING:
    from asyncdp.engine.core import EngineCore
    from asyncdp.engine.scheduler import Scheduler

log = logging.getLogger(__name__)


def forwards_to_drain(scheduler: Scheduler) -> int:
    """Forwards this rank still needs for the work that keeps a wave running (§8.6), if nothing new arrives and no
    request stops early: per request, its prefill chunks after the first plus the tokens left to ``max_tokens``.
    It ignores queueing behind the batch limits, so it may come out short; that costs the group one extra sync."""
    if scheduler.pause_state == "paused-all":
        return 0
    reqs = scheduler.in_flight() if scheduler.pause_state == "paused-new" else scheduler.requests.values()
    budget = max(1, scheduler.max_num_batched_tokens)
    horizon = 0
    waiting_for_grammar = scheduler.grammar_waiting  # no wave work until compiled (then the group is woken for it)
    for req in reqs:
        if req.request_id in waiting_for_grammar:
            continue
        prompt_left = max(0, req.num_prompt_tokens - req.num_computed_tokens)
        chunks = -(-prompt_left // budget)
        horizon = max(horizon, max(0, chunks - 1) + max(1, req.max_tokens - req.num_output_tokens))
    return horizon


class _HostConfig(Protocol):
    @property
    def dp_rank(self) -> int: ...
    @property
    def dp_size(self) -> int: ...
    @property
    def sync_interval(self) -> int: ...
    @property
    def sync_cadence(self) -> str: ...
    @property
    def prefill_schedule_interval(self) -> int: ...


class _HostState(Protocol):
    shutting_down: bool
    waves_completed: int


class LockstepHost(Protocol):
    """What the lockstep loop borrows from its rank (an :class:`~asyncdp.engine.rank.EngineRank`): the loop
    depends on this shape, not on the rank module, so the rank can own its loop without an import cycle."""

    @property
    def cfg(self) -> _HostConfig: ...
    @property
    def core(self) -> EngineCore: ...
    @property
    def state(self) -> _HostState: ...
    @property
    def coordinator(self) -> object | None: ...
    leave_at: float  # a stopping rank leaves from then on (its drain deadline + LEAVE_WAIT_S); inf until it stops

    async def send_coordinator(self, msg: m.Message) -> None: ...
    async def wait_input(self) -> None: ...
    def ready_to_leave(self) -> bool: ...
    def abandon_all(self, reason: str) -> None: ...
    async def drain_inbox(self) -> None: ...
    def apply_shutdown_policy(self) -> None: ...
    def complete_pauses(self) -> None: ...
    async def publish_stats(self, *, clients: bool = True) -> None: ...
    async def step(self, *, throttle_new_prefills: bool = False, hold: bool = False) -> bool: ...
    def release_held(self) -> None: ...
    async def run_dummy(self) -> None: ...
    def send_stats_to_client(self) -> None: ...


class LockstepLoop:
    def __init__(self, rank: LockstepHost, group: DPGroup) -> None:
        cfg = rank.cfg
        if group.dp_size != cfg.dp_size or group.dp_rank != cfg.dp_rank:
            raise ValueError(f"DP group member {group.dp_rank}/{group.dp_size} does not match rank "
                             f"{cfg.dp_rank}/{cfg.dp_size}")
        self.rank = rank
        self.group = group
        self.state = Lockstep(cfg.dp_rank, cfg.dp_size, cfg.sync_interval, cadence=cfg.sync_cadence,
                              has_coordinator=rank.coordinator is not None)
        self._reported: tuple[int, bool] = (self.state.current_wave, self.state.engines_running)
        self._leave_idle = False  # stopping and drained, this rank woke the idle group to leave at its next sync
        # the step time this rank reports at each sync: steps since the last sync and their total (s)
        self._last_forward_at: float | None = None  # None while the group is idle (a wait is no step)
        self._timed_steps = 0
        self._timed_s = 0.0
        self._step_ms = 0

    async def run(self) -> None:
        try:
            await self._loop()
        except DPGroupAborted as exc:
            raise RankTornDown(f"rank {self.rank.cfg.dp_rank}: {exc}") from exc

    async def _loop(self) -> None:
        rank, core, ls = self.rank, self.rank.core, self.state
        while True:
            if not ls.should_step(core.has_steppable_work()):
                self._last_forward_at = None
                if rank.state.shutting_down and not core.has_unfinished():
                    if not await self._wake_to_leave():
                        return  # a group paused by consensus: left without a sync
                else:
                    await rank.wait_input()
            await rank.drain_inbox()
            rank.apply_shutdown_policy()
            rank.complete_pauses()
            await rank.publish_stats(clients=not core.has_steppable_work())  # (else the step's outputs carry them)
            executed = False
            if core.has_steppable_work():
                # a wave's first step syncs: its outputs wait for that sync, which may end the group (a rank left)
                executed = await rank.step(throttle_new_prefills=self._throttled(), hold=ls.first_step_syncs())
                await rank.publish_stats()
            local_unfinished = core.num_unfinished_for_sync() > 0
            if not executed:
                if not ls.must_join(local_unfinished):
                    self._last_forward_at = None
                    rank.complete_pauses()
                    await self._report_transition()
                    continue  # the group is idle: no collective; block on input
                await rank.run_dummy()
            self._time_step()
            if ls.advance():
                horizon = forwards_to_drain(core.scheduler) if local_unfinished else 0
                leaving = self._leave_idle or rank.ready_to_leave()
                # the stopping flag from the drain deadline on (not the whole drain): the leave is LEAVE_WAIT_S away
                stopping = anyio.current_time() >= rank.leave_at - LEAVE_WAIT_S
                flags = ls.sync_flags(local_unfinished, horizon, leaving, stopping=stopping,
                                      step_ms=self._take_step_ms())
                ls.apply_sums(await self.group.all_reduce(flags, "sum"))
                if ls.group_left:  # that was the group's last collective
                    await self._after_group_left(leaving)
                    return
            rank.release_held()
            await self._end_wave(ls.end_step())
            rank.complete_pauses()
            await self._report_transition()

    def _time_step(self) -> None:
        """Count the time since the previous forward of this wave (a forward and the loop around it)."""
        now = anyio.current_time()
        if self._last_forward_at is not None:
            self._timed_steps += 1
            self._timed_s += now - self._last_forward_at
        self._last_forward_at = now

    def _take_step_ms(self) -> int:
        """The mean step time since the last sync (ms, rounded up; the last one when no step was timed)."""
        if self._timed_steps:
            self._step_ms = math.ceil(1000.0 * self._timed_s / self._timed_steps)
        self._timed_steps, self._timed_s = 0, 0.0
        return self._step_ms

    async def _wake_to_leave(self) -> bool:
        """Stopping, drained and the group idle: wake the group, so that this rank leaves at the first sync of
        the new wave, the group's last collective on every rank (a departure without a collective would let a
        peer start a wave meanwhile whose all-reduce meets the departed rank). True: go on and step to that sync.
        False (a group paused by consensus ignores the wake-up, so no sync would come): left at once, Goodbye."""
        rank, dp_rank = self.rank, self.rank.cfg.dp_rank
        ls = self.state
        if ls.ignore_start_wave:
            log.info("rank %d: drained and the group is paused; leaving the group", dp_rank)
            await rank.send_coordinator(m.Goodbye(dp_rank=dp_rank))
            return False
        if not self._leave_idle:
            log.info("rank %d: drained and the group is idle; waking it to leave at its next sync", dp_rank)
            self._leave_idle = True
        await self._request_wave(ls.wake())
        await self._report_transition()
        return True

    async def _after_group_left(self, leaving: bool) -> None:
        """After the sync that ended the group: the leaver says ``Goodbye``; any other rank abandons its requests,
        then only waits (no step, no collective) for the teardown that ends its run, or for its own stop."""
        rank, dp_rank = self.rank, self.rank.cfg.dp_rank
        if leaving:
            if self._leave_idle:
                log.info("rank %d: drained and the group is idle; leaving the group", dp_rank)
            else:
                log.info("rank %d: drained; leaving the group while its peers still have work (%g s past the drain "
                         "deadline)", dp_rank, LEAVE_WAIT_S)
            rank.release_held()  # (a leaver has nothing unfinished: answers that completed)
            await rank.send_coordinator(m.Goodbye(dp_rank=dp_rank))
            return
        log.warning("rank %d: a stopping rank left the MoE group; abandoning this rank's requests and waiting for "
                    "the teardown", dp_rank)
        rank.abandon_all(f"engine rank {dp_rank} cannot serve: its MoE group ended (a stopping rank left it)")
        await self._report_transition()
        while not rank.state.shutting_down:  # nothing is admitted meanwhile: the rank refuses new requests
            await rank.wait_input()
            await rank.drain_inbox()
        log.info("rank %d: stopped after its MoE group ended; leaving the group", dp_rank)
        await rank.send_coordinator(m.Goodbye(dp_rank=dp_rank))

    def _throttled(self) -> bool:
        """§8.5: with interval K > 1, only every K-th wave step may admit new prefills freely."""
        k = self.rank.cfg.prefill_schedule_interval
        return k > 1 and self.state.step_counter % k != 0

    async def _end_wave(self, done: WaveCompleted | None) -> None:
        if done is None:
            return
        self.rank.state.waves_completed += 1
        if done.report:
            await self.rank.send_coordinator(m.WaveComplete(wave=done.wave, dp_rank=self.rank.cfg.dp_rank))

    async def _report_transition(self) -> None:
        now = (self.state.current_wave, self.state.engines_running)
        if now != self._reported:
            self._reported = now
            self.rank.send_stats_to_client()

    async def _request_wave(self, req: StartWaveRequest | None) -> None:
        if req is not None:
            await self.rank.send_coordinator(m.StartWaveRequest(dp_rank=req.dp_rank, wave=req.wave))

    # ------------------------------------------------------------ wave messages (§8.4)

    def on_start_wave(self, msg: m.StartWave) -> None:
        self.state.on_start_wave(msg.wave, msg.exclude_rank)

    async def on_add_request(self, msg: m.AddRequest) -> None:
        """After the request is queued: apply its wave stamp; a request reaching an idle group wakes it."""
        await self._request_wave(self.state.on_add_request(msg.wave, not self.rank.core.is_paused()))

    # ------------------------------------------------------------ two-phase pause (§8.6)

    async def begin_pause(self, mode: str) -> None:
        """Phase 1 (the scheduler is already paused): reach the next sync, waking the group when idle."""
        await self._request_wave(self.state.begin_pause(mode))

    def pause_done(self) -> bool:
        return self.state.pause_complete(self.rank.core.has_steppable_work())

    async def resume(self) -> None:
        """Unpause and run the resume barrier. Raises PauseError while a pause is still in progress."""
        ls = self.state
        if not ls.resume():
            return  # not paused: a no-op
        core = self.rank.core
        core.resume()
        (max_unfinished,) = await self.group.all_reduce([int(core.num_unfinished_for_sync() > 0)], "max")
        if not ls.apply_resume_barrier(max_unfinished):
            # Nothing to do anywhere: close the wave, so that a StartWave the coordinator sent while the
            # group was paused (and that every rank ignored) does not leave it believing the group runs.
            await self._end_wave(ls.end_step())
        await self._report_transition()
