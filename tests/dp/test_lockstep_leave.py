"""A MoE rank leaving its group (spec §8.7): the leaving and stopping flags of the sync vector and the time cap on
the gap between syncs, which bound how long after its stop a rank of a busy group leaves."""

from __future__ import annotations

import pytest

from asyncdp.dp.lockstep import MAX_SYNC_GAP_S, Lockstep, steps_within
from asyncdp.dp.wave import StartWaveRequest
from asyncdp.errors import PauseError


def test_the_leaving_flag_is_the_last_sum_and_zero_keeps_the_group_as_it_was():
    ls, peer = Lockstep(0, 2, 8), Lockstep(1, 2, 8)
    flags = ls.sync_flags(True, 3, leaving=True)
    assert len(flags) == 5 + ls.num_horizon_flags and flags[:2] == [1, 0] and flags[-1] == 1
    assert ls.sync_flags(True, 3)[-1] == 0  # not leaving by default
    ls.engines_running = True
    assert ls.advance()
    sums = [a + b for a, b in zip(ls.sync_flags(True, 3), peer.sync_flags(True, 5), strict=True)]
    assert ls.apply_sums(sums)  # nobody leaves: the horizon rule as before (the group's horizon is 5)
    assert not ls.group_left and ls.should_step(False) and ls.next_sync == 1 + 5
    with pytest.raises(ValueError, match="sums"):
        ls.apply_sums([1, 0])


def test_a_sync_that_sees_a_rank_leave_is_the_groups_last_collective():
    # Rank 1 stops while rank 0 stays busy: at the sync where rank 1 raises its leaving flag, both ranks stop
    # stepping and joining collectives, whatever work rank 0 still has (spec §8.7).
    ranks = [Lockstep(r, 2, 8) for r in range(2)]
    for ls in ranks:
        ls.engines_running = True
        assert ls.advance()  # step 1 syncs
    sums = [a + b for a, b in zip(ranks[0].sync_flags(True, 50), ranks[1].sync_flags(False, 0, leaving=True),
                                  strict=True)]
    for ls in ranks:
        assert ls.apply_sums(sums) is False
        assert ls.group_left and not ls.engines_running
        assert not ls.should_step(True) and not ls.must_join(True)  # even with local work
        assert not ls.on_start_wave(ls.current_wave + 1, None)  # an ended group never restarts
        assert ls.on_add_request(ls.current_wave - 1, True) is None and not ls.engines_running
        with pytest.raises(PauseError, match="ended"):
            ls.begin_pause("abort")
        with pytest.raises(PauseError, match="ended"):
            ls.resume()


def test_wake_starts_a_wave_from_an_idle_rank_only():
    ls = Lockstep(1, 2, 8)
    assert ls.wake() == StartWaveRequest(1, 0) and ls.engines_running  # idle: wake the peers
    assert ls.wake() is None  # already running: its next sync comes anyway
    ls.apply_sync(0, 0, horizon_counts=(), sum_leaving=1)
    assert ls.group_left and ls.wake() is None  # an ended group never restarts
    paused = Lockstep(0, 2, 8)
    paused.ignore_start_wave = True  # paused by consensus: the peers would ignore StartWave
    assert paused.wake() is None and not paused.engines_running


def _sync(ranks, *flags_kw):
    """One sync of ``ranks`` (each already advanced), rank r contributing ``sync_flags(**flags_kw[r])``."""
    sums = [sum(col) for col in zip(*(ls.sync_flags(**kw) for ls, kw in zip(ranks, flags_kw, strict=True)),
                                    strict=True)]
    for ls in ranks:
        ls.apply_sums(sums)


def test_a_stopping_rank_makes_every_rank_sync_every_step_until_it_leaves():
    # Both ranks busy with long requests: without a stop, the group syncs every sync_interval steps; once a sync
    # carries a stopping flag, every step syncs on every rank (spec §8.7: the leave comes one step after its bound).
    ranks = [Lockstep(r, 2, 32) for r in range(2)]
    busy = {"local_unfinished": True, "local_horizon": 500}
    for ls in ranks:
        ls.engines_running = True
        assert ls.advance()  # step 1
    _sync(ranks, busy, busy)
    assert [ls.next_sync for ls in ranks] == [33, 33] and not any(ls.dense for ls in ranks)
    for _ in range(31):
        assert [ls.advance() for ls in ranks] == [False, False]
    assert [ls.advance() for ls in ranks] == [True, True]  # step 33
    _sync(ranks, busy, {**busy, "stopping": True})  # rank 1 was stopped since the last sync (drain: still busy)
    assert all(ls.stopping and ls.dense for ls in ranks)
    for _ in range(5):
        assert [ls.advance() for ls in ranks] == [True, True]
        _sync(ranks, busy, {**busy, "stopping": True})
    assert [ls.advance() for ls in ranks] == [True, True]
    _sync(ranks, busy, {"local_unfinished": False, "local_horizon": 0, "leaving": True})
    assert all(ls.group_left for ls in ranks)


def test_a_slow_group_syncs_at_least_every_max_sync_gap():
    # 150 ms a step: 32 steps would be 4.8 s between syncs, too long for a stop to reach the group in time. The
    # ranks' step times enter the schedule only through the all-reduce, so every rank picks the same next sync.
    ranks = [Lockstep(r, 2, 32) for r in range(2)]
    for ls in ranks:
        ls.engines_running = True
        assert ls.advance()
    _sync(ranks, {"local_unfinished": True, "local_horizon": 500, "step_ms": 140},
          {"local_unfinished": True, "local_horizon": 500, "step_ms": 160})
    gap = int(MAX_SYNC_GAP_S * 1000 // 150)
    assert gap < 32 and [ls.next_sync for ls in ranks] == [1 + gap, 1 + gap]
    assert steps_within(MAX_SYNC_GAP_S, 0, 2, 32) == 32  # no step measured yet: the interval alone
    assert steps_within(MAX_SYNC_GAP_S, 2 * 5000, 2, 32) == 1  # slower than the cap: every step
    assert steps_within(MAX_SYNC_GAP_S, 2 * 2, 2, 32) == 250  # fast steps: the interval and the horizon decide


def test_only_a_waves_first_step_holds_its_outputs_for_its_sync_and_only_where_that_step_syncs():
    ls = Lockstep(0, 2)
    assert ls.first_step_syncs()  # a wave's first step: its sync may end the group (a rank leaves at it)
    assert ls.advance()
    assert not ls.first_step_syncs()
    ls.apply_sync(1, 0, 2)
    assert ls.end_step() is None and not ls.first_step_syncs()
    ls.apply_sync(0, 0, 2)
    assert ls.end_step() is not None and ls.first_step_syncs()  # the next wave's first step
    assert not Lockstep(0, 2, cadence="vllm").first_step_syncs()  # its first step does not sync: nothing to wait for
