"""``reset_prefix_cache`` through one DP client of a simulated deployment (two ranks, two API-server clients, the
coordinator, asyncdp's policy), in trio's virtual time: every rank drops its prefix cache, the calling client's
policy forgets the prefixes before the call returns and the other client's once the ranks' ``PrefixCacheReset``
reached it; a rank that has a request in flight refuses (``PrefixCacheBusyError``) unless the running requests are
preempted (``reset_running_requests``), and they still complete."""

from __future__ import annotations

from contextlib import aclosing

import pytest
import trio
import trio.testing

from asyncdp.errors import PrefixCacheBusyError
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import open_sim_cluster

PROMPT = list(range(1, 98))  # six whole 16-token blocks: a repeat hits 96 tokens
PARAMS = SamplingParams(max_tokens=2, ignore_eos=True)


@pytest.mark.trio
async def test_a_reset_through_one_client_reaches_every_rank_and_every_clients_policy(autojump_clock):
    with trio.fail_after(60):
        async with open_sim_cluster(2, 2, lb_policy="asyncdp") as cluster:
            first = await cluster.complete(0, PROMPT, PARAMS)
            rank = cluster.routed[first[0].request_id]
            hit = await cluster.complete(1, PROMPT, PARAMS)  # (the prefix directory names rank for client 1 too)
            assert cluster.routed[hit[0].request_id] == rank and hit[0].num_cached_tokens == 96
            indexes = [client.lb.state.index for client in cluster.clients]
            assert all(index.size(rank) > 0 for index in indexes)
            assert await cluster.clients[0].call_utility("reset_prefix_cache") is True
            assert indexes[0].size(rank) == 0  # the caller's policy forgot them before the call returned
            assert all(r.core.block_manager.num_cached_blocks == 0 for r in cluster.ranks)
            await trio.testing.wait_all_tasks_blocked()
            assert indexes[1].size(rank) == 0  # the other API server heard it from the ranks
            again = await cluster.complete(1, PROMPT, PARAMS)
            assert again[0].num_cached_tokens == 0


@pytest.mark.trio
async def test_a_rank_with_a_request_in_flight_refuses_unless_the_running_requests_are_preempted(autojump_clock):
    long = SamplingParams(max_tokens=400, ignore_eos=True)
    with trio.fail_after(120):
        async with open_sim_cluster(2, 1, lb_policy="round_robin") as cluster, trio.open_nursery() as nursery:
            done: list[int] = []
            decoding = trio.Event()

            async def one() -> None:
                tokens = 0
                async with aclosing(cluster.clients[0].generate("long", PROMPT, long)) as outputs:
                    async for out in outputs:
                        tokens += len(out.new_token_ids)
                        decoding.set()
                done.append(tokens)

            nursery.start_soon(one)
            await decoding.wait()
            busy = cluster.routed["long"]
            with pytest.raises(PrefixCacheBusyError, match=f"engine rank {busy}: .* KV blocks are in use"):
                await cluster.clients[0].call_utility("reset_prefix_cache")
            assert cluster.ranks[busy].core.block_manager.num_cached_blocks > 0  # refused: nothing changed
            assert await cluster.clients[0].call_utility("reset_prefix_cache", reset_running_requests=True) is True
            assert cluster.ranks[busy].core.scheduler.num_preemptions == 1
        assert done == [400]  # the preempted request was recomputed and completed
