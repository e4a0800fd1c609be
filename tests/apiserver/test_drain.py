"""The API server's drain at shutdown (asyncdp/apiserver/process.py): what it counts for the "stopped" line.

Hand-driven engine links, virtual time: no engine process, no real sleep.
"""

from __future__ import annotations

import socket

import anyio
import pytest

from asyncdp import errors
from asyncdp import messages as m
from asyncdp.api.engine_client import RankHint
from asyncdp.apiserver.client import ClientConfig, DPClient
from asyncdp.apiserver.process import ApiConfig, _drain
from asyncdp.logs import DrainCounts
from asyncdp.sampling_params import SamplingParams
from asyncdp.transport import memory_link_pair


def _ready(rank: int) -> m.EngineReady:
    return m.EngineReady(dp_rank=rank, max_model_len=64, num_kv_blocks=8, block_size=16,
                         coordinator_client_addr=None)


def _finished(rank: int, rid: str, reason: str) -> m.EngineOutputs:
    out = m.RequestOutput(request_id=rid, new_token_ids=[7], finished=True, finish_reason=reason)
    return m.EngineOutputs(dp_rank=rank, outputs=[out], finished_request_ids=[rid], scheduler_stats=None,
                           timestamp=0.0)


@pytest.mark.trio
async def test_only_requests_that_complete_during_the_drain_count_as_drained(autojump_clock):
    """Four requests in flight at the signal: one completes ("length"), one its rank aborts (its own drain
    deadline), one dies with its rank, one is still running at the deadline. One drained, three aborted; the
    count used to be "in flight at the signal minus in flight at the deadline", which called every request
    that failed during the drain drained (here: 3 drained, 1 aborted)."""
    cfg = ClientConfig(client_index=0, client_count=1, managed_ranks=(0, 1), dp_size=2, model_name="m",
                       max_model_len=64, heartbeat_timeout_s=3600.0)
    client = DPClient(cfg, tokenizer=None)
    ends = [memory_link_pair() for _ in range(2)]
    results: dict[str, str] = {}
    async with anyio.create_task_group() as tg:
        for rank, (client_end, engine_end) in enumerate(ends):
            tg.start_soon(client.attach_engine, client_end)
            await engine_end.send(_ready(rank))
        await client.wait_engines_ready()

        async def request(rid: str, rank: int) -> None:
            outs = []
            try:
                async for out in client.generate(rid, [1, 2], SamplingParams(max_tokens=100),
                                                 rank_hint=RankHint(global_rank=rank)):
                    outs.append(out)
            except errors.AsyncDPError as exc:
                results[rid] = type(exc).__name__
            else:
                results[rid] = outs[-1].finish_reason or "?"

        placed = {"done": 0, "aborted": 0, "running": 0, "dies": 1}
        for rid, rank in placed.items():
            tg.start_soon(request, rid, rank)
        for rank in (0, 1):
            for _ in range(list(placed.values()).count(rank)):
                assert isinstance(await ends[rank][1].receive(), m.AddRequest)

        async def engines() -> None:
            await anyio.sleep(1)  # the drain has begun
            await ends[0][1].send(_finished(0, "done", "length"))
            await ends[0][1].send(_finished(0, "aborted", "abort"))
            await ends[1][1].aclose()  # rank 1's process is gone

        tg.start_soon(engines)
        drain = DrainCounts()
        api = ApiConfig(client=cfg, model_path="m", shutdown_timeout_s=5.0)
        with socket.socket() as http_sock:
            await _drain(api, client, http_sock, None, drain)
        tg.cancel_scope.cancel()
    for _, engine_end in ends:
        await engine_end.aclose()
    assert results == {"done": "length", "aborted": "ShuttingDownError", "dies": "EngineDeadError",
                       "running": "ShuttingDownError"}
    assert (drain.drained, drain.aborted) == (1, 3)
