"""End to end: ``--backend trio`` stops the way the default asyncio backend does (one short deployment each).

SIGTERM with ``--shutdown-timeout 8`` while a stream outlasts the drain, behind two API-server processes whose
clients keep their finished connections alive: the stream ends with an error event naming the deadline, new
requests get 503, and the launcher exits 0 with no process left. Under trio the idle keep-alive connections once
held each API server's Hypercorn for another full drain after the deadline (``asyncdp.api.last_send``), past the
launcher's stop deadline (the drain + 5 s): the API servers were killed and the launcher exited 1.

The simulated executor (40 ms a step: the stream would last 19 s) makes the stream's length independent of the machine's load.
"""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

SIM = ("--executor", "sim", "--sim-cost", "40,0,0,0")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
async def test_sigterm_cuts_a_stream_at_the_drain_deadline_and_exits_0(tmp_path: Path, backend: str) -> None:
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--shutdown-timeout", "8", "--backend", backend,
               *SIM) as server:
        ended: list[str] = []
        late: list[int] = []
        first = anyio.Event()
        async with server.openai() as client, httpx.AsyncClient(base_url=server.base_url, timeout=10.0) as idle:

            async def warm(http: httpx.AsyncClient, i: int) -> None:
                r = await http.post("/v1/completions", json={"model": MODEL, "prompt": f"warm {i}", "max_tokens": 2})
                assert r.status_code == 200

            async def long_stream() -> None:
                try:
                    stream = await client.completions.create(model=MODEL, prompt="drain", max_tokens=480,
                                                             stream=True, extra_body={"ignore_eos": True})
                    async for chunk in stream:
                        first.set()
                        if chunk.choices and chunk.choices[0].finish_reason:
                            ended.append(chunk.choices[0].finish_reason)
                except openai.APIError as exc:
                    ended.append(f"error: {exc.message}")
                first.set()

            with anyio.fail_after(50):
                # Finished requests on connections their client keeps open: idle keep-alive connections, spread by
                # the kernel over both API servers.
                async with anyio.create_task_group() as tg:
                    for i in range(8):
                        tg.start_soon(warm, idle, i)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(long_stream)
                    await first.wait()
                    server.remember_tree()
                    server.process.send_signal(signal.SIGTERM)
                    async with httpx.AsyncClient(base_url=server.base_url, timeout=2.0) as http:
                        while not late and not ended:  # the signal reaches the API servers a moment later
                            r = await http.post("/v1/completions",
                                                json={"model": MODEL, "prompt": "late", "max_tokens": 1})
                            if r.status_code == 503:
                                late.append(r.status_code)
                            await anyio.sleep(0.05)
                code = await anyio.to_thread.run_sync(lambda: server.process.wait(timeout=30))
        log = server.log()
        assert code == 0, f"exit {code}\n{log[-3000:]}"
        assert late == [503]
        assert len(ended) == 1 and "--shutdown-timeout of 8 s passed" in ended[0], ended
        assert not server.wait_gone(), log[-3000:]
        assert "Traceback" not in log and "not orderly" not in log, log[-3000:]
