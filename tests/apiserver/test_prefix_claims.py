"""The API server's side of the coordinator's prefix directory (CoordinatorFollower.claim / direct): an answer
binds the request, and a coordinator that does not answer, or a lost link, never holds a request up for long."""

from __future__ import annotations

import anyio
import pytest

from asyncdp import messages as m
from asyncdp.apiserver.coordinator_follower import CLAIM_TIMEOUT_S, CoordinatorFollower
from asyncdp.dp.balance import LoadBalancer
from asyncdp.testing.links import sim_link_pair

PROMPT = list(range(1000, 1000 + 16 * 6))


def follower() -> CoordinatorFollower:
    return CoordinatorFollower(0, 1.0, lambda snap: None, lambda: False)


async def fake_coordinator(link, answer) -> None:
    """Reads the client's frames; answers each PrefixClaim with ``answer(claim)`` (None: stay silent)."""
    async with link:
        try:
            while True:
                msg = await link.receive()
                if isinstance(msg, m.PrefixClaim) and (reply := answer(msg)) is not None:
                    await link.send(reply)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass


@pytest.mark.trio
@pytest.mark.parametrize("silent", [False, True])
async def test_the_directorys_answer_directs_the_request_and_silence_times_out_to_the_policy(autojump_clock, silent):
    client_end, coord_end = sim_link_pair(name="coordinator", codec=True)
    f = follower()
    lb = LoadBalancer([0, 1, 2, 3], client_index=0, client_count=2, policy="asyncdp")
    seen: list[m.PrefixClaim] = []

    def answer(claim: m.PrefixClaim) -> m.PrefixOwner | None:
        seen.append(claim)
        return None if silent else m.PrefixOwner(seq=claim.seq, owner=(claim.proposal + 1) % 4, matched=0,
                                                 others=[0.0, 0.0, 512.0, 0.0])

    async with anyio.create_task_group() as tg:
        tg.start_soon(fake_coordinator, coord_end, answer)
        tg.start_soon(f.attach, client_end)
        await anyio.wait_all_tasks_blocked()
        t0 = anyio.current_time()
        directed = await f.direct(lb, "r0", PROMPT, 16, 0)
        waited = anyio.current_time() - t0
        assert len(seen) == 1 and seen[0].first_rank == 0 and seen[0].last_rank == 3
        assert seen[0].prompt_tokens == len(PROMPT) and len(seen[0].hashes) == 6
        assert sorted(seen[0].candidates) == [0, 1, 2, 3] and seen[0].proposal in seen[0].candidates  # all idle
        if silent:
            assert directed is None and waited == pytest.approx(CLAIM_TIMEOUT_S)
        else:
            assert directed == (seen[0].proposal + 1) % 4 and waited == 0
            assert lb.state.shared == [0.0, 0.0, 512.0, 0.0]  # the other API servers' new prefixes
        tg.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_lost_link_ends_a_waiting_claim_at_once_and_no_link_means_no_claim(autojump_clock):
    client_end, coord_end = sim_link_pair(name="coordinator", codec=False)
    f = follower()
    lb = LoadBalancer([0, 1], client_index=0, client_count=2, policy="asyncdp")
    assert await f.direct(lb, "r0", PROMPT, 16, 0) is None  # not subscribed yet: nothing sent, nothing awaited

    async def close_on_claim() -> None:
        msg = await coord_end.receive()  # the Subscribe
        while not isinstance(msg, m.PrefixClaim):
            msg = await coord_end.receive()
        await coord_end.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(close_on_claim)
        tg.start_soon(f.attach, client_end)
        await anyio.wait_all_tasks_blocked()
        t0 = anyio.current_time()
        assert await f.direct(lb, "r1", PROMPT, 16, 0) is None
        assert anyio.current_time() - t0 < CLAIM_TIMEOUT_S
        tg.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_run_after_a_placed_prefix_is_claimed_deep_over_the_wire(autojump_clock):
    """The claim of a conversation's history after a system prompt this API server placed says ``deep`` on the
    wire (the directory looks it up or records it, never places it), and its answer leaves the others' new-prefix
    counts alone: they are for new prefixes."""
    client_end, coord_end = sim_link_pair(name="coordinator", codec=True)
    f = follower()
    lb = LoadBalancer([0, 1, 2, 3], client_index=0, client_count=2, policy="asyncdp")
    for r in range(4):  # the system prompt (6 blocks) is on every rank
        lb.select(f"w{r}", [*PROMPT, *range(50_000 + 16 * r, 50_016 + 16 * r)], r)
        lb.on_finish(f"w{r}")
    seen: list[m.PrefixClaim] = []

    def answer(claim: m.PrefixClaim) -> m.PrefixOwner:
        seen.append(claim)
        return m.PrefixOwner(seq=claim.seq, owner=3, matched=40, others=[0.0, 0.0, 512.0, 0.0])

    async with anyio.create_task_group() as tg:
        tg.start_soon(fake_coordinator, coord_end, answer)
        tg.start_soon(f.attach, client_end)
        await anyio.wait_all_tasks_blocked()
        prompt = [*PROMPT, *range(70_000, 70_000 + 16 * 40)]
        assert await f.direct(lb, "t", prompt, 16, 0) == 3
        assert len(seen) == 1 and seen[0].deep and len(seen[0].hashes) == 40
        assert lb.state.shared == [0.0] * 4
        tg.cancel_scope.cancel()
