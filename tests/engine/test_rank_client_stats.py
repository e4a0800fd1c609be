"""A rank keeps its clients' view of its queue current (``vllm:num_requests_running`` / ``waiting``) even when no
step produces an output to carry the stats: requests queued while it is paused, a long prompt still prefilling.
One EngineRank over in-memory links, in virtual time."""

from __future__ import annotations

import pytest
import trio

from asyncdp import messages as m
from asyncdp.errors import EngineDeadError
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import open_sim_cluster
from asyncdp.testing.rank_cluster import RankResult
from tests.engine.test_rank_dense import open_rank


async def wait_stats(client, predicate) -> None:
    while not (client.stats[0] and predicate(client.stats[0][-1])):
        await client.stats_arrived.wait()


@pytest.mark.trio
async def test_requests_queued_while_paused_show_as_waiting(autojump_clock):
    async with open_rank() as (_, client, _, _, _):
        with trio.fail_after(30):
            assert (await client.call(0, "pause", mode="keep")).ok
            await client.add(0, "a", max_tokens=3)
            await client.add(0, "b", max_tokens=3)
            await wait_stats(client, lambda s: s.num_waiting == 2)
            assert (await client.call(0, "resume")).ok
            await wait_stats(client, lambda s: s.num_waiting == 0 and s.num_running == 0)


@pytest.mark.trio
async def test_a_long_prompt_shows_as_running_before_its_first_token(autojump_clock):
    async with open_rank() as (_, client, _, _, _):  # 256 tokens a step: three steps of prefill
        with trio.fail_after(30):
            res = client.results.setdefault("long", RankResult())
            await client.links[0].send(m.AddRequest(
                request_id="long", client_index=0, wave=0, prompt_token_ids=[5] * 768, arrival_time=0.0,
                sampling_params=SamplingParams(max_tokens=2, ignore_eos=True)))
            await wait_stats(client, lambda s: s.num_running == 1)
            assert not res.tokens  # seen running while still prefilling
            await res.done.wait()


@pytest.mark.trio
async def test_stats_sent_alone_reach_a_live_client_after_the_first_one_was_cut(autojump_clock):
    """Client 0 stops reading and the rank cuts it: the stats it sends on their own (here: requests queued
    while paused) go to client 1, and stats ride only on outputs to a live client, so no counter delta is lost
    in the cut link."""
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    with trio.fail_after(600):
        async with open_sim_cluster(1, 2, client_outbox_size=4, link_buffer=4, with_coordinator=False) as cluster:

            async def doomed() -> None:
                with pytest.raises(EngineDeadError):
                    await cluster.complete(0, list(range(1, 17)), params)

            cluster.stall_client(0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(doomed)
                await cluster.wait_link_cut(0, 0)
                cluster.unstall_client(0)
            client = cluster.clients[1]
            await client.call_utility("pause", mode="keep")
            async with trio.open_nursery() as nursery:
                for i in range(2):
                    nursery.start_soon(cluster.complete, 1, [i + 1] * 8, SamplingParams(max_tokens=2))
                while True:  # (bounded by fail_after, in virtual time)
                    if client.load()["ranks"][0]["waiting"] == 2:
                        break
                    await trio.sleep(0.01)
                await client.call_utility("resume")
            await cluster.wait_idle()
            # every prefix-cache query delta reached a client that counts it: none went into the cut link
            seen = sum(c.load()["ranks"][0]["prefix_cache_queries"] for c in cluster.clients)
            assert seen == cluster.ranks[0].core.block_manager.prefix_cache_queries
