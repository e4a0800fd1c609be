"""The one liveness rule: silence past the timeout means dead, any frame resets it, time is an argument."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncdp.dp.liveness import Liveness, check_heartbeat_settings, expired
from asyncdp.errors import ConfigError


def test_a_peer_is_alive_until_its_silence_passes_the_timeout() -> None:
    live = Liveness(timeout_s=5.0, last_heard_s=10.0)
    assert not live.expired(15.0)
    assert live.expired(15.01)
    assert live.deadline_s() == 15.0


def test_any_frame_resets_the_deadline_and_time_never_goes_back() -> None:
    live = Liveness(timeout_s=2.0, last_heard_s=0.0)
    live.heard(1.5)
    assert not live.expired(3.0)
    live.heard(1.0)  # a late, older timestamp does not move the deadline back
    assert live.deadline_s() == 3.5


def test_the_description_names_the_peer_and_the_silence() -> None:
    assert Liveness(timeout_s=5.0, last_heard_s=1.0).describe("the coordinator", 7.25) == (
        "no heartbeat from the coordinator for 6.2 s (timeout 5 s)")


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.floats(0.001, 1e3))
def test_the_function_form_agrees_with_the_object(last: float, now: float, timeout: float) -> None:
    assert expired(last, now, timeout) == Liveness(timeout_s=timeout, last_heard_s=last).expired(now)


@pytest.mark.parametrize(("interval", "timeout"), [(0.0, 5.0), (5.0, 5.0), (6.0, 5.0), (-1.0, 5.0)])
def test_heartbeat_settings_need_an_interval_below_the_timeout(interval: float, timeout: float) -> None:
    with pytest.raises(ConfigError, match="--dp-heartbeat-interval-s"):
        check_heartbeat_settings(interval, timeout)


def test_a_watcher_that_woke_late_excuses_the_silence_it_did_not_see_once_for_a_grace() -> None:
    live = Liveness(timeout_s=5.0, last_heard_s=0.0)
    assert not live.excuse_late_wake(planned_s=5.0, now_s=5.4)  # on time (within STALL_SLACK_S): judged as usual
    assert live.expired(5.4) and live.last_heard_s == 0.0
    assert live.excuse_late_wake(planned_s=5.0, now_s=12.0)  # this process did not run for 7 s
    assert not live.expired(12.0) and live.deadline_s() == pytest.approx(13.0)  # STALL_GRACE_S to read its frames
    assert live.expired(13.01)  # nothing came meanwhile: dead, one grace later
    short = Liveness(timeout_s=1.0, last_heard_s=0.0)
    assert short.excuse_late_wake(planned_s=1.0, now_s=3.0) and short.deadline_s() == pytest.approx(3.5)  # grace ≤ t/2
    heard = Liveness(timeout_s=5.0, last_heard_s=11.0)
    assert heard.excuse_late_wake(planned_s=5.0, now_s=12.0) and heard.last_heard_s == 11.0  # never moves it back
