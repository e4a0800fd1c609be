"""How the external load-balancing tests (tests/e2e/test_external_lb*.py, test_moe_rank_stop.py,
test_supervisor_e2e.py) run one ``asyncdp serve`` per MoE rank (spec §11.2, §12, §13; issue 9).

The servers are launched like :func:`tests.e2e.conftest.serve` launches one (new session, process tree recorded
from /proc, clean stop asserted: exit 0, no process left, no traceback), but at ports the test picks, because the
ranks must share the handshake port. A launch that loses the race for a port is retried once on fresh ports.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import BASE_ARGS, MODEL, READY_TIMEOUT_S, ROOT, Server, free_port

MOE = "builtin:tiny-moe"
PORT_RACE = re.compile(r"cannot listen on .*in use|Address already in use")


def launch(log_path: Path, model: str, *args: str, port: int | None = None) -> Server:
    """``python -m asyncdp serve MODEL --host 127.0.0.1 BASE_ARGS ARGS`` in a new session; ``args`` name the port.

    The returned :class:`Server`'s ``port`` is ``port``, else the value of the first ``--port`` in ``args``."""
    port = int(args[args.index("--port") + 1]) if port is None else port
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "asyncdp", "serve", model, "--host", "127.0.0.1", *BASE_ARGS, *args]
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=ROOT)
    return Server(port=port, process=proc, log_path=log_path, args=tuple(args))


def wait_all_healthy(servers: list[Server], timeout_s: float = READY_TIMEOUT_S) -> bool:
    """True once every server's /health is 200; False as soon as one exits first. Fails at the deadline."""
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    with httpx.Client(timeout=2.0) as http:
        while pending and time.monotonic() < deadline:
            for server in list(pending):
                if server.process.poll() is not None:
                    return False
                try:
                    if http.get(f"{server.base_url}/health").status_code == 200:
                        server.remember_tree()
                        pending.remove(server)
                except httpx.TransportError:
                    pass
            if pending:
                try:  # the poll interval, and an early exit if the first pending server dies
                    pending[0].process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
    if pending:
        pytest.fail(f"not healthy within {timeout_s} s\n" + "\n".join(s.log()[-3000:] for s in pending))
    return True


def kill_all(servers: list[Server]) -> None:
    for server in servers:
        server.kill_all()


def stop_all(servers: list[Server], timeout_s: float = 20.0) -> None:
    """SIGTERM every server at once (an orderly stop of the whole group); each exits 0, nothing is left."""
    for server in servers:
        server.remember_tree()
    for server in servers:
        server.process.send_signal(signal.SIGTERM)
    for server in servers:
        try:
            code = server.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"server {server.port} did not exit within {timeout_s} s of SIGTERM\n{server.log()[-4000:]}")
        assert code == 0, f"server {server.port} exited with {code}\n{server.log()[-4000:]}"
    for server in servers:
        assert not server.wait_gone(), f"processes left\n{server.log()[-4000:]}"
        assert "Traceback" not in server.log(), f"a traceback was logged\n{server.log()[-4000:]}"


def _start_external(log_dir: Path, model: str, api_servers: int) -> list[Server]:
    rpc = free_port()
    ports = [free_port() for _ in range(2)]
    tag = uuid.uuid4().hex[:6]
    return [launch(log_dir / f"rank{r}-{tag}.log", model, "-dp", "2", "--data-parallel-rank", str(r),
                   "--port", str(ports[r]), "-dpa", "127.0.0.1", "-dpp", str(rpc),
                   "--api-server-count", str(api_servers))
            for r in range(2)]


@contextmanager
def external_group(log_dir: Path, api_servers: int = 1, model: str = MOE) -> Iterator[list[Server]]:
    """Both rank servers of a dp=2 external-LB group, healthy; stopped together (exit 0 each) afterwards unless
    the test ended them itself."""
    servers = _start_external(log_dir, model, api_servers)
    try:
        if not wait_all_healthy(servers) and any(PORT_RACE.search(s.log()) for s in servers):
            kill_all(servers)  # lost a race for one of the ports: once more, on fresh ones
            servers = _start_external(log_dir, model, api_servers)
            wait_all_healthy(servers)
        for s in servers:
            if s.process.poll() is not None:
                pytest.fail(f"server exited with {s.process.returncode} before ready\n{s.log()[-4000:]}")
        yield servers
        if any(s.process.poll() is None for s in servers):
            stop_all(servers)
    finally:
        if any(s.process.poll() is None or s.remaining() for s in servers):
            kill_all(servers)


def api_count(servers: list[Server]) -> int:
    return int(servers[0].args[servers[0].args.index("--api-server-count") + 1])


async def _get_json(base_url: str, path: str) -> Any:
    async with httpx.AsyncClient(base_url=base_url, timeout=10.0) as http:
        r = await http.get(path, headers={"Connection": "close"})  # fresh connections reach every API process
        assert r.status_code == 200, r.text
        return r.json()


@contextmanager
def single_rank_endpoints(logs: Path, count: int, *args: str) -> Iterator[list[Server]]:
    """``count`` single-rank ``asyncdp serve`` endpoints of ``MODEL`` (``args`` added), started together on free
    ports; each one still running at the end is stopped with SIGTERM and must exit 0 with nothing left."""
    servers = [launch(logs / f"endpoint{i}.log", MODEL, "--port", str(free_port()), *args) for i in range(count)]
    try:
        if not wait_all_healthy(servers):
            pytest.fail("an endpoint exited before it was healthy\n" + "\n".join(s.log()[-3000:] for s in servers))
        yield servers
        stop_all([s for s in servers if s.process.poll() is None])
    finally:
        kill_all([s for s in servers if s.process.poll() is None or s.remaining()])
