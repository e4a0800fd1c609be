"""The coordinator's stats intake and publish schedule (spec §6.2-6.3)."""

from __future__ import annotations

import pytest

from asyncdp.dp.stats import StatsBook


def test_idle_book_publishes_heartbeat_every_five_seconds():
    book = StatsBook(2, wave_mode=False)
    assert book.next_publish_deadline(0.0) == 5.0
    assert book.take_snapshot(4.9) is None
    pub = book.take_snapshot(5.0)
    assert pub is not None and pub.counts == [(0, 0, 0.0), (0, 0, 0.0)]
    assert book.next_publish_deadline(5.0) == 10.0


def test_changed_stats_publish_after_at_most_100ms():
    book = StatsBook(2, wave_mode=False)
    book.take_snapshot(5.0)
    book.on_rank_stats(1, 3, 2, 0.25)
    assert book.next_publish_deadline(5.01) == pytest.approx(5.1)
    assert book.take_snapshot(5.05) is None
    assert book.take_snapshot(5.1).counts == [(0, 0, 0.0), (3, 2, 0.25)]
    assert not book.stats_changed
    assert book.next_publish_deadline(5.1) == pytest.approx(10.1)


def test_long_idle_then_change_publishes_immediately():
    book = StatsBook(1, wave_mode=False)
    book.on_rank_stats(0, 1, 0, 0.0)
    assert book.next_publish_deadline(3.0) == 3.0


def test_unknown_and_dead_ranks_are_dropped():
    book = StatsBook(2, wave_mode=False)
    assert not book.on_rank_stats(2, 1, 1, 0.1)
    book.on_rank_stats(0, 4, 4, 0.4)
    book.mark_dead(0)
    assert not book.on_rank_stats(0, 9, 9, 0.9)
    assert book.counts[0] == (4, 4, 0.4)  # frozen at the last report


def test_a_dead_rank_marked_alive_starts_from_zero_and_takes_stats_again():
    book = StatsBook(2, wave_mode=False)
    book.on_rank_stats(0, 4, 4, 0.4)
    book.mark_dead(0)
    book.mark_alive(0)
    assert book.counts[0] == (0, 0, 0.0) and book.stats_changed
    assert book.on_rank_stats(0, 2, 1, 0.2) and book.counts[0] == (2, 1, 0.2)


def test_external_mode_publishes_none_not_zeros():
    book = StatsBook(2, wave_mode=False, external=True)
    assert not book.on_rank_stats(0, 1, 1, 0.5)
    assert book.take_snapshot(5.0).counts is None


def test_wave_mode_waits_for_a_step_snapshot():
    book = StatsBook(2, wave_mode=True)
    book.take_snapshot(5.0)
    book.on_rank_stats(0, 1, 0, 0.0, step=1, wave=0)
    # No complete step yet: wait at least 50 ms after this input.
    assert book.next_publish_deadline(5.2) == pytest.approx(5.25)
    book.on_rank_stats(1, 2, 0, 0.0, step=1, wave=0)
    book.on_rank_stats(0, 0, 1, 0.0, step=2, wave=0)  # a newer step: step 1 is complete
    assert book.step_snapshot == [(1, 0, 0.0), (2, 0, 0.0)]
    assert book.next_publish_deadline(5.2) == pytest.approx(5.2)
    assert book.take_snapshot(5.2).counts == [(1, 0, 0.0), (2, 0, 0.0)]
    # The step snapshot went out; the live counts are still pending.
    assert book.stats_changed
    assert book.take_snapshot(5.3).counts == [(0, 1, 0.0), (2, 0, 0.0)]


def test_older_step_stats_are_applied_without_new_snapshot():
    book = StatsBook(2, wave_mode=True)
    book.on_rank_stats(0, 1, 0, 0.0, step=5, wave=1)
    book.on_rank_stats(1, 7, 0, 0.0, step=3, wave=1)
    assert book.counts[1] == (7, 0, 0.0)
    assert (book.last_wave, book.last_step) == (1, 5)
    assert book.step_snapshot is None


