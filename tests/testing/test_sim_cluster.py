"""The simulation harness: a coordinator, two sim-executor ranks and two DP clients in one trio run, in virtual
time (trio ``MockClock(autojump_threshold=0)`` through pytest-trio's ``autojump_clock`` fixture)."""

from __future__ import annotations

import pytest
import trio

from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import SimRequest, open_sim_cluster, stream_rng


def workload(n: int, *, num_clients: int, seed: int = 0, max_tokens: tuple[int, int] = (8, 48)) -> list[SimRequest]:
    rng = stream_rng(seed, "workload")
    out = []
    for i in range(n):
        prompt = [rng.randrange(1, 30_000) for _ in range(rng.randrange(16, 160))]
        params = SamplingParams(max_tokens=rng.randrange(*max_tokens), ignore_eos=True)
        out.append(SimRequest(i % num_clients, prompt, params))
    return out


@pytest.mark.trio
async def test_smoke(autojump_clock):
    async with open_sim_cluster(2, 2) as cluster:
        outs = await cluster.complete(0, [1, 2, 3], SamplingParams(max_tokens=5))
        assert len(outs) == 5 and outs[-1].finished
        print(trio.current_time(), cluster.finished_counts(), cluster.snapshots)
