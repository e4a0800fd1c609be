"""GET /load's document: the newest of the coordinator's snapshot and the engine's own stats, per managed rank."""

from __future__ import annotations

from asyncdp import messages as m
from asyncdp.apiserver.client_config import ClientConfig
from asyncdp.apiserver.load_view import LoadView


def cfg(**changes) -> ClientConfig:
    base = dict(client_index=1, client_count=2, managed_ranks=(2, 3), dp_size=4, model_name="m", max_model_len=64,
                mode="hybrid", is_moe=True)
    base.update(changes)
    return ClientConfig(**base)


def doc(view: LoadView, now: float, **kwargs):
    states = kwargs.pop("states", {2: (True, 0.0), 3: (False, 0.0)})
    return view.document(cfg(), states, now=now, wave=kwargs.pop("wave", 5), wave_running=False,
                         inflight_of=lambda rank: {2: 1, 3: 0}[rank])


def test_a_snapshot_fills_only_the_managed_ranks_in_global_order_and_bumps_seq():
    view = LoadView((2, 3))
    view.on_snapshot(m.StatsSnapshot(counts=[(9, 9, 0.9), (8, 8, 0.8), (3, 1, 0.25), (0, 2, 0.5)], wave=5,
                                     running=False, seq=41), now=10.0)
    d = doc(view, 10.5)
    assert d["seq"] == 1 and d["age_s"] == 0.5
    assert d["coordinator"] == {"seq": 41, "age_s": 0.5}
    assert [(r["dp_rank"], r["waiting"], r["running"], r["kv_cache_usage"]) for r in d["ranks"]] == [
        (2, 3, 1, 0.25), (3, 0, 2, 0.5)]
    assert [(r["up"], r["inflight"], r["local_index"]) for r in d["ranks"]] == [(True, 1, 0), (False, 0, 1)]
    assert d["wave"] == {"current": 5, "running": False}
    assert (d["mode"], d["dp_size"], d["api_process_rank"], d["api_process_count"]) == ("hybrid", 4, 1, 2)


def test_engine_stats_update_the_rank_and_sum_the_prefix_counters():
    view = LoadView((2, 3))
    view.on_scheduler_stats(2, m.SchedulerStats(num_running=4, num_waiting=2, kv_cache_usage=0.125,
                                                prefix_cache_queries=100, prefix_cache_hits=60, wave=7,
                                                wave_running=True), now=1.0)
    view.on_scheduler_stats(2, m.SchedulerStats(num_running=3, prefix_cache_queries=50, prefix_cache_hits=10,
                                                wave=7, wave_running=True), now=2.0)
    view.on_scheduler_stats(9, m.SchedulerStats(num_running=1), now=2.0)  # not managed here: ignored
    d = doc(view, 2.25)
    rank2 = d["ranks"][0]
    assert d["seq"] == 2 and d["coordinator"] is None and d["age_s"] == 0.25
    assert (rank2["running"], rank2["waiting"], rank2["prefix_cache_queries"], rank2["prefix_cache_hits"]) == (
        3, 0, 150, 70)
    assert (rank2["wave"], rank2["wave_running"], rank2["age_s"]) == (7, True, 0.25)
    assert d["ranks"][1]["age_s"] is None  # never heard of


def test_an_external_snapshot_without_counts_keeps_the_engine_figures():
    view = LoadView((1,))
    view.on_scheduler_stats(1, m.SchedulerStats(num_running=2, num_waiting=1), now=1.0)
    view.on_snapshot(m.StatsSnapshot(counts=None, wave=3, running=True, seq=8), now=2.0)
    d = view.document(cfg(managed_ranks=(1,), mode="external"), {1: (True, 0.0)}, now=2.0, wave=3,
                      wave_running=True, inflight_of=lambda _r: 0)
    assert (d["ranks"][0]["running"], d["ranks"][0]["waiting"]) == (2, 1)  # no misleading zeros
    assert d["seq"] == 2 and d["coordinator"]["seq"] == 8


def test_the_prompt_tokens_still_to_compute_come_from_either_source():
    view = LoadView((2, 3))
    view.on_snapshot(m.StatsSnapshot(counts=[(0, 0, 0.0), (0, 0, 0.0), (1, 0, 0.1), (0, 1, 0.2)], wave=5,
                                     running=False, seq=1, prefill_tokens=[7, 7, 50_000, 12]), now=1.0)
    assert [r["prefill_tokens"] for r in doc(view, 1.0)["ranks"]] == [50_000, 12]
    view.on_scheduler_stats(2, m.SchedulerStats(num_running=1, prefill_tokens=47_952), now=1.1)
    assert [r["prefill_tokens"] for r in doc(view, 1.1)["ranks"]] == [47_952, 12]
    view.on_snapshot(m.StatsSnapshot(counts=[(0, 0, 0.0)] * 4, wave=5, running=False, seq=2), now=1.2)
    assert [r["prefill_tokens"] for r in doc(view, 1.2)["ranks"]] == [47_952, 12]  # an older coordinator: kept


def test_the_cache_fill_comes_from_either_source():
    view = LoadView((2, 3))
    view.on_snapshot(m.StatsSnapshot(counts=[(0, 0, 0.0)] * 4, wave=5, running=False, seq=1,
                                     cache_fill=[0.9, 0.9, 0.25, 0.5]), now=1.0)
    assert [r["cache_fill"] for r in doc(view, 1.0)["ranks"]] == [0.25, 0.5]
    view.on_scheduler_stats(3, m.SchedulerStats(num_running=1, cache_fill=0.625), now=1.1)
    assert [r["cache_fill"] for r in doc(view, 1.1)["ranks"]] == [0.25, 0.625]
