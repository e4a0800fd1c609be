"""End to end: an external-LB MoE group losing a rank, and the refusals (spec §8.7, §11.2, §13; issue 9).

Each test starts its own group of two ``builtin:tiny-moe`` rank servers (:mod:`tests.e2e.external_lb`): a SIGKILL
of one rank's engine ends every server within 5 s with every stream errored; SIGTERM to both rank servers, a
moment apart in either order, stops both with exit 0, and to one alone ends the other with exit 1 within 5 s. A
dense model given a data-parallel rank exits 2, saying to launch independent servers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import BASE_ARGS, ROOT, Server, free_port
from tests.e2e.external_lb import MOE, _get_json, external_group

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def _stream_until_error(base_url: str, i: int, started: anyio.Event, outcomes: list[str]) -> None:
    """One long streamed completion; records how it ended: ``error-event``, ``transport-error``, ``http-<code>``
    or ``finished`` (the last one is what must not happen)."""
    body = {"model": MOE, "prompt": f"doomed {i}", "max_tokens": 400, "ignore_eos": True, "stream": True}
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as http, \
                http.stream("POST", "/v1/completions", json=body) as stream:
            if stream.status_code != 200:
                outcomes.append(f"http-{stream.status_code}")
                return
            async for line in stream.aiter_lines():
                started.set()
                if line.startswith("data: ") and line != "data: [DONE]" and "error" in json.loads(line[6:]):
                    outcomes.append("error-event")
                    return
                if line == "data: [DONE]":
                    outcomes.append("finished")
                    return
        outcomes.append("closed-without-done")
    except httpx.TransportError:
        outcomes.append("transport-error")
    finally:
        started.set()


async def test_sigkill_of_one_ranks_engine_ends_every_server_within_5s_with_every_stream_errored(
        tmp_path: Path) -> None:
    with external_group(tmp_path) as servers:
        info = await _get_json(servers[1].base_url, "/server_info")
        engine1 = next(p["pid"] for p in info["processes"] if p["role"] == "engine" and p["rank"] == 1)
        outcomes: list[str] = []
        health: dict[int, list[int | str]] = {s.port: [] for s in servers}
        with anyio.fail_after(40):
            async with anyio.create_task_group() as tg:
                events = []
                for server in servers:
                    for i in range(3):
                        events.append(anyio.Event())
                        tg.start_soon(_stream_until_error, server.base_url, i, events[-1], outcomes)
                for event in events:
                    await event.wait()
                for server in servers:
                    server.remember_tree()
                killed_at = time.monotonic()
                os.kill(engine1, signal.SIGKILL)
                async with httpx.AsyncClient(timeout=1.0) as http:
                    while any(s.process.poll() is None for s in servers):
                        for s in servers:
                            try:
                                health[s.port].append((await http.get(f"{s.base_url}/health")).status_code)
                            except httpx.TransportError as e:
                                health[s.port].append(type(e).__name__)  # the listener is gone
                        await anyio.sleep(0.05)
                gone_after = time.monotonic() - killed_at
        codes = [s.process.wait(timeout=1) for s in servers]
        print(f"\ngroup ended {gone_after:.2f} s after the SIGKILL; /health seen: {health}; streams: {outcomes}")
        assert codes == [1, 1], codes
        assert gone_after < 5.0, gone_after
        assert len(outcomes) == 6 and "finished" not in outcomes, outcomes
        for port, seen in health.items():
            after_first_failure = seen[next((i for i, c in enumerate(seen) if c != 200), len(seen)):]
            assert 200 not in after_first_failure, (port, seen)  # once unhealthy, never healthy again
            # 503, then the server gone: a closed port, or a connection it dropped as the process ended mid-request
            assert set(after_first_failure) <= {503, "ConnectError", "RemoteProtocolError", "ReadError"}, (port, seen)
        for s in servers:
            assert not s.wait_gone(2.0), s.log()[-4000:]


def _until_logged(server: Server, text: str, timeout_s: float = 20.0) -> None:
    """Until ``text`` is in ``server``'s log, or it exited, or ``timeout_s`` passed (the assertions after tell)."""
    deadline = time.monotonic() + timeout_s
    while text not in server.log() and server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


