"""No silent loss (issue 7 item 6): a client that stops reading never stalls a rank and never loses a message
without noticing. Its full outbox makes the rank cut that client's link; the client's request then fails with
an error, and the other clients are served on. Virtual time (trio ``MockClock(autojump_threshold=0)``)."""

from __future__ import annotations

import pytest
import trio

from asyncdp.errors import EngineDeadError
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import open_sim_cluster

DEADLINE_S = 600.0  # virtual seconds: a hang fails the test instead of hanging it
PROMPT = list(range(1, 17))
MAX_TOKENS = 200


@pytest.mark.trio
async def test_a_client_that_stops_reading_is_cut_off_its_request_fails_and_other_clients_are_served(
        autojump_clock):
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    results: dict[int, object] = {}
    with trio.fail_after(DEADLINE_S):
        async with open_sim_cluster(1, 2, client_outbox_size=4, link_buffer=4) as cluster:

            async def run(client_index: int) -> None:
                try:
                    results[client_index] = await cluster.complete(client_index, PROMPT, params)
                except EngineDeadError as exc:
                    results[client_index] = exc

            cluster.stall_client(1)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, 1)
                nursery.start_soon(run, 0)
                await cluster.wait_link_cut(0, 1)
                cluster.unstall_client(1)  # the client reads again: what was queued, then EOF
            await cluster.wait_idle()
            rank = cluster.ranks[0]
            assert rank.links.is_cut(1) and not rank.links.is_cut(0)
            assert not rank.state.owners  # the cut client's request was aborted, not run to the end
    assert isinstance(results[1], EngineDeadError), results[1]
    outs = results[0]
    assert isinstance(outs, list) and outs[-1].finished and outs[-1].finish_reason == "length"
    assert sum(len(o.new_token_ids) for o in outs) == MAX_TOKENS


@pytest.mark.trio
async def test_a_client_that_keeps_reading_with_a_tiny_outbox_is_never_cut(autojump_clock):
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    with trio.fail_after(DEADLINE_S):
        async with open_sim_cluster(1, 2, client_outbox_size=4, link_buffer=4) as cluster:
            outs = await cluster.complete(1, PROMPT, params)
            assert not cluster.ranks[0].links.is_cut(1)
    assert sum(len(o.new_token_ids) for o in outs) == MAX_TOKENS


@pytest.mark.trio
async def test_a_rank_silent_past_the_heartbeat_timeout_fails_its_requests_at_once(autojump_clock):
    """Nothing arrives from the rank (frozen with its link open, as the client sees it): after
    --dp-heartbeat-timeout-s the client declares it dead and its request ends with an error naming the silence,
    instead of waiting for outputs forever."""
    params = SamplingParams(max_tokens=5000, ignore_eos=True)  # far longer than the timeout
    with trio.fail_after(60):
        async with open_sim_cluster(1, 1, heartbeat_timeout_s=3.0) as cluster:
            start = trio.current_time()
            cluster.stall_client(0)
            with pytest.raises(EngineDeadError, match="no heartbeat from engine rank 0"):
                await cluster.complete(0, PROMPT, params)
            assert 3.0 < trio.current_time() - start < 5.0
            cluster.unstall_client(0)
