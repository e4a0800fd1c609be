"""The harness refuses misuse with a clear error instead of losing a request, hanging, or failing deep inside:
duplicate request ids, indices out of range, bad ``open_sim_cluster`` arguments, a crash of a rank with no work;
and both harnesses re-raise a single error of the test's body as itself, not inside an ``ExceptionGroup``.
Virtual time (``autojump_clock``); every case has a virtual deadline so a hang fails it."""

from __future__ import annotations

import pytest
import trio

from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import SimRequest, open_sim_cluster

P = SamplingParams(max_tokens=3, ignore_eos=True)
DEADLINE_S = 60.0


@pytest.mark.trio
async def test_complete_all_refuses_duplicate_request_ids_before_sending_any(autojump_clock):
    with trio.fail_after(DEADLINE_S):
        async with open_sim_cluster(dp_size=2, num_clients=1) as cluster:
            reqs = [SimRequest(0, [1, 2], P, request_id="x"), SimRequest(0, [5, 6], P, request_id="x")]
            with pytest.raises(ValueError, match="'x'.*more than once"):
                await cluster.complete_all(reqs)
            assert cluster.routed == {} and cluster.finished_counts() == [0, 0]


@pytest.mark.trio
async def test_complete_all_refuses_a_generated_id_given_explicitly_too(autojump_clock):
    with trio.fail_after(DEADLINE_S):
        async with open_sim_cluster(dp_size=1, num_clients=1) as cluster:
            with pytest.raises(ValueError, match="'c0-0'"):
                await cluster.complete_all([SimRequest(0, [1], P), SimRequest(0, [2], P, request_id="c0-0")])
            assert cluster.routed == {}
