"""A request that reaches an idle MoE group wakes it even when the client's ``FirstRequest`` is lost (spec §6.5).

The client's ``FirstRequest`` is best effort: an API server whose event loop stalled past the heartbeat timeout
(a loaded machine) is dropped by the coordinator, and a request it sends while its coordinator link reconnects
tells nobody. Reproduced end to end (an external-LB group, one API process stopped for 6.5 s, then a request to
the idle group): the request hung until its client gave up, its rank waiting in the wave's first sync for peers
that were never woken. The rank that gets the request now asks the coordinator for the wave itself
(``StartWaveRequest``), as spec §8.4 has it do for a stale stamp.
"""

from __future__ import annotations

import pytest
import trio

from asyncdp.testing import open_rank_cluster as open_cluster


def forwards(cluster, r: int) -> int:
    return cluster.ranks[r].state.steps + cluster.ranks[r].state.dummy_steps


@pytest.mark.trio
@pytest.mark.parametrize(("n", "target"), [(2, 0), (2, 1), (3, 2)])
async def test_a_request_to_an_idle_group_completes_when_the_clients_first_request_is_lost(autojump_clock, n, target):
    async with open_cluster(n, sync_interval=8) as c:
        with trio.fail_after(30):
            first = await c.client.add(target, "warm-up", max_tokens=3)  # a wave the client announced
            await first.done.wait()
            await c.wait_reported_idle()
            await trio.sleep(0.5)  # the coordinator's snapshot of the completed wave reached the client
            assert not c.client.wave_running
            waves_before = [c.ranks[r].state.waves_completed for r in range(n)]
            c.client.send_first_request = False  # lost: its coordinator link was down
            late = await c.client.add(target, "late", max_tokens=5)  # stamped with the current wave
            await late.done.wait()
            await c.wait_idle()
        assert late.finish_reason == "length" and len(late.tokens) == 5
        assert [c.ranks[r].state.waves_completed for r in range(n)] == [w + 1 for w in waves_before]
        assert len({forwards(c, r) for r in range(n)}) == 1  # the peers joined: lockstep kept


@pytest.mark.trio
async def test_the_clients_first_request_and_the_ranks_wake_up_start_one_wave(autojump_clock):
    """Both arrive when nothing is lost: the coordinator starts the wave once and ignores the other (§6.4)."""
    async with open_cluster(2, sync_interval=8) as c:
        with trio.fail_after(30):
            for i in range(3):
                res = await c.client.add(i % 2, f"r{i}", max_tokens=4)
                await res.done.wait()
                await c.wait_reported_idle()
                await trio.sleep(0.5)
        assert [c.ranks[r].state.waves_completed for r in range(2)] == [3, 3]
        assert c.ls(0).current_wave == c.ls(1).current_wave == 3
