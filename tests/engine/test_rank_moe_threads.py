"""MoE ranks whose steps and dummy batches run on execution threads (the real process's mode), in real time.

The simulated executor does not sleep, so these runs are short; no virtual clock here (a thread wait would
count as idle and let virtual time jump).
"""

from __future__ import annotations

import threading

import pytest
import trio

from asyncdp.errors import RankTornDown
from asyncdp.testing import open_rank_cluster as open_cluster


@pytest.mark.trio
async def test_moe_ranks_step_in_lockstep_on_execution_threads():
    async with open_cluster(2, sync_interval=4, inline_step=False) as c:
        with trio.fail_after(20):
            results = [await c.client.add(r, f"r{r}", max_tokens=6 + 3 * r) for r in range(2)]
            for res in results:
                await res.done.wait()
            await c.wait_idle()
        assert [len(res.tokens) for res in results] == [6, 9]
        assert c.ranks[0].state.steps + c.ranks[0].state.dummy_steps == \
            c.ranks[1].state.steps + c.ranks[1].state.dummy_steps


@pytest.mark.trio
async def test_teardown_does_not_wait_for_an_execution_thread_stuck_in_a_forward():
    release = threading.Event()
    entered = trio.Event()
    token = trio.lowlevel.current_trio_token()
    try:
        async with open_cluster(3, inline_step=False) as c:
            def stuck_dummy() -> None:  # a forward that never returns (a hung device or collective)
                token.run_sync_soon(entered.set)
                release.wait(30)

            c.ranks[1].core.executor.execute_dummy = stuck_dummy
            await c.client.add(0, "r", max_tokens=10_000)
            with trio.fail_after(10):
                await entered.wait()
            with trio.fail_after(2):
                c.rank_scopes[2].cancel()
                await c.coordinator_links[2].aclose()
                for r in (0, 1):
                    await c.ended[r].wait()
            assert all(isinstance(c.outcomes[r], RankTornDown) for r in (0, 1))
            assert not release.is_set()  # rank 1 ended while its thread was still stuck
    finally:
        release.set()
