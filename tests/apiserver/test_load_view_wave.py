"""GET /load's per-rank wave (MoE) once a wave ends: the coordinator's snapshot brings the end to every API process.

A rank reports a wave's end in stats sent to one API process only (it has no output left to carry them to the
others); before, the other processes' ``/load`` kept the rank's last wave running for good. A dense deployment's
snapshots carry no wave of its ranks' and leave their figures alone.
"""

from __future__ import annotations

from typing import Any

from asyncdp import messages as m
from asyncdp.apiserver.client_config import ClientConfig
from asyncdp.apiserver.load_view import LoadView


def doc(view: LoadView, now: float, *, is_moe: bool = True) -> dict[str, Any]:
    cfg = ClientConfig(client_index=1, client_count=2, managed_ranks=(0, 1), dp_size=2, model_name="m",
                       max_model_len=64, is_moe=is_moe)
    return view.document(cfg, {0: (True, 0.0), 1: (True, 0.0)}, now=now, wave=0, wave_running=False,
                         inflight_of=lambda _rank: 0)


def waves(view: LoadView, now: float, **kwargs: Any) -> list[tuple[int, bool]]:
    return [(r["wave"], r["wave_running"]) for r in doc(view, now, **kwargs)["ranks"]]


def test_a_wave_that_ended_in_another_api_process_does_not_stay_running_here() -> None:
    view = LoadView((0, 1), is_moe=True)
    # this process served wave 2: its last stats from each rank say running
    view.on_scheduler_stats(0, m.SchedulerStats(num_running=1, wave=2, wave_running=True), now=1.0)
    view.on_scheduler_stats(1, m.SchedulerStats(num_running=0, wave=2, wave_running=True), now=1.0)
    # the wave ended; the ranks told API process 0, the coordinator tells everyone
    view.on_snapshot(m.StatsSnapshot(counts=[(0, 0, 0.0), (0, 0, 0.0)], wave=3, running=False, seq=9), now=2.0)
    assert waves(view, 2.0) == [(3, False), (3, False)]
    # a wave-only snapshot (external mode: no counts) says the same, and the next wave's stats win again
    view.on_snapshot(m.StatsSnapshot(counts=None, wave=3, running=True, seq=10), now=3.0)
    assert waves(view, 3.0) == [(3, True), (3, True)]
    view.on_snapshot(m.StatsSnapshot(counts=None, wave=4, running=False, seq=11), now=4.0)
    view.on_scheduler_stats(1, m.SchedulerStats(num_running=1, wave=4, wave_running=True), now=5.0)
    assert waves(view, 5.0) == [(4, False), (4, True)]


def test_a_wave_only_snapshot_does_not_make_the_ranks_counts_look_fresh() -> None:
    view = LoadView((0, 1), is_moe=True)
    view.on_scheduler_stats(0, m.SchedulerStats(num_running=2, wave=1, wave_running=True), now=1.0)
    view.on_snapshot(m.StatsSnapshot(counts=None, wave=2, running=False, seq=1), now=4.0)
    assert doc(view, 4.0)["ranks"][0]["age_s"] == 3.0


def test_a_dense_deployments_snapshots_leave_the_ranks_wave_alone() -> None:
    view = LoadView((0, 1))
    view.on_snapshot(m.StatsSnapshot(counts=[(0, 1, 0.0), (0, 0, 0.0)], wave=6, running=True, seq=1), now=1.0)
    assert waves(view, 1.0, is_moe=False) == [(0, False), (0, False)]
