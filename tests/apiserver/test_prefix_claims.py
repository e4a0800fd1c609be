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


async def fake_placer(link, placed: list[m.PrefixPlaced]) -> None:
    """A coordinator that tells the client of other API servers' long placements once it subscribed."""
    async with link:
        assert isinstance(await link.receive(), m.Subscribe)
        for msg in placed:
            await link.send(msg)
        try:
            while True:
                await link.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass


@pytest.mark.trio
@pytest.mark.parametrize("policy", ["asyncdp", "asyncdp@local"])
async def test_another_servers_long_placement_weighs_on_its_rank_until_the_next_snapshot(autojump_clock, policy):
    """A ``PrefixPlaced`` (another API server's claim put a long new prompt on a rank) reaches the policy over the
    wire: its tokens count on that rank, so this API server's short requests go elsewhere, until a snapshot shows
    the rank's own work. A rank this client does not manage is none of its business; ``asyncdp@local``, which never
    asks the directory, ignores it."""
    client_end, coord_end = sim_link_pair(name="coordinator", codec=True)
    lb = LoadBalancer([4, 5, 6, 7], client_index=0, client_count=2, policy=policy)
    f = CoordinatorFollower(0, 1.0, lambda snap: None, lambda: False,
                            on_placed=lambda msg: lb.on_prefix_placed(msg.rank, msg.prompt_tokens))
    placed = [m.PrefixPlaced(rank=1, prompt_tokens=50_000), m.PrefixPlaced(rank=5, prompt_tokens=20_000)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(fake_placer, coord_end, placed)
        tg.start_soon(f.attach, client_end)
        await anyio.wait_all_tasks_blocked()
        shared = list(lb.state.shared)
        picks = {lb.select(f"s{k}", list(range(100 * k, 100 * k + 64)), max_tokens=16) for k in range(12)}
        tg.cancel_scope.cancel()
    if policy == "asyncdp":
        assert shared == [0.0, 20_000.0, 0.0, 0.0]  # global rank 5 is this client's second
        assert 5 not in picks and len(picks) == 3
    else:
        assert shared == [0.0] * 4 and 5 in picks
    lb.on_snapshot([[0, 0, 0.0]] * 8, prefill_tokens=[0] * 8)  # the rank's own report now shows its work
    assert lb.state.shared == [0.0] * 4
