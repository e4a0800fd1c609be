"""The MoE rank's lockstep state (spec §8.2-8.4, §8.6), driven by a synchronous group simulator.

The simulator plays N ranks' loops in one thread: every rank that must join a forward does so in the same
iteration, and a sum all-reduce is the plain sum of the ranks' flag vectors. A forward that some ranks join and
others do not is a lockstep violation (a hang in a real deployment), so the simulator fails on it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncdp.dp.lockstep import Lockstep, PauseState, WaveCompleted, needs_sync
from asyncdp.dp.wave import BroadcastStartWave, FirstRequest, StartWaveRequest, WaveComplete, WaveMachine
from asyncdp.errors import PauseError


class Group:
    """N ranks + a wave machine standing in for the coordinator (its StartWave broadcasts are delivered at once)."""

    def __init__(self, n=2, *, sync_interval=32, cadence="asyncdp", horizons=True):
        self.ranks = [Lockstep(r, n, sync_interval, cadence=cadence) for r in range(n)]
        self.coord = WaveMachine(n, True)
        self.work = [0] * n  # steps of real work left per rank
        self.forwards = 0
        self.dummy = [0] * n
        self.reports: list[WaveCompleted] = []
        self.sync_log: list[bool] = []  # per forward: whether it all-reduced
        self.horizons = horizons  # ranks report their exact drain horizon (else: unknown)
        self.since_real = 0  # forwards since the group's last real one
        self.wave_had_real = False
        self.idle_tails: list[int] = []  # per completed wave with real work: dummy forwards after its last real one

    def _to_coordinator(self, msg):
        if msg is None:
            return
        for action in self.coord.handle(msg):
            if isinstance(action, BroadcastStartWave):
                for ls in self.ranks:
                    ls.on_start_wave(action.wave, action.exclude_rank)

    def add_request(self, rank, steps, client_wave=None, *, client_thinks_running=False):
        """A client request: FirstRequest to the coordinator when it believes the group idle, as in §6.5."""
        wave = self.coord.current_wave if client_wave is None else client_wave
        self.work[rank] += steps
        self._to_coordinator(self.ranks[rank].on_add_request(wave))
        if not client_thinks_running and not self.coord.running:
            for a in self.coord.handle(FirstRequest(rank, wave)):
                if isinstance(a, BroadcastStartWave):
                    for ls in self.ranks:
                        ls.on_start_wave(a.wave, a.exclude_rank)

    def pause(self, rank, mode="keep"):
        self._to_coordinator(self.ranks[rank].begin_pause(mode))

    def unfinished(self, r):
        state = self.ranks[r].pause_state
        return self.work[r] > 0 and state is not PauseState.PAUSED_ALL

    def horizon(self, r):
        if not self.unfinished(r):
            return 0
        return self.work[r] if self.horizons else None

    def iterate(self):
        """One loop iteration on every rank; returns whether any forward ran."""
        joined = []
        any_real = False
        for r, ls in enumerate(self.ranks):
            executed = self.unfinished(r)
            if executed:
                self.work[r] -= 1
                any_real = True
            if not executed:
                if not ls.must_join(self.unfinished(r)):
                    continue
                self.dummy[r] += 1
            joined.append(r)
        if not joined:
            return False
        assert len(joined) == len(self.ranks), f"lockstep violation: only ranks {joined} ran a forward"
        self.forwards += 1
        self.since_real = 0 if any_real else self.since_real + 1
        self.wave_had_real = self.wave_had_real or any_real
        syncing = [ls.advance() for ls in self.ranks]
        assert len(set(syncing)) == 1, f"ranks disagree on the sync step: {syncing}"
        self.sync_log.append(syncing[0])
        assert len({ls.step_counter for ls in self.ranks}) == 1
        if syncing[0]:
            flags = [ls.sync_flags(self.unfinished(r), self.horizon(r)) for r, ls in enumerate(self.ranks)]
            sums = [sum(col) for col in zip(*flags, strict=True)]
            for ls in self.ranks:
                ls.apply_sums(sums)
        for ls in self.ranks:
            done = ls.end_step()
            if done is not None and ls.dp_rank == 0:
                if self.wave_had_real:
                    self.idle_tails.append(self.since_real)
                self.wave_had_real = False
            if done is not None and done.report:
                self.reports.append(done)
                self.coord.handle(WaveComplete(done.wave, ls.dp_rank))
        return True

    def run_until_idle(self, limit=10_000):
        for _ in range(limit):
            if not self.iterate():
                return
        raise AssertionError("group never went idle")


# ---------------------------------------------------------------- cadence


def test_asyncdp_cadence_syncs_on_first_step_and_every_interval_while_all_busy():
    assert [s for s in range(1, 100) if needs_sync(s, 32)] == [1, 32, 64, 96]


def test_asyncdp_cadence_syncs_every_step_when_dense():
    assert all(needs_sync(s, 32, dense=True) for s in range(1, 100))


def test_vllm_cadence_ignores_dense():
    assert [s for s in range(1, 100) if needs_sync(s, 32, "vllm", dense=True)] == [32, 64, 96]


def test_vllm_cadence_syncs_only_every_interval():
    assert [s for s in range(1, 100) if needs_sync(s, 32, "vllm")] == [32, 64, 96]


def test_short_burst_stops_after_one_step():
    g = Group(2)
    g.add_request(0, 1)
    g.run_until_idle()
    assert g.forwards == 1 and g.dummy == [0, 1]
    assert [r.current_wave for r in g.ranks] == [1, 1]
    assert g.reports == [WaveCompleted(0, True)]
    assert (g.coord.current_wave, g.coord.running) == (1, False)


def test_vllm_cadence_short_burst_costs_a_full_interval():
    g = Group(2, cadence="vllm")
    g.add_request(1, 1)
    g.run_until_idle()
    assert g.forwards == 32 and g.dummy == [32, 31]


def test_long_work_on_one_rank_syncs_every_step_and_stops_when_it_ends():
    g = Group(3)
    g.add_request(0, 40)
    g.run_until_idle()
    assert g.forwards == 40 and g.dummy == [0, 40, 40]  # step 1 saw idle ranks: dense from then on
    assert all(g.sync_log)


def test_all_busy_group_syncs_sparsely_then_densely_once_a_rank_is_idle():
    g = Group(2, sync_interval=8)
    g.add_request(0, 20)
    g.add_request(1, 10)
    g.run_until_idle()
    syncs = [i + 1 for i, s in enumerate(g.sync_log) if s]
    # steps 1 and 9 see both busy (horizon 19, then 11: capped at 8); step 17 sees rank 1 idle (since step 10):
    # dense until rank 0 ends at step 20
    assert syncs == [1, 9, 17, 18, 19, 20]
    assert g.forwards == 20 and g.dummy == [0, 10]


def test_ranks_finishing_together_sync_on_their_last_step_through_the_horizon():
    g = Group(3, sync_interval=32)
    for r in range(3):
        g.add_request(r, 45)
    g.run_until_idle()
    syncs = [i + 1 for i, s in enumerate(g.sync_log) if s]
    assert syncs == [1, 33, 45]  # after step 33 the group horizon is 12: the next sync is the last real step
    assert g.dummy == [0, 0, 0]


def test_unknown_horizon_falls_back_to_the_sync_interval():
    g = Group(3, sync_interval=32, horizons=False)
    for r in range(3):
        g.add_request(r, 45)
    g.run_until_idle()
    syncs = [i + 1 for i, s in enumerate(g.sync_log) if s]
    assert syncs == [1, 33, 65]
    assert g.dummy == [20, 20, 20]


def test_group_horizon_is_the_largest_rank_horizon_within_the_row():
    from asyncdp.dp.lockstep import group_horizon, horizon_flags

    rows = [horizon_flags(h, 7) for h in (3, 0, 5)]
    counts = [sum(col) for col in zip(*rows, strict=True)]
    assert group_horizon(counts, 3, 8) == 5
    assert group_horizon([sum(c) for c in zip(*[horizon_flags(h, 7) for h in (3, None)], strict=True)], 2, 8) == 8
    assert group_horizon([sum(c) for c in zip(*[horizon_flags(h, 7) for h in (9, 1)], strict=True)], 2, 8) == 8


def test_dense_group_returns_to_sparse_when_every_rank_is_busy_again():
    g = Group(2, sync_interval=8)
    g.add_request(0, 30)
    for _ in range(3):
        g.iterate()
    g.add_request(1, 30)
    for _ in range(20):
        g.iterate()
    syncs = [i + 1 for i, s in enumerate(g.sync_log) if s]
    # dense while rank 1 idles; step 4 (rank 1 now busy) flips back to the interval cadence
    assert syncs == [1, 2, 3, 4, 12, 20]
    assert not g.ranks[0].dense


def test_idle_transition_after_a_dense_sync_costs_no_dummy_step():
    g = Group(4, sync_interval=32)
    for r, steps in enumerate((5, 9, 13, 50)):
        g.add_request(r, steps)
    g.run_until_idle()
    assert g.forwards == 50  # paused on the step the last real work ended


def test_only_rank0_reports_wave_complete():
    g = Group(3)
    g.add_request(2, 2)
    g.run_until_idle()
    assert [d.wave for d in g.reports] == [0]


# ---------------------------------------------------------------- wave messages (§8.4)


def test_start_wave_wakes_unless_excluded_or_older():
    ls = Lockstep(1, 2)
    assert not ls.on_start_wave(0, exclude_rank=1)
    assert not ls.engines_running
    ls.current_wave = 3
    assert not ls.on_start_wave(2, None)
    assert ls.on_start_wave(4, 0)
    assert (ls.current_wave, ls.engines_running) == (4, True)


def test_stale_request_on_idle_rank_restarts_group():
    ls = Lockstep(1, 2)
    ls.current_wave = 5
    assert ls.on_add_request(4) == StartWaveRequest(1, 5)
    assert ls.engines_running
    assert ls.on_add_request(4) is None  # already running


def test_newer_request_wave_is_adopted_and_an_idle_rank_wakes_the_group_for_it():
    ls = Lockstep(0, 2)
    assert ls.on_add_request(7) == StartWaveRequest(0, 7)  # (the client's FirstRequest may be lost)
    assert ls.current_wave == 7 and ls.engines_running


def test_stale_request_does_not_restart_paused_scheduler():
    ls = Lockstep(0, 2)
    ls.current_wave = 2
    assert ls.on_add_request(1, scheduler_unpaused=False) is None
    assert not ls.engines_running


def test_stale_client_end_to_end_completes():
    g = Group(2)
    g.add_request(0, 1)
    g.run_until_idle()
    g.add_request(1, 3, client_wave=0, client_thinks_running=True)  # stale snapshot: no FirstRequest
    g.run_until_idle()
    assert g.work == [0, 0]
    assert g.ranks[0].current_wave == g.ranks[1].current_wave == 2


# ---------------------------------------------------------------- pause (§8.6)


def test_pause_on_one_rank_keeps_group_running_until_all_pause():
    g = Group(2)
    g.pause(0)
    assert g.ranks[0].pending_pause and g.ranks[1].engines_running  # peers woken to reach the sync
    for _ in range(10):
        g.iterate()
    assert g.forwards == 10 and g.ranks[0].pending_pause  # partial pause: still stepping
    with pytest.raises(PauseError, match="resume called while a pause is still in progress"):
        g.ranks[0].resume()
    g.pause(1)
    g.run_until_idle()
    assert g.forwards == 11  # a partial pause syncs every step: consensus on the very next step
    assert all(ls.pause_complete(False) for ls in g.ranks)
    assert all(ls.ignore_start_wave and not ls.pending_pause for ls in g.ranks)


def test_paused_group_ignores_start_wave_and_stale_requests():
    g = Group(2)
    g.pause(0)
    g.pause(1)
    g.run_until_idle()
    ls = g.ranks[1]
    assert not ls.on_start_wave(ls.current_wave + 3, None)
    assert ls.on_add_request(0) is None
    assert not ls.engines_running


def test_keep_mode_freezes_work_and_resume_continues_it():
    g = Group(2)
    g.add_request(0, 100)
    g.iterate()
    g.pause(0, "keep")
    g.pause(1, "keep")
    g.run_until_idle()
    left = g.work[0]
    assert left > 0
    for ls in g.ranks:
        assert ls.resume() is True
    max_unf = max(int(g.work[r] > 0) for r in range(2))
    for ls in g.ranks:
        ls.apply_resume_barrier(max_unf)
    g.run_until_idle()
    assert g.work == [0, 0]


def test_resume_when_not_paused_is_a_noop():
    ls = Lockstep(0, 2)
    assert ls.resume() is False
    assert not ls.engines_running


def test_unknown_pause_mode_is_rejected():
    with pytest.raises(PauseError):
        Lockstep(0, 2).begin_pause("later")


# ---------------------------------------------------------------- property: any schedule stays in lockstep


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 70), st.integers(0, 40)), min_size=1, max_size=6),
       st.sampled_from(["asyncdp", "vllm"]))
def test_any_request_schedule_stays_in_lockstep_and_drains(schedule, cadence):
    g = Group(3, cadence=cadence)
    waves = [0, 0, 0]
    for rank, steps, gap in schedule:
        g.add_request(rank, steps)
        for _ in range(gap):
            g.iterate()
            now = [ls.current_wave for ls in g.ranks]
            assert all(a >= b for a, b in zip(now, waves, strict=True))
            waves = now
    g.run_until_idle()
    assert len({(ls.dense, ls.num_syncs) for ls in g.ranks}) == 1  # every rank ran the same syncs
    if cadence == "asyncdp":
        assert all(tail <= 2 for tail in g.idle_tails), g.idle_tails  # the bound per idle transition
    assert g.work == [0, 0, 0]
    assert not any(ls.engines_running for ls in g.ranks)
    assert len({ls.current_wave for ls in g.ranks}) == 1
    assert g.coord.current_wave == g.ranks[0].current_wave and not g.coord.running
