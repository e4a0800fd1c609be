import random

import pytest

from asyncdp.bench.arrivals import (
    Burst,
    Closed,
    Dispatch,
    Ladder,
    Poisson,
    RelativeLadder,
    Trace,
    burst_times_ms,
    ladder_times_ms,
    poisson_times_ms,
    relative_ladder,
    relative_ladder_times,
    rung_indices,
    scale_rates,
    split_evenly,
    uniform_times_ms,
)
from asyncdp.errors import ConfigError


def test_poisson_times_increase_with_the_mean_gap_of_the_rate():
    times = poisson_times_ms(4.0, 4000, random.Random(1))
    assert all(a < b for a, b in zip(times, times[1:], strict=False))
    assert times[-1] / len(times) == pytest.approx(250.0, rel=0.05)
    assert times == poisson_times_ms(4.0, 4000, random.Random(1))


def test_times_are_whole_microseconds():
    for t in poisson_times_ms(3.0, 100, random.Random(2)):
        assert round(t * 1000) == pytest.approx(t * 1000, abs=1e-6)


def test_uniform_and_burst_times():
    assert uniform_times_ms(2.0, 3) == [500.0, 1000.0, 1500.0]
    assert burst_times_ms(3) == [0.0, 0.0, 0.0]


def test_ladder_runs_each_stage_for_its_duration_at_its_rate():
    times = ladder_times_ms([(10.0, 100.0), (40.0, 100.0)], random.Random(3))
    counts = [sum(1 for _, rung in times if rung == k) for k in (0, 1)]
    assert counts[0] == pytest.approx(1000, rel=0.1) and counts[1] == pytest.approx(4000, rel=0.1)
    assert all(t < 100_000 for t, rung in times if rung == 0)
    assert all(100_000 <= t < 200_000 for t, rung in times if rung == 1)


def test_relative_ladder_is_stored_at_unit_r_sat_with_the_rung_sizes_given():
    ladder = RelativeLadder(fractions=(0.5, 2.0), requests_per_rung=split_evenly(3001, 2))
    times = relative_ladder_times(ladder, random.Random(4))
    assert [sum(1 for _, r in times if r == k) for k in (0, 1)] == [1501, 1500]
    first_rung_end = times[1500][0]
    assert first_rung_end / 1501 == pytest.approx(2000.0, rel=0.1)  # rate 0.5 req/s at R_sat = 1


def test_relative_ladder_as_data_once_r_sat_is_known():
    assert relative_ladder(10.0, (0.3, 0.7), 30.0) == Ladder(rungs=((3.0, 30.0), (7.0, 30.0)))
    with pytest.raises(ConfigError, match="R_sat"):
        relative_ladder(0.0)


def test_rate_scale_multiplies_every_rate_and_leaves_closed_loop():
    assert scale_rates(Poisson(rate_rps=2.0), 1.5) == Poisson(rate_rps=3.0)
    assert scale_rates(Trace(speed=0.8), 2.0) == Trace(speed=1.6)
    assert scale_rates(Ladder(rungs=((2.0, 10.0),)), 2.0) == Ladder(rungs=((4.0, 5.0),))
    assert scale_rates(Dispatch(rate_rps=4.0, max_parallel=2), 0.5).rate_rps == 2.0
    assert scale_rates(RelativeLadder(fractions=(0.5,), requests_per_rung=(1,)), 2.0).fractions == (1.0,)
    assert scale_rates(Closed(concurrency=3, think_s=1.0), 2.0) == Closed(concurrency=3, think_s=1.0)
    assert scale_rates(Burst(max_concurrency=8), 2.0) == Burst(max_concurrency=8)
    with pytest.raises(ConfigError, match="rate-scale"):
        scale_rates(Burst(), 0.0)


def test_bad_rates_are_config_errors():
    with pytest.raises(ConfigError):
        poisson_times_ms(0.0, 1, random.Random(0))
    with pytest.raises(ConfigError, match="rung 0"):
        ladder_times_ms([(1.0, 0.0)], random.Random(0))


def test_rung_indices_by_count_for_relative_ladders_and_by_time_for_stages():
    ladder = RelativeLadder(fractions=(0.5, 1.0), requests_per_rung=(2, 1))
    assert rung_indices(ladder, [1.0, 2.0, 3.0]) == [0, 0, 1]
    stages = Ladder(rungs=((1.0, 1.0), (2.0, 1.0)))
    assert rung_indices(stages, [10.0, 999.0, 1000.0, 2500.0]) == [0, 0, 1, 1]
    assert rung_indices(Poisson(rate_rps=1.0), [1.0]) is None