def test_newer_wave_orders_before_higher_step_of_older_wave():
    book = StatsBook(1, wave_mode=True)
    book.on_rank_stats(0, 1, 0, 0.0, step=40, wave=0)
    book.on_rank_stats(0, 2, 0, 0.0, step=1, wave=1)
    assert (book.last_wave, book.last_step) == (1, 1)
    assert book.step_snapshot == [(1, 0, 0.0)]


def test_prompt_tokens_ride_on_the_counts_publish_schedule():
    """A rank's prompt tokens still to compute are published beside its counts; a report where only they moved (a
    long prefill's next chunk) neither asks for a snapshot nor delays one, so the schedule stays the counts' own."""
    book = StatsBook(2, wave_mode=False)
    book.take_snapshot(5.0)
    book.on_rank_stats(0, 1, 0, 0.0, prefill_tokens=50_000)
    assert book.stats_changed
    pub = book.take_snapshot(5.1)
    assert pub.counts == [(1, 0, 0.0), (0, 0, 0.0)] and pub.prefill_tokens == [50_000, 0]
    book.on_rank_stats(0, 1, 0, 0.0, prefill_tokens=48_000)  # same counts, the next chunk computed
    assert not book.stats_changed and book.next_publish_deadline(5.2) == pytest.approx(10.1)
    assert book.prefill_tokens == [48_000, 0]
    book.on_rank_stats(1, 0, 1, 0.1, prefill_tokens=7)
    assert book.take_snapshot(5.2).prefill_tokens == [48_000, 7]
    book.on_rank_stats(1, 0, 1, 0.1, prefill_tokens=7)  # a repeated report still counts as news, as before
    assert book.stats_changed


def test_a_step_snapshot_keeps_the_prompt_tokens_of_its_step():
    book = StatsBook(2, wave_mode=True)
    book.on_rank_stats(0, 1, 0, 0.0, step=1, prefill_tokens=100)
    book.on_rank_stats(1, 2, 0, 0.0, step=1, prefill_tokens=200)
    book.on_rank_stats(0, 0, 1, 0.0, step=2, prefill_tokens=0)  # step 2 begins: step 1 is complete
    pub = book.take_snapshot(5.0)
    assert pub.counts == [(1, 0, 0.0), (2, 0, 0.0)] and pub.prefill_tokens == [100, 200]


def test_external_mode_publishes_no_prompt_tokens():
    book = StatsBook(2, wave_mode=False, external=True)
    assert not book.on_rank_stats(0, 1, 1, 0.5, prefill_tokens=9)
    assert book.take_snapshot(5.0).prefill_tokens is None


def test_cache_fill_rides_on_the_counts_publish_schedule_as_the_prompt_tokens_do():
    book = StatsBook(2, wave_mode=False)
    book.take_snapshot(5.0)
    book.on_rank_stats(0, 1, 0, 0.0, cache_fill=0.25)
    pub = book.take_snapshot(5.1)
    assert pub.counts == [(1, 0, 0.0), (0, 0, 0.0)] and pub.cache_fill == [0.25, 0.0]
    book.on_rank_stats(0, 1, 0, 0.0, cache_fill=0.5)  # same counts: the fill alone moved
    assert not book.stats_changed and book.next_publish_deadline(5.2) == pytest.approx(10.1)
    assert book.cache_fill == [0.5, 0.0]
    assert book.take_snapshot(10.1).cache_fill == [0.5, 0.0]  # on the next snapshot (the heartbeat here)


def test_a_step_snapshot_keeps_the_cache_fill_of_its_step_and_external_mode_publishes_none():
    book = StatsBook(2, wave_mode=True)
    book.on_rank_stats(0, 1, 0, 0.0, step=1, cache_fill=0.1)
    book.on_rank_stats(1, 2, 0, 0.0, step=1, cache_fill=0.2)
    book.on_rank_stats(0, 0, 1, 0.0, step=2, cache_fill=0.3)
    assert book.take_snapshot(5.0).cache_fill == [0.1, 0.2]
    external = StatsBook(2, wave_mode=False, external=True)
    assert not external.on_rank_stats(0, 1, 1, 0.5, cache_fill=0.4)
    assert external.take_snapshot(5.0).cache_fill is None
