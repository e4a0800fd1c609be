"""Dummy forwards and pause latency of a MoE DP group: asyncdp's sync cadence against vLLM's (spec §8.3, §14.8).

Runs N in-memory EngineRanks (simulated executor, a dummy forward costs 2 ms, the real coordinator, an
in-memory DP group) in trio's virtual time, so the numbers are exact and repeatable. Workloads:

* ``burst-K``: 20 isolated requests of K tokens, each on rank 0, each waking the idle group; counts the dummy
  forwards of every rank per wave (the idle ranks' cost of one short burst);
* ``pause``: pause(keep) sent to every rank of an idle group; virtual ms until every call answered, and the
  dummy forwards it cost.

Usage: python bench/moe_wave_cadence.py [--ranks N] [--sync-interval S]
Prints a table and writes bench/results/moe_wave_cadence.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import trio
import trio.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))

from rank_harness import open_cluster  # noqa: E402

BURSTS = 20


def total_dummies(c) -> int:
    return sum(rank.state.dummy_steps for rank in c.ranks)


async def burst(n: int, cadence: str, sync_interval: int, tokens: int) -> dict[str, float]:
    async with open_cluster(n, cadence=cadence, sync_interval=sync_interval) as c:
        start = trio.current_time()
        for i in range(BURSTS):
            res = await c.client.add(0, f"b{i}", max_tokens=tokens)
            await res.done.wait()
            await c.wait_idle()
            await trio.sleep(1.0)  # idle gap: the coordinator publishes the completed wave
        busy_s = trio.current_time() - start - BURSTS * 1.0
        return {"dummy_per_wave": total_dummies(c) / BURSTS, "wave_ms": 1e3 * busy_s / BURSTS,
                "waves": c.ranks[0].state.waves_completed}


async def pause(n: int, cadence: str, sync_interval: int) -> dict[str, float]:
    async with open_cluster(n, cadence=cadence, sync_interval=sync_interval) as c:
        await trio.sleep(0.5)
        start = trio.current_time()
        ids = [await c.client.call_nowait(r, "pause", mode="keep") for r in range(n)]
        for call_id in ids:
            assert (await c.client.wait_utility(call_id)).ok
        return {"dummy_per_wave": float(total_dummies(c)), "wave_ms": 1e3 * (trio.current_time() - start),
                "waves": c.ranks[0].state.waves_completed}


def run(coro_fn, *args):
    return trio.run(coro_fn, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--sync-interval", type=int, default=32)
    args = ap.parse_args()
    rows = []
    for workload in ("burst-1", "burst-4", "burst-16", "pause"):
        row: dict[str, object] = {"workload": workload}
        for cadence in ("asyncdp", "vllm"):
            if workload == "pause":
                row[cadence] = run(pause, args.ranks, cadence, args.sync_interval)
            else:
                tokens = int(workload.split("-")[1])
                row[cadence] = run(burst, args.ranks, cadence, args.sync_interval, tokens)
        rows.append(row)
    print(f"{args.ranks} ranks, sync interval {args.sync_interval}, dummy forward 2 ms (virtual time)")
    print(f"{'workload':<10} {'dummy fwd/wave':>28} {'ms per wave / to pause':>30}")
    print(f"{'':<10} {'asyncdp':>8} {'vllm':>8} {'ratio':>8} {'asyncdp':>9} {'vllm':>9} {'ratio':>9}")
    for row in rows:
        a, v = row["asyncdp"], row["vllm"]
        assert isinstance(a, dict) and isinstance(v, dict)
        print(f"{row['workload']:<10} {a['dummy_per_wave']:>8.1f} {v['dummy_per_wave']:>8.1f} "
              f"{a['dummy_per_wave'] / max(v['dummy_per_wave'], 1e-9):>8.2f} {a['wave_ms']:>9.1f} "
              f"{v['wave_ms']:>9.1f} {a['wave_ms'] / max(v['wave_ms'], 1e-9):>9.2f}")
    out = Path(__file__).resolve().parent / "results" / "moe_wave_cadence.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"ranks": args.ranks, "sync_interval": args.sync_interval, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