# Signalled first, then what the other rank server's log shows once the group's end reached it before its own
# signal: rank 0 first, rank 1's engine ended with the group; rank 1 first, its engine left the group, which rank 0
# (the coordinator and the handshake) sees before its signal.
PEER_GONE = {0: "left with its MoE group", 1: "leaving the group"}


@pytest.mark.parametrize("first", [0, 1], ids=["rank0-first", "rank1-first"])
def test_sigterm_to_a_rank_server_after_its_peer_left_the_group_in_either_order_stops_both_with_exit_0(
        tmp_path: Path, first: int) -> None:
    # The signals of a whole group's stop can reach its rank servers a moment apart (a loaded machine, an
    # orchestrator stopping them one by one): the one signalled late was shutting down too, so it exits 0 as well
    # (spec §8.7). The second signal goes out once the first server's departure has reached the group.
    with external_group(tmp_path) as servers:
        for server in servers:
            server.remember_tree()
        servers[first].process.send_signal(signal.SIGTERM)
        _until_logged(servers[1], PEER_GONE[first])
        servers[1 - first].process.send_signal(signal.SIGTERM)
        for server in servers:
            code = server.process.wait(timeout=30)
            assert code == 0, f"server {server.port} exited with {code}\n{server.log()[-4000:]}"
        for server in servers:
            assert not server.wait_gone(), f"processes left\n{server.log()[-4000:]}"
            assert "Traceback" not in server.log(), server.log()[-4000:]


def test_sigterm_to_one_rank_server_alone_ends_the_other_with_exit_1_within_5s(tmp_path: Path) -> None:
    # A group cannot go on without a rank: the rank server that was not asked to stop reports the group's end as a
    # failure once the grace for its own signal is over (spec §8.7 and the failure table: within 5 s).
    with external_group(tmp_path) as servers:
        for server in servers:
            server.remember_tree()
        servers[0].process.send_signal(signal.SIGTERM)
        assert servers[0].process.wait(timeout=30) == 0, servers[0].log()[-4000:]
        stopped_at = time.monotonic()
        code = servers[1].process.wait(timeout=30)
        after = time.monotonic() - stopped_at
        assert code == 1, servers[1].log()[-4000:]
        assert after < 5.0, after
        assert "was not asked to stop within" in servers[1].log(), servers[1].log()[-4000:]
        for server in servers:
            assert not server.wait_gone(), f"processes left\n{server.log()[-4000:]}"


def test_sigterm_to_the_other_rank_server_alone_is_named_by_the_head_as_the_cause_of_the_teardown(
        tmp_path: Path) -> None:
    # Rank 1's server joins the head (rank 0's) on the node link; stopped alone, it says NodeStopping there, so the
    # head's teardown line names the stop instead of only "engine rank 1 ... ended" (it said nothing for MoE).
    with external_group(tmp_path) as servers:
        for server in servers:
            server.remember_tree()
        servers[1].process.send_signal(signal.SIGTERM)
        assert servers[1].process.wait(timeout=30) == 0, servers[1].log()[-4000:]
        assert servers[0].process.wait(timeout=30) == 1, servers[0].log()[-4000:]
        log = servers[0].log()
        assert "with rank 1 " in log and "is stopping (a signal to the node)" in log, log[-4000:]
        assert "engine rank 1 on " in log and "ended (its node is stopping: a signal to the node); the MoE group " \
            "is torn down" in log, log[-4000:]
        for server in servers:
            assert not server.wait_gone(), f"processes left\n{server.log()[-4000:]}"


def test_a_dense_model_with_a_data_parallel_rank_exits_2_saying_to_launch_independent_servers(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "asyncdp", "serve", "builtin:tiny-dense", "--host", "127.0.0.1", *BASE_ARGS,
           "-dp", "2", "--data-parallel-rank", "0", "--port", str(free_port()), "-dpa", "127.0.0.1",
           "-dpp", str(free_port())]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "launch independent" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
