"""The coordinator wave state machine (spec §6.4): table rows as plain tests, invariants as a hypothesis
stateful test."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from asyncdp.dp.wave import (
    BroadcastStartWave,
    EngineLost,
    FirstRequest,
    LogProtocolError,
    MarkDead,
    PublishWave,
    StartWaveRequest,
    Teardown,
    WaveComplete,
    WaveMachine,
)


def moe(n=4, wave=0, running=False):
    return WaveMachine(n, True, current_wave=wave, running=running)


def test_first_request_wakes_all_but_the_chosen_rank():
    m = moe()
    assert m.handle(FirstRequest(exclude_rank=2, wave=0)) == [BroadcastStartWave(0, 2), PublishWave(0, True)]
    assert m.running


def test_first_request_while_running_is_ignored():
    assert moe(running=True).handle(FirstRequest(1, 0)) == []


def test_stale_first_request_wakes_every_rank():
    m = moe(wave=3)
    assert m.handle(FirstRequest(exclude_rank=1, wave=2)) == [BroadcastStartWave(3, None), PublishWave(3, True)]


def test_wave_complete_from_rank0_advances_wave_and_stops():
    m = moe(wave=2, running=True)
    assert m.handle(WaveComplete(2, 0)) == [PublishWave(3, False)]
    assert (m.current_wave, m.running) == (3, False)


def test_stale_wave_complete_is_ignored():
    m = moe(wave=2, running=True)
    assert m.handle(WaveComplete(1, 0)) == []
    assert (m.current_wave, m.running) == (2, True)


def test_wave_complete_from_other_rank_is_logged_once_per_rank():
    m = moe(running=True)
    first = m.handle(WaveComplete(0, 3))
    assert len(first) == 1 and isinstance(first[0], LogProtocolError)
    assert m.handle(WaveComplete(0, 3)) == []
    assert (m.current_wave, m.running) == (0, True)


def test_newer_start_wave_request_jumps_to_its_wave():
    m = moe(wave=1, running=True)
    assert m.handle(StartWaveRequest(dp_rank=2, wave=4)) == [BroadcastStartWave(4, 2), PublishWave(4, True)]


def test_start_wave_request_for_current_idle_wave_restarts_group():
    m = moe(wave=1)
    assert m.handle(StartWaveRequest(dp_rank=0, wave=1)) == [BroadcastStartWave(1, 0), PublishWave(1, True)]


def test_start_wave_request_for_running_or_old_wave_is_ignored():
    assert moe(wave=1, running=True).handle(StartWaveRequest(0, 1)) == []
    assert moe(wave=2).handle(StartWaveRequest(0, 1)) == []


def test_moe_engine_loss_tears_down_and_machine_becomes_terminal():
    m = moe()
    assert m.handle(EngineLost(1, "rank 1 link closed")) == [Teardown("rank 1 link closed", 1)]
    assert m.handle(FirstRequest(0, 0)) == []
    assert m.handle(EngineLost(2, "x")) == []


def test_goodbye_is_an_orderly_teardown():
    assert moe().handle(EngineLost(3, "goodbye", orderly=True)) == [Teardown("rank 3 shut down", 3, True)]


def test_dense_engine_loss_marks_dead_and_ignores_waves():
    m = WaveMachine(2, False)
    assert m.handle(FirstRequest(0, 0)) == []
    assert m.handle(EngineLost(0, "eof")) == [MarkDead(0, "eof")]
    assert m.handle(EngineLost(0, "eof")) == []
    assert not m.all_dead
    m.handle(EngineLost(1, "eof"))
    assert m.all_dead


def test_a_dead_dense_rank_is_revived_once_and_can_be_lost_again_but_a_moe_group_revives_nothing():
    m = WaveMachine(2, False)
    assert not m.revive(1)  # alive: nothing to revive
    m.handle(EngineLost(1, "eof"))
    assert m.revive(1) and not m.revive(1)
    assert m.handle(EngineLost(1, "eof again")) == [MarkDead(1, "eof again")]
    group = moe()
    group.handle(EngineLost(1, "eof"))
    assert not group.revive(1) and group.torn_down


N = 3
ranks = st.integers(0, N - 1)
waves = st.integers(0, 8)


class WaveMachineRules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m = WaveMachine(N, True)
        self.prev_wave = 0
        self.broadcast_waves: list[int] = []
        self.actions: list = []

    def _apply(self, event):
        before = (self.m.current_wave, self.m.running)
        was_down = self.m.torn_down
        actions = self.m.handle(event)
        self.actions = actions
        if was_down:  # terminal: nothing happens after a teardown
            assert actions == [] and (self.m.current_wave, self.m.running) == before
        for a in actions:
            if isinstance(a, BroadcastStartWave):
                self.broadcast_waves.append(a.wave)
                assert a.exclude_rank is None or 0 <= a.exclude_rank < N
        changed = (self.m.current_wave, self.m.running) != before
        publishes = [a for a in actions if isinstance(a, PublishWave)]
        if changed:
            assert publishes == [PublishWave(self.m.current_wave, self.m.running)]
        else:
            assert publishes == []

    @precondition(lambda self: not self.m.torn_down)
    @rule(e=ranks, w=waves)
    def first_request(self, e, w):
        was_running = self.m.running
        self._apply(FirstRequest(e, w))
        assert self.m.running
        if not was_running:
            assert isinstance(self.actions[0], BroadcastStartWave)

    @rule(r=ranks, w=waves)
    def wave_complete(self, r, w):
        self._apply(WaveComplete(w, r))

    @rule(r=ranks, w=waves)
    def start_wave_request(self, r, w):
        self._apply(StartWaveRequest(r, w))

    @rule(r=ranks, orderly=st.booleans())
    def engine_lost(self, r, orderly):
        was_down = self.m.torn_down
        self._apply(EngineLost(r, "lost", orderly))
        assert self.m.torn_down
        if not was_down:
            assert isinstance(self.actions[0], Teardown) and self.actions[0].dead_rank == r

    @invariant()
    def wave_never_decreases(self):
        assert self.m.current_wave >= self.prev_wave
        self.prev_wave = self.m.current_wave

    @invariant()
    def broadcast_waves_never_decrease(self):
        assert self.broadcast_waves == sorted(self.broadcast_waves)


TestWaveMachineRules = WaveMachineRules.TestCase
