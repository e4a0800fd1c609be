"""End to end: dense failure rows of spec §13 that end a deployment, one short-lived deployment each.

* The launcher is SIGKILLed: every child notices its parent's death and exits within 5 s (no orphans, §12.5).
* The last managed engine dies: /health turns 503 and the API server's watchdog ends the deployment with exit
  code 1 within 10 s, leaving no process behind.
* The coordinator dies (dense): only the load snapshots are lost; both ranks keep serving.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import MODEL, serve
from tests.e2e.metrics_text import successes

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

SHORT_HEARTBEATS = ("--dp-heartbeat-interval-s", "0.5", "--dp-heartbeat-timeout-s", "2")


async def test_sigkilled_launcher_leaves_no_orphans_within_5s(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "2") as server:
        server.remember_tree()
        assert len(server.remaining()) == 6  # launcher, coordinator, 2 API servers, 2 engines
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=5)
        left = await anyio.to_thread.run_sync(server.wait_gone, 5.0)
        assert not left, f"children still alive 5 s after the launcher died: {left}\n{server.log()[-3000:]}"


async def test_last_engine_death_turns_health_503_and_exits_1(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "1") as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=2.0) as http:
            info = (await http.get("/server_info")).json()
            engine = next(p["pid"] for p in info["processes"] if p["role"] == "engine")
            os.kill(engine, signal.SIGKILL)
            with anyio.fail_after(5):
                while True:
                    try:
                        if (await http.get("/health")).status_code == 503:
                            break
                    except httpx.TransportError:
                        break  # already gone: also not serving
                    await anyio.sleep(0.1)
        try:
            code = await anyio.to_thread.run_sync(lambda: server.process.wait(timeout=10))
        except subprocess.TimeoutExpired:
            pytest.fail(f"the deployment outlived its last engine by 10 s\n{server.log()[-3000:]}")
        assert code == 1, server.log()[-3000:]
        assert not await anyio.to_thread.run_sync(server.wait_gone, 2.0), server.log()[-3000:]


async def test_killed_coordinator_is_dead_in_server_info_and_both_ranks_keep_serving(tmp_path: Path) -> None:
    """Dense: the coordinator's death only costs the load snapshots (spec §13); requests keep flowing to both
    ranks on in-flight counts, and /health stays 200."""
    with serve(tmp_path, "-dp", "2", "--api-server-count", "1") as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=5.0) as http:
            info = (await http.get("/server_info")).json()
            coordinator = next(p["pid"] for p in info["processes"] if p["role"] == "coordinator")
            os.kill(coordinator, signal.SIGKILL)
            with anyio.fail_after(5.0):
                state = ""
                while state != "dead":
                    await anyio.sleep(0.1)
                    state = (await http.get("/server_info")).json()["coordinator"]["state"]
            # Longer than the client's heartbeat interval: a heartbeat to the dead coordinator must not hurt.
            await anyio.sleep(1.5)
            assert (await http.get("/health")).status_code == 200
            assert [r["state"] for r in (await http.get("/server_info")).json()["managed_ranks"]] == ["ready"] * 2

        before = await successes(server.base_url)
        with anyio.fail_after(30):
            async with server.openai() as client:
                for i in range(6):  # one at a time: the tie-break start rotates over both ranks
                    r = await client.completions.create(model=MODEL, prompt=f"no coordinator {i}", max_tokens=2)
                    assert r.choices[0].finish_reason in ("length", "stop")
        after = await successes(server.base_url)
        assert all(after.get(e, 0.0) > before.get(e, 0.0) for e in ("0", "1")), (before, after)


async def _pinned_long_request(http: httpx.AsyncClient, out: list[httpx.Response]) -> None:
    try:
        out.append(await http.post("/v1/completions", headers={"X-data-parallel-rank": "0"},
                                   json={"model": MODEL, "prompt": "cut short", "max_tokens": 1900,
                                         "ignore_eos": True}))
    except httpx.TransportError:
        pass  # the server went away first: the assertion below reports it


@pytest.mark.parametrize("victim", ["engine", "api_server"])
async def test_a_request_cut_off_by_a_teardown_is_a_503_naming_the_cause(tmp_path: Path, victim: str) -> None:
    """Issue #12: a request the deployment abandons while tearing itself down (--dp-fail-fast after a rank
    died, or a sibling API server died) is an error status naming the cause, never a 200 cut short with
    finish_reason "abort"."""
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--dp-fail-fast", "--max-model-len", "2048") as server:
        # Two clients: `http` holds one connection (to API process `me`) that the request reuses; the polls go
        # over `poll`, so they can never take that connection and push the request onto a new one, which
        # SO_REUSEPORT may hand to the victim.
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as http, \
                httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as poll:
            info = (await http.get("/server_info")).json()  # this connection's API process serves the request
            me = info["api_process_rank"]
            if victim == "engine":
                pid = next(p["pid"] for p in info["processes"] if p["role"] == "engine" and p["rank"] == 1)
            else:
                pid = next(p["pid"] for p in info["processes"]
                           if p["role"] == "api_server" and p["client_index"] != me)
            out: list[httpx.Response] = []
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_pinned_long_request, http, out)
                    # Polled over another connection, maybe another process: the node table's counts.
                    while not out and not any(p["inflight"] for p in  # noqa: ASYNC110
                                              (await poll.get("/server_info")).json()["api_processes"]):
                        await anyio.sleep(0.05)
                    assert not out, out[0].text
                    server.remember_tree()
                    os.kill(pid, signal.SIGKILL)
        code = await anyio.to_thread.run_sync(server.process.wait, 15)
        assert code == 1
        assert out, f"no answer before the server went away\n{server.log()[-3000:]}"
        assert out[0].status_code == 503, out[0].text
        message = out[0].json()["error"]["message"]
        assert "torn down" in message and "exited with code -9" in message, message
        assert not await anyio.to_thread.run_sync(server.wait_gone, 2.0)


async def test_an_api_server_stopped_past_the_heartbeat_timeout_serves_again_when_it_resumes(tmp_path: Path) -> None:
    """A process that was not running (SIGSTOP here; a swap storm or a long pause in production) must not judge
    its peers by a silence it did not see: the ranks' heartbeats of that time wait unread on its links. Before, the
    stopped API server declared every rank dead when it resumed, exited, and the launcher tore the deployment
    down. Now /health is 503 while it is stuck and 200 again after, and every request succeeds. Short heartbeats
    (0.5 s, dead after 2 s): the stop the siblings see (no node-table beat for 5 s) is already past the links'
    heartbeat timeout."""
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", *SHORT_HEARTBEATS) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as http:
            info = (await http.get("/server_info")).json()  # `http` keeps this connection's process: not the victim
            me = info["api_process_rank"]
            pid = next(p["pid"] for p in info["processes"] if p["role"] == "api_server" and p["client_index"] != me)
            os.kill(pid, signal.SIGSTOP)
            try:
                with anyio.fail_after(30):
                    while (await http.get("/health")).status_code != 503:  # noqa: ASYNC110 - another process
                        await anyio.sleep(0.2)  # the siblings see it stuck (5 s without a node-table beat)
                # stopped for over 5 s now: past the heartbeat timeout (2 s) of its links too
            finally:
                os.kill(pid, signal.SIGCONT)
            with anyio.fail_after(30):
                while (await http.get("/health")).status_code != 200:  # noqa: ASYNC110 - another process
                    await anyio.sleep(0.2)
            await anyio.sleep(1.0)  # time to misjudge, if it still did (two heartbeat intervals)
            for i in range(8):  # fresh connections: SO_REUSEPORT spreads them over both API servers (the victim too)
                async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as fresh:
                    r = await fresh.post("/v1/completions", json={"model": MODEL, "prompt": f"after {i}",
                                                                  "max_tokens": 4})
                assert r.status_code == 200, r.text
            info = (await http.get("/server_info")).json()
        assert server.process.poll() is None, server.log()[-3000:]
        assert [p["stuck"] for p in sorted(info["api_processes"], key=lambda p: p["client_index"])] == [False, False]
        assert "is dead" not in server.log(), server.log()[-3000:]
