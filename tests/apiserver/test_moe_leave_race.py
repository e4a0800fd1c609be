"""HTTP: a completion racing an idle MoE leave gets a prompt 503 with OpenAI error JSON (spec §8.7, §12.4).

The whole path in one event loop, in virtual time: the real DP client and the Quart app over a simulated MoE group
of two ranks (:func:`~asyncdp.testing.cluster.open_sim_cluster`). Rank 1 is stopped while the group is idle and a
completion arrives in the same instant: the client routes it to rank 0 (rank 1 said it is draining), which admits
it before it can know that rank 1 leaves at the next sync. It used to stream its first chunk (HTTP 200) and then an
SSE error event; now rank 0 holds that first step's outputs until the sync, finds the group ended, and refuses the
request, so the API answers 503 before any byte of an answer, streamed or not.
"""

from __future__ import annotations

import json

import pytest
import trio

from asyncdp.api import create_app
from asyncdp.dp.liveness import PEER_STOP_GRACE_S
from asyncdp.errors import RankTornDown
from asyncdp.testing.cluster import open_sim_cluster
from asyncdp.testing.tokenizer import byte_tokenizer

ENDED = "engine rank 0 cannot serve: its MoE group ended (a stopping rank left it)"


@pytest.mark.trio
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_completion_racing_an_idle_moe_leave_gets_a_prompt_503_with_openai_error_json(autojump_clock, stream):
    async with open_sim_cluster(2, 1, is_moe=True, tokenizer=byte_tokenizer(), vocab_size=300) as c:
        client = c.clients[0]
        app = create_app(client, backend="trio")
        async with app.test_app() as serving:
            http = serving.test_client()
            stopped_at = trio.current_time()
            c.ranks[1].request_shutdown()  # idle: it wakes the group and leaves at that wave's first sync
            r = await http.post("/v1/completions", json={"model": client.cfg.model_name, "prompt": [1, 2, 3],
                                                        "max_tokens": 4, "stream": stream})
            body = await r.get_data()
            answered_after_s = trio.current_time() - stopped_at
            assert r.status_code == 503, body
            assert r.mimetype == "application/json", r.mimetype
            assert json.loads(body) == {"error": {"message": ENDED, "type": "ServiceUnavailableError",
                                                  "param": None, "code": 503}}
            assert answered_after_s < 0.05, answered_after_s  # one step and the sync, not a drain or a timeout
            assert c.routed and set(c.routed.values()) == {0}
            # The orderly leave is undisturbed: rank 1 said Goodbye and ended cleanly; rank 0, which nobody stopped,
            # is torn down by the coordinator's Teardown, naming rank 1 (spec §13, the last row).
            await trio.sleep(PEER_STOP_GRACE_S + 1.0)
            assert 1 not in c.rank_errors, c.rank_errors
            torn = c.rank_errors.get(0)
            assert isinstance(torn, RankTornDown) and "rank 1 shut down" in str(torn), c.rank_errors
