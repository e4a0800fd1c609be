"""``/health``'s 503 while the engines start says how many managed ranks are ready, instead of "No engine can
serve requests.", which an operator of an API-only head whose nodes load for minutes read as a failure."""

import anyio
import pytest

from asyncdp.apiserver.client import DPClient
from asyncdp.transport import memory_link_pair
from tests.apiserver.client_links import _config, _ready


@pytest.mark.trio
async def test_the_503_counts_the_ready_ranks_until_every_one_is_ready(autojump_clock):
    client = DPClient(_config(managed_ranks=(0, 1), dp_size=2), tokenizer=None)
    assert client.health_problem() == "The engines are still starting: 0 of 2 managed ranks are ready."
    ends = [memory_link_pair() for _ in range(2)]
    async with anyio.create_task_group() as tg:
        for rank, (client_end, engine_end) in enumerate(ends):
            tg.start_soon(client.attach_engine, client_end)
            await engine_end.send(_ready(rank))
            await anyio.sleep(0.1)
            if rank == 0:
                assert client.health_problem() == "The engines are still starting: 1 of 2 managed ranks are ready."
        with anyio.fail_after(5):
            await client.wait_engines_ready()
        assert client.health_problem() is None and client.is_healthy()
        tg.cancel_scope.cancel()
    for _, engine_end in ends:
        await engine_end.aclose()
