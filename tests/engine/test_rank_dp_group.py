"""MemoryDPGroup: the in-process DP control collective (pure anyio, for tests and the simulation harness)."""

from __future__ import annotations

import anyio
import pytest
import trio

from asyncdp.engine.dp_group import DPGroup, MemoryDPGroup, reduce_values
from asyncdp.errors import DPGroupAborted, DPGroupError


def test_reduce_values_sums_and_maxes_elementwise():
    assert reduce_values([[1, 0], [1, 1], [0, 1]], "sum") == [2, 2]
    assert reduce_values([[1, 5], [3, 2]], "max") == [3, 5]
    with pytest.raises(DPGroupError, match="op must be"):
        reduce_values([[1]], "min")


def test_members_satisfy_the_protocol_and_know_their_rank():
    members = MemoryDPGroup.create(3)
    assert [(g.dp_rank, g.dp_size) for g in members] == [(0, 3), (1, 3), (2, 3)]
    group: DPGroup = members[0]
    assert group.dp_size == 3
    with pytest.raises(ValueError):
        MemoryDPGroup.create(0)


@pytest.mark.anyio
async def test_successive_calls_pair_up_in_order_even_when_ranks_arrive_at_different_times(anyio_backend):
    members = MemoryDPGroup.create(3)
    results: dict[int, list[list[int]]] = {r: [] for r in range(3)}

    async def member(r: int) -> None:
        for k in range(5):
            await anyio.sleep(0.001 * ((r * 7 + k * 3) % 4))  # skew: ranks race ahead of each other
            results[r].append(await members[r].all_reduce([r + k, 1], "sum" if k % 2 == 0 else "max"))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for r in range(3):
                tg.start_soon(member, r)
    expected = [[3 + 3 * k, 3] if k % 2 == 0 else [2 + k, 1] for k in range(5)]
    assert results == {r: expected for r in range(3)}


@pytest.mark.trio
async def test_a_single_member_group_reduces_at_once(autojump_clock):
    (solo,) = MemoryDPGroup.create(1)
    assert await solo.all_reduce([4, 2], "max") == [4, 2]


@pytest.mark.trio
async def test_mismatched_ops_are_a_lockstep_violation_on_every_member(autojump_clock):
    a, b = MemoryDPGroup.create(2)
    errors: list[BaseException] = []

    async def call(g: MemoryDPGroup, op: str) -> None:
        try:
            await g.all_reduce([1], op)
        except DPGroupError as exc:
            errors.append(exc)

    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, a, "sum")
            nursery.start_soon(call, b, "max")
    assert len(errors) == 2 and all("lockstep violation" in str(e) for e in errors)


@pytest.mark.trio
async def test_abort_wakes_pending_calls_and_fails_future_ones_on_every_member(autojump_clock):
    a, b, c = MemoryDPGroup.create(3)
    raised: list[int] = []

    async def pending(g: MemoryDPGroup) -> None:
        with pytest.raises(DPGroupAborted, match="rank 2 aborted"):
            await g.all_reduce([1, 0])
        raised.append(g.dp_rank)

    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pending, a)
            nursery.start_soon(pending, b)
            await trio.sleep(0.5)  # both wait for rank 2, which never comes
            assert raised == []
            c.abort()
    assert sorted(raised) == [0, 1]
    for g in (a, b, c):
        assert g.aborted
        with pytest.raises(DPGroupAborted):
            await g.all_reduce([0, 0])
    c.abort()  # idempotent
