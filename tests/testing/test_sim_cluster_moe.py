"""The simulation harness with a MoE deployment: ranks in lockstep, waves, the coordinator in wave mode, real DP
clients sending FirstRequest; in virtual time (pytest-trio's ``autojump_clock``)."""

from __future__ import annotations

import pytest
import trio

from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import SimRequest, open_sim_cluster

DEADLINE_S = 120.0  # virtual seconds


def ten_token_requests(n: int, num_clients: int) -> list[SimRequest]:
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    return [SimRequest(i % num_clients, [1 + (7 * i + j) % 500 for j in range(24)], params) for i in range(n)]


@pytest.mark.trio
@pytest.mark.parametrize(("cadence", "paused_within_bound"), [("asyncdp", True), ("vllm", False)])
async def test_moe_group_serves_ten_token_requests_and_pauses_within_two_dummy_steps(
        autojump_clock, cadence, paused_within_bound):
    with trio.fail_after(DEADLINE_S):
        async with open_sim_cluster(2, num_clients=2, is_moe=True, sync_cadence=cadence) as c:
            results = await c.complete_all(ten_token_requests(100, 2))
            dummies_at_last_output = [r.state.dummy_steps for r in c.ranks]
            # The bound: two dummy forwards (5 ms each in the default cost profile) after the last real step.
            await trio.sleep(2 * 0.005 + 1e-4)
            paused = not any(c.group_running())
            assert paused == paused_within_bound
            await c.wait_idle()
            await trio.sleep(0.5)  # more than a sync interval of dummy forwards (32 x 5 ms): every cadence paused
            assert not any(c.group_running())
            extra = [r.state.dummy_steps - d for r, d in zip(c.ranks, dummies_at_last_output, strict=True)]

    assert all(not isinstance(out, Exception) for out in results.values())
    assert all(sum(len(o.new_token_ids) for o in outs) == 10 for outs in results.values())
    assert all(n > 100 // 3 for n in c.finished_counts()), c.finished_counts()
    assert c.inflight_counts() == [0, 0]
    if paused_within_bound:
        assert all(e <= 2 for e in extra), extra
    else:
        assert any(e > 2 for e in extra), extra
