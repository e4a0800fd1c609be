"""MoE lockstep sync cadence: asyncdp's adaptive cadence against vLLM's (spec §8.3, §14.8), in virtual time.

Runs N in-memory MoE EngineRanks (the simulated executor with the sim cluster's default cost profile: 5 ms per
forward, so a dummy forward costs 5 ms; the real coordinator; an in-memory DP group) under trio's MockClock, so
every number is exact and repeatable. Each rank's forwards are logged per wave (real or dummy, end time) and
each wave's end (the step the group paused) is logged too. Workloads:

* ``burst-1``: 20 isolated 1-token requests, rank ``i % N``, each waking the idle group (one wave each);
* ``req-10``: 100 requests of 10 tokens sent at once, round-robin over the ranks (the issue's test);
* ``long-apart``: one long request per rank, ``200 + 23*r`` tokens: a long wave whose ranks finish apart;
* ``long-same``: one 200-token request per rank: every rank finishes on the same step;
* ``early-stop``: 8 requests per rank of up to 300 tokens with 10 stop token ids (about 1 in 30 tokens stops a
  request), so the drain horizon (``max_tokens`` based) overestimates: the asyncdp cadence's fallback case.

Per workload and cadence: the dummy steps every rank runs after the group's last real step of a wave (the idle
transition; the same on every rank, by lockstep), the delay from the last real step's end to the pause in ms, the
dummy fraction of all forwards, and the sync all-reduces per wave (each one is a collective on the hot path).

Usage: python bench/lockstep.py [--sync-interval S] [--ranks N ...] [--json OUT]
Prints a table (ratios ours/vllm) and writes it as JSON to ``--json`` (default bench/results/lockstep.json, which
git ignores; a file git tracks is refused before the runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import trio
import trio.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncdp import messages as m  # noqa: E402
from asyncdp.sampling_params import SamplingParams  # noqa: E402
from asyncdp.testing import RankResult as Result  # noqa: E402
from asyncdp.testing import open_rank_cluster as open_cluster  # noqa: E402
from asyncdp.testing.cluster import DEFAULT_SIM_COST  # noqa: E402
from bench.serving import check_output, positive_int  # noqa: E402

WORKLOADS = ("burst-1", "req-10", "long-apart", "long-same", "early-stop")
STOP_IDS = tuple(range(40, 50))
CADENCES = ("asyncdp", "vllm")


class WaveLog:
    """Per rank and wave: the forwards (kind, end time); per wave: when rank 0 closed it."""

    def __init__(self, n: int) -> None:
        self.forwards: list[dict[int, list[tuple[str, float]]]] = [defaultdict(list) for _ in range(n)]
        self.ended: dict[int, float] = {}

    def attach(self, c: Any) -> None:
        for r, rank in enumerate(c.ranks):
            self._wrap(r, rank)

    def _wrap(self, r: int, rank: Any) -> None:
        step, dummy, loop = rank.step, rank.run_dummy, rank.lockstep
        end_wave = loop._end_wave

        async def logged_step(**kw: Any) -> bool:
            executed = await step(**kw)
            if executed:
                self.forwards[r][rank.state.waves_completed].append(("R", trio.current_time()))
            return executed

        async def logged_dummy() -> None:
            await dummy()
            self.forwards[r][rank.state.waves_completed].append(("D", trio.current_time()))

        async def logged_end_wave(done: Any) -> None:
            if done is not None and r == 0:
                self.ended[rank.state.waves_completed] = trio.current_time()
            await end_wave(done)

        rank.step, rank.run_dummy, loop._end_wave = logged_step, logged_dummy, logged_end_wave

    def summary(self, c: Any) -> dict[str, float]:
        n = len(self.forwards)
        tail_steps: list[int] = []
        tail_ms: list[float] = []
        for wave, end in self.ended.items():
            logs = [self.forwards[r][wave] for r in range(n)]
            assert len({len(log) for log in logs}) == 1, "ranks ran different numbers of forwards in a wave"
            last_real = max((i for log in logs for i, (kind, _) in enumerate(log) if kind == "R"), default=-1)
            if last_real < 0:
                continue  # a wave with no real work (a pause/resume wake-up): no idle transition
            tail_steps.append(len(logs[0]) - 1 - last_real)
            tail_ms.append(1e3 * (end - max(log[last_real][1] for log in logs)))
        total = sum(r.state.steps + r.state.dummy_steps for r in c.ranks)
        waves = c.ranks[0].state.waves_completed
        return {
            "waves": waves,
            "dummy_per_transition_mean": statistics.fmean(tail_steps),
            "dummy_per_transition_max": max(tail_steps),
            "pause_delay_ms_mean": statistics.fmean(tail_ms),
            "pause_delay_ms_max": max(tail_ms),
            "dummy_fraction": sum(r.state.dummy_steps for r in c.ranks) / total,
            "syncs_per_wave": c.ls(0).num_syncs / waves,
            "virtual_s": trio.current_time(),
        }


async def add_stopping(c: Any, rank: int, request_id: str) -> Any:
    """Like FakeClient.add, with stop token ids and a seed per request (tokens are a pure function of it)."""
    res = c.client.results.setdefault(request_id, Result())
    params = SamplingParams(max_tokens=300, ignore_eos=True, stop_token_ids=STOP_IDS, seed=len(c.client.results))
    await c.client.links[rank].send(m.AddRequest(
        request_id=request_id, client_index=0, wave=c.client.current_wave, prompt_token_ids=list(range(1, 9)),
        sampling_params=params, arrival_time=0.0, pinned=True))
    if not c.client.wave_running:
        c.client.wave_running = True
        await c.client.coord.send(m.FirstRequest(exclude_rank=rank, wave=c.client.current_wave))
    return res


async def workload(name: str, n: int, cadence: str, sync_interval: int) -> dict[str, float]:
    async with open_cluster(n, cadence=cadence, sync_interval=sync_interval, cost=DEFAULT_SIM_COST) as c:
        assert len({c.ls(r).num_syncs for r in range(n)}) == 1
        log = WaveLog(n)
        log.attach(c)
        results = []
        if name == "burst-1":
            for i in range(20):
                res = await c.client.add(i % n, f"b{i}", max_tokens=1)
                await res.done.wait()
                await c.wait_idle()
                await trio.sleep(1.0)  # an idle gap: the coordinator publishes the completed wave
        else:
            if name == "req-10":
                jobs = [(i % n, 10) for i in range(100)]
            elif name == "long-apart":
                jobs = [(r, 200 + 23 * r) for r in range(n)]
            elif name == "long-same":
                jobs = [(r, 200) for r in range(n)]
            else:
                jobs = []
            results = [await c.client.add(r, f"q{i}", max_tokens=t) for i, (r, t) in enumerate(jobs)]
            if name == "early-stop":
                results = [await add_stopping(c, i % n, f"s{i}") for i in range(8 * n)]
            for res in results:
                await res.done.wait()
            await c.wait_idle()
            await trio.sleep(1.0)
        assert all(len(res.tokens) for res in results)
        assert len({c.ls(r).num_syncs for r in range(n)}) == 1, "ranks ran different numbers of all-reduces"
        return log.summary(c)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sync-interval", type=positive_int, default=32)
    ap.add_argument("--ranks", type=positive_int, nargs="+", default=[2, 4])
    ap.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "lockstep.json",
                    help="write the results here (default: %(default)s)")
    args = ap.parse_args()
    out = check_output(ap, "--json", args.json)  # before the runs: writable, and not a file git tracks
    rows: list[dict[str, Any]] = []
    for n in args.ranks:
        for name in WORKLOADS:
            row: dict[str, Any] = {"dp": n, "workload": name}
            for cadence in CADENCES:
                row[cadence] = trio.run(workload, name, n, cadence, args.sync_interval,
                                        clock=trio.testing.MockClock(autojump_threshold=0))
            rows.append(row)
    cost = DEFAULT_SIM_COST
    print(f"sync interval {args.sync_interval}; cost a={cost.a_ms} ms (a dummy forward) b={cost.b_ms_per_token} "
          f"ms/prefill token c={cost.c_ms_per_seq} ms/decode seq; virtual time; ratio = asyncdp/vllm")
    cols = [("dummy_per_transition_mean", "dummy/transition", 1), ("dummy_per_transition_max", "max", 0),
            ("pause_delay_ms_mean", "pause delay ms", 1), ("dummy_fraction", "dummy frac", 3),
            ("syncs_per_wave", "syncs/wave", 1)]
    head = f"{'dp':>2} {'workload':<10} {'waves':>5}"
    for _, title, _ in cols:
        head += f" | {title:>16} {'vllm':>7} {'ratio':>5}"
    print(head)
    for row in rows:
        a, v = row["asyncdp"], row["vllm"]
        line = f"{row['dp']:>2} {row['workload']:<10} {a['waves']:>5}"
        for key, _, digits in cols:
            ratio = a[key] / v[key] if v[key] else float("nan")
            line += f" | {a[key]:>16.{digits}f} {v[key]:>7.{digits}f} {ratio:>5.2f}"
        print(line)
    assert out is not None
    out.write_text(json.dumps({"sync_interval": args.sync_interval, "cost_ms": [cost.a_ms, cost.b_ms_per_token,
                               cost.c_ms_per_seq, cost.d_ms_per_kv_token], "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
