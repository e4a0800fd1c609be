"""End to end: the multi-port supervisor (``-dpm``) with real children (spec §11.3, §13; issue 9).

``asyncdp serve builtin:tiny-moe -dp 2 -dpl 2 -dpm --port P --data-parallel-supervisor-port S`` starts one
external-LB rank server per local rank (``asyncdp-api-dp0`` on P, ``asyncdp-api-dp1`` on P+1) and serves the
aggregated health on S once every child is ready. The probe interval is 1 s, so a child's death is acted on
within 5 s. Each test that ends its deployment starts its own; the processes are tracked from /proc as in
:mod:`tests.e2e.conftest` (pid and start time), so "every child gone" is checked by pid, not by name. Every
port is picked free (the rpc port too, not the default 29550); a launch that lost the race for one of them is
retried once on fresh ports.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import Server, free_port, free_port_pair
from tests.e2e.external_lb import MOE, PORT_RACE, kill_all, launch

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

PROBE_ARGS = ("--dp-supervisor-probe-interval-s", "1", "--dp-supervisor-probe-timeout-s", "1")
READY_TIMEOUT_S = 120.0



def _start_supervisor(log_dir: Path, *args: str, dp: int = 2, start_rank: int = 0) -> tuple[Server, int]:
    port, sup = free_port_pair(), free_port()
    if "-dpp" not in args:  # the rpc port on a port of its own, not the default 29550 another deployment may hold
        args = ("-dpa", "127.0.0.1", "-dpp", str(free_port()), *args)
    server = launch(log_dir / f"supervisor-r{start_rank}-{port}.log", MOE, "-dp", str(dp), "-dpl", "2",
                    "-dpr", str(start_rank), "--data-parallel-multi-port-external-lb", "--port", str(port),
                    "--data-parallel-supervisor-port", str(sup), *PROBE_ARGS, *args, port=sup)
    return server, port


async def wait_ready(server: Server, timeout_s: float = READY_TIMEOUT_S) -> list[int | str]:
    """Poll the supervisor's /readyz until 200; returns what was seen before (status codes or error names).
    Fails if the supervisor exits first or at the deadline."""
    seen: list[int | str] = []
    with anyio.move_on_after(timeout_s):
        async with httpx.AsyncClient(timeout=2.0) as http:
            while server.process.poll() is None:
                try:
                    code = (await http.get(f"{server.base_url}/readyz")).status_code
                except httpx.TransportError as e:
                    seen.append(type(e).__name__)
                else:
                    if code == 200:
                        server.remember_tree()
                        return seen
                    seen.append(code)
                await anyio.sleep(0.2)
            pytest.fail(f"supervisor exited with {server.process.returncode} before ready\n{server.log()[-4000:]}")
    pytest.fail(f"supervisor not ready within {timeout_s} s\n{server.log()[-4000:]}")


@contextmanager
def supervisor(log_dir: Path, *args: str, dp: int = 2, start_rank: int = 0) -> Iterator[tuple[Server, int]]:
    """A started (not yet ready) supervisor and its first child port; whatever is left is killed afterwards."""
    server, port = _start_supervisor(log_dir, *args, dp=dp, start_rank=start_rank)
    try:
        yield server, port
    finally:
        if server.process.poll() is None or server.remaining():
            server.kill_all()


@asynccontextmanager
async def ready_supervisor(log_dir: Path) -> AsyncIterator[tuple[Server, int, list[int | str]]]:
    """A supervisor whose node is ready: the server, its first child port and what its port answered before
    (:func:`wait_ready`). The test picks the ports (bound on port 0 and closed) and the supervisor and its
    children bind them a moment later: a launch that lost that race ("cannot listen ... in use" in the log) is
    retried once on fresh ports, as :func:`tests.e2e.conftest.serve` does."""
    for attempt in range(2):
        with supervisor(log_dir) as (server, port):
            try:
                before = await wait_ready(server)
            except pytest.fail.Exception:
                if attempt == 0 and server.process.poll() is not None and PORT_RACE.search(server.log()):
                    continue
                raise
            yield server, port, before
            return


async def _complete(base_url: str, prompt: str) -> dict:
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0) as http:
        r = await http.post("/v1/completions", json={"model": MOE, "prompt": prompt, "max_tokens": 4})
        assert r.status_code == 200, r.text
        return r.json()


async def test_supervisor_port_is_closed_before_ready_200_after_and_503_within_1s_of_sigterm_then_exit_0(
        tmp_path: Path) -> None:
    async with ready_supervisor(tmp_path) as (server, port, before):
        assert before and set(before) == {"ConnectError"}, before  # closed while the children start, never 503
        async with httpx.AsyncClient(base_url=server.base_url, timeout=5.0) as http:
            for path in ("/health", "/ready", "/readyz"):
                assert (await http.get(path)).status_code == 200
            assert (await http.get("/v1/models")).status_code == 404  # the supervisor port serves health only
        for i in range(2):  # each child serves its own rank
            await _complete(f"http://127.0.0.1:{port + i}", f"child {i}")
        assert sorted(t for t in server.titles().values() if t.startswith("asyncdp-api-dp")) == [
            "asyncdp-api-dp0", "asyncdp-api-dp1"]

        server.remember_tree()
        seen: list[tuple[float, int | str]] = []
        async with httpx.AsyncClient(timeout=1.0) as http:
            signalled_at = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            while server.process.poll() is None and time.monotonic() - signalled_at < 30:
                try:
                    code: int | str = (await http.get(f"{server.base_url}/health")).status_code
                except httpx.TransportError as e:
                    code = type(e).__name__
                seen.append((time.monotonic() - signalled_at, code))
                await anyio.sleep(0.05)
        code = await anyio.to_thread.run_sync(server.process.wait, 10)
        first_503 = next((t for t, c in seen if c == 503), None)
        print(f"\nfirst 503 {first_503} s after SIGTERM; exit after {time.monotonic() - signalled_at:.2f} s")
        assert first_503 is not None and first_503 < 1.0, seen
        assert 200 not in [c for t, c in seen if t >= first_503], seen  # never 200 again
        assert code == 0, server.log()[-4000:]
        assert not server.wait_gone(5.0), server.log()[-4000:]
        assert "Traceback" not in server.log(), server.log()[-4000:]


async def test_sigkill_of_a_child_api_server_makes_the_supervisor_exit_1_within_5s_with_every_child_gone(
        tmp_path: Path) -> None:
    async with ready_supervisor(tmp_path) as (server, port, _):
        async with httpx.AsyncClient(timeout=10.0) as http:
            info = (await http.get(f"http://127.0.0.1:{port + 1}/server_info")).json()
        assert info["mode"] == "external" and [r["dp_rank"] for r in info["managed_ranks"]] == [1]
        child = next(p["pid"] for p in info["processes"]
                     if p["role"] == "api_server" and p["ports"].get("http") == port + 1)
        assert server.titles()[child] == "asyncdp-api-dp1"
        server.remember_tree()
        killed_at = time.monotonic()
        os.kill(child, signal.SIGKILL)
        try:
            code = await anyio.to_thread.run_sync(server.process.wait, 10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"supervisor still running 10 s after its child's SIGKILL\n{server.log()[-4000:]}")
        took = time.monotonic() - killed_at
        assert code == 1, server.log()[-4000:]
        assert took < 5.0, took
        assert "child rank 1" in server.log() and "SIGKILL" in server.log(), server.log()[-4000:]
        assert not server.wait_gone(5.0), server.log()[-4000:]


def test_a_busy_supervisor_port_fails_startup_naming_the_port_and_starts_no_child(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        port = free_port_pair()
        server = launch(tmp_path / "busy.log", MOE, "-dp", "2", "-dpl", "2", "--data-parallel-multi-port-external-lb",
                        "--port", str(port), "--data-parallel-supervisor-port", str(taken), *PROBE_ARGS, port=taken)
        try:
            code = server.process.wait(timeout=60)
        finally:
            server.kill_all()
    assert code == 1, server.log()
    assert f"cannot listen on the supervisor port (--data-parallel-supervisor-port) 127.0.0.1:{taken}" in server.log()
    assert "asyncdp-api-dp" not in server.log() and "Traceback" not in server.log()


@pytest.mark.slow
async def test_two_supervisors_starting_at_ranks_0_and_2_form_one_dp_group_of_4(tmp_path: Path) -> None:
    """Two nodes on loopback: ``-dp 4 -dpl 2 -dpr 0`` (the head: rank 0's child hosts the handshake) and
    ``-dpr 2 -dpa 127.0.0.1 -dpp RPC``. Over a minute of start-up on 2 cores, hence slow."""
    for attempt in range(2):
        rpc = str(free_port())
        with supervisor(tmp_path, "-dpa", "127.0.0.1", "-dpp", rpc, dp=4, start_rank=0) as (head, head_port), \
                supervisor(tmp_path, "-dpa", "127.0.0.1", "-dpp", rpc, dp=4, start_rank=2) as (node, node_port):
            try:
                await wait_ready(head, 240.0)
            except pytest.fail.Exception:
                if attempt == 0 and any(PORT_RACE.search(s.log()) for s in (head, node)):
                    kill_all([head, node])
                    continue  # lost a race for a port: once more, on fresh ones
                raise
            await wait_ready(node, 240.0)
            ports = [head_port, head_port + 1, node_port, node_port + 1]
            for rank, port in enumerate(ports):
                await _complete(f"http://127.0.0.1:{port}", f"rank {rank}")
                async with httpx.AsyncClient(timeout=10.0) as http:
                    info = (await http.get(f"http://127.0.0.1:{port}/server_info")).json()
                assert info["dp_size"] == 4 and [r["dp_rank"] for r in info["managed_ranks"]] == [rank], info
            for s in (head, node):
                s.remember_tree()
            for s in (head, node):
                s.process.send_signal(signal.SIGTERM)
            codes = [await anyio.to_thread.run_sync(s.process.wait, 30) for s in (head, node)]
            assert codes == [0, 0], head.log()[-3000:] + node.log()[-3000:]
            for s in (head, node):
                assert not s.wait_gone(5.0), s.log()[-4000:]
                assert "Traceback" not in s.log(), s.log()[-4000:]
            return
