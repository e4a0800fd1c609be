"""The harness refuses misuse with a clear error instead of losing a request, hanging, or failing deep inside:
duplicate request ids, indices out of range, bad ``open_sim_cluster`` arguments, a crash of a rank with no work;
and both harnesses re-raise a single error of the test's body as itself, not inside an ``ExceptionGroup``.
Virtual time (``autojump_clock``); every case has a virtual deadline so a hang fails it."""

from __future__ import annotations

import pytest
import trio

from asyncdp.errors import ConfigError
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import SimRequest, open_rank_cluster, open_sim_cluster

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


@pytest.mark.trio
@pytest.mark.parametrize("index", [-1, 1, 5])
async def test_client_index_out_of_range_is_refused(autojump_clock, index):
    with trio.fail_after(DEADLINE_S):
        async with open_sim_cluster(dp_size=2, num_clients=1) as cluster:
            with pytest.raises(ValueError, match=r"client_index.*0 \.\. 0"):
                await cluster.complete(index, [1, 2], P)
            with pytest.raises(ValueError, match=r"client_index.*0 \.\. 0"):
                await cluster.complete_all([SimRequest(0, [1], P), SimRequest(index, [1], P)])
            assert cluster.routed == {}


@pytest.mark.trio
@pytest.mark.parametrize("rank", [-1, 2, 7])
async def test_rank_index_out_of_range_is_refused(autojump_clock, rank):
    with trio.fail_after(DEADLINE_S):
        async with open_sim_cluster(dp_size=2, num_clients=1) as cluster:
            with pytest.raises(ValueError, match=r"dp_rank.*0 \.\. 1"):
                await cluster.kill_rank(rank)
            with pytest.raises(ValueError, match=r"dp_rank.*0 \.\. 1"):
                await cluster.crash_rank(rank)
            assert cluster.rank_errors == {}


@pytest.mark.trio
@pytest.mark.parametrize(("kwargs", "name"), [
    ({"dp_size": "2"}, "dp_size"), ({"dp_size": 0}, "dp_size"), ({"num_clients": 1.0}, "num_clients"),
    ({"dp_size": True}, "dp_size"), ({"max_model_len": 0}, "max_model_len"), ({"max_model_len": 1}, "max_model_len"),
    ({"vocab_size": 0}, "vocab_size"),
])
async def test_open_sim_cluster_checks_its_arguments(autojump_clock, kwargs, name):
    with trio.fail_after(DEADLINE_S):
        with pytest.raises(ConfigError, match=name):
            async with open_sim_cluster(**kwargs):
                pass


@pytest.mark.trio
async def test_crash_rank_on_an_idle_rank_fails_fast_and_leaves_it_serving(autojump_clock):
    with trio.fail_after(DEADLINE_S):
        async with open_sim_cluster(dp_size=1, num_clients=1) as cluster:
            t0 = trio.current_time()
            with pytest.raises(RuntimeError, match="rank 0 has no work"):
                await cluster.crash_rank(0)
            assert trio.current_time() == t0  # refused at once, not after waiting
            outs = await cluster.complete(0, [1, 2], P)  # the fault was not left armed
            assert outs[-1].finish_reason == "length" and cluster.rank_errors == {}


@pytest.mark.trio
async def test_crash_rank_cancelled_disarms_the_fault(autojump_clock):
    with trio.fail_after(DEADLINE_S):
        async with open_sim_cluster(dp_size=1, num_clients=1) as cluster:
            long = SamplingParams(max_tokens=2000, ignore_eos=True)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cluster.complete, 0, [1, 2], long)
                await trio.sleep(0.05)  # virtual: the request is decoding
                with trio.CancelScope() as scope:
                    scope.cancel()
                    await cluster.crash_rank(0)
                nursery.cancel_scope.cancel()
            await cluster.wait_idle(timeout_s=30)
            outs = await cluster.complete(0, [1, 2], P)
            assert outs[-1].finish_reason == "length" and cluster.rank_errors == {}


@pytest.mark.trio
async def test_open_sim_cluster_reraises_the_bodys_error_as_is(autojump_clock):
    with trio.fail_after(DEADLINE_S):
        with pytest.raises(KeyError, match="mine"):
            async with open_sim_cluster(dp_size=2, num_clients=1):
                raise KeyError("mine")


@pytest.mark.trio
async def test_open_rank_cluster_reraises_the_bodys_error_as_is(autojump_clock):
    with trio.fail_after(DEADLINE_S):
        with pytest.raises(KeyError, match="mine"):
            async with open_rank_cluster(2):
                raise KeyError("mine")
