"""A request racing an idle MoE leave (spec §8.7): refused before it shows anything, never abandoned, in virtual time.

Rank 1 of an idle group is stopped: it wakes the group and leaves at that wave's first sync. A request that reaches
rank 0 in the same instant is admitted there before rank 0 can know (only that sync tells it). It used to run its
first step, send its first token to its client and then be abandoned at the sync ("abandoned", a streamed 200 cut
by an error event); now the outputs of a wave's first step wait for that step's sync, and a request whose client
has seen nothing when its group ends is refused ("unavailable": a 503 before any byte of an answer).
"""

from __future__ import annotations

import pytest
import trio

from asyncdp.dp.liveness import PEER_STOP_GRACE_S
from asyncdp.errors import RankTornDown
from asyncdp.testing import open_rank_cluster as open_cluster

ENDED = "engine rank 0 cannot serve: its MoE group ended (a stopping rank left it)"


@pytest.mark.trio
@pytest.mark.parametrize("after_s", [0.0, 0.0005, 0.001, 0.002, 0.004])
async def test_a_request_racing_an_idle_leave_is_refused_before_it_shows_anything(autojump_clock, after_s):
    # after_s 0: the request reaches rank 0 before the coordinator's StartWave (rank 0 steps it at once); later
    # ones reach it while it dummy-steps to the sync, or after the group ended.
    async with open_cluster(2) as c:
        stopped_at = trio.current_time()
        c.ranks[1].request_shutdown()
        await trio.sleep(after_s)
        late = await c.client.add(0, "late", max_tokens=4)
        with trio.fail_after(0.1):  # prompt: the first sync, a few ms of virtual time
            await late.done.wait()
        assert (late.error_type, late.error, late.tokens) == ("unavailable", ENDED, []), late
        assert late.finished_at is not None and late.finished_at - stopped_at < 0.01
        with trio.fail_after(1.0):
            await c.ended[1].wait()
        assert c.outcomes[1] is None  # the orderly leave itself is unchanged: Goodbye, exit 0
        assert c.groups[0].num_calls == c.groups[1].num_calls  # the same last collective
        assert 0 not in c.client.dead
        with trio.fail_after(PEER_STOP_GRACE_S + 1.0):  # Goodbye -> Teardown: rank 0 was not stopping, exit 1
            await c.ended[0].wait()
            await c.coordinator_ended.wait()
        assert isinstance(c.outcomes[0], RankTornDown) and "rank 1 shut down" in str(c.outcomes[0])
        assert c.coordinator_outcome == [None]
