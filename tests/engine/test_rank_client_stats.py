"""A rank keeps its clients' view of its queue current (``vllm:num_requests_running`` / ``waiting``) even when no
step produces an output to carry the stats: requests queued while it is paused, a long prompt still prefilling.
One EngineRank over in-memory links, in virtual time."""

from __future__ import annotations

import pytest
import trio

from asyncdp import messages as m
from asyncdp.sampling_params import SamplingParams
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
