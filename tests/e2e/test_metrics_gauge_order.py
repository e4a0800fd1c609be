"""End to end, dp=2 behind two API processes: a rank's gauges show its newest report, whichever API process applied
it and whenever.

A rank's state reaches the two API processes in no agreed order: it rides on one process's outputs at a time, and
each process applies what it gets when its event loop gets round to it. Before, the gauges took the wall time of
the write, so a process that applied an older report late (its event loop busy; here stopped with SIGSTOP) left an
idle rank showing requests running until the rank's next report, which an idle rank does not send.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import MODEL, serve
from tests.e2e.metrics_text import per_engine, read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


def total(text: str, name: str) -> float:
    return sum(per_engine(text, name).values())


async def connection_on(base_url: str, process: int) -> httpx.AsyncClient:
    """A client whose one keep-alive connection the kernel handed to API process ``process``."""
    for _ in range(50):
        http = httpx.AsyncClient(base_url=base_url, timeout=30, limits=httpx.Limits(max_connections=1))
        if (await http.get("/server_info")).json()["api_process_rank"] == process:
            return http
        await http.aclose()
    raise AssertionError(f"no connection reached API process {process}")


async def stream(http: httpx.AsyncClient, prompt: str, max_tokens: int, first: anyio.Event | None = None) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    async with http.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if first is not None and line.startswith("data: {"):
                first.set()


async def test_an_api_process_that_applies_an_older_report_late_does_not_leave_a_rank_busy(tmp_path: Path) -> None:
    """API process 1 stops (a long pause of its event loop) while the ranks' reports to it queue up; process 0
    applies the ranks' newest reports (idle) meanwhile; process 1 then applies its older ones. Every scrape must
    show the ranks idle. (A rank sends a report no output carries to the first API process: process 0 here.)"""
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2") as server:
        with anyio.fail_after(60):
            async with httpx.AsyncClient(base_url=server.base_url) as http:
                info = (await http.get("/server_info")).json()
            pid = {p["client_index"]: p["pid"] for p in info["api_processes"]}
            # one connection per stream (HTTP/1.1 runs one request at a time on a connection), on a known process
            late = [await connection_on(server.base_url, 1) for _ in range(4)]
            first = [await connection_on(server.base_url, 0) for _ in range(5)]
            try:
                async with anyio.create_task_group() as tg:
                    started = [anyio.Event() for _ in range(4)]
                    for i in range(4):  # short requests through process 1, first: their outputs carry the stats
                        tg.start_soon(stream, late[i], f"short {i}", 120, started[i])
                    for e in started:
                        await e.wait()
                    for i in range(4):  # long ones through process 0, on the same ranks (two each)
                        tg.start_soon(stream, first[i], f"long {i}", 400)
                    os.kill(pid[1], signal.SIGSTOP)
                    while True:  # until process 0 applied the ranks' last reports: both idle
                        text = (await first[4].get("/metrics")).text
                        if all(v == 0 for v in per_engine(text, "vllm:num_requests_running").values()):
                            break
                        await anyio.sleep(0.1)
                    os.kill(pid[1], signal.SIGCONT)  # process 1 applies its queued, older reports now
            finally:
                os.kill(pid[1], signal.SIGCONT)
                for http in (*late, *first):
                    await http.aclose()
            while True:  # every stream ended in both processes
                if total(await read_metrics(server.base_url), "asyncdp:dp_inflight_requests") == 0:
                    break
                await anyio.sleep(0.1)
            for _ in range(6):  # fresh connections: both API processes render the node's gauges
                text = await read_metrics(server.base_url)
                for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                    assert per_engine(text, name) == {"0": 0, "1": 0}, (name, text)
