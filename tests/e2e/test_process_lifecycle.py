"""End to end: startup, a SIGKILLed launcher (or a whole tree killed at once), and many streams cancelled at once (issue #12, items 11 and 13)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import BASE_ARGS, MODEL, _launch, descendants, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def test_health_answers_503_at_once_while_the_ranks_are_still_loading(tmp_path: Path) -> None:
    """The port is bound before the ranks load, and /health answers 503 then instead of waiting. On a loaded
    machine the ranks can finish loading before the first answer; such a launch shows nothing, and is retried (at
    most three launches). A /health that waited until the ranks were ready would answer 200 first every time."""
    for attempt in range(3):
        statuses = await _health_while_starting(tmp_path / f"startup{attempt}.log")
        assert set(statuses) <= {200, 503}, statuses
        if 503 in statuses:
            return
    pytest.fail(f"/health never answered 503 while the ranks were loading, in 3 launches: {statuses}")


async def _health_while_starting(log: Path) -> list[int]:
    """Poll /health from the moment the port accepts until it answers 200; while it answers 503, a completion must
    be refused with an OpenAI-style 503 too (unless the ranks became ready in between)."""
    server = _launch((*BASE_ARGS, "-dp", "2", "--api-server-count", "1"), log)
    try:
        statuses: list[int] = []
        with anyio.fail_after(90):
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as http:
                while 200 not in statuses:
                    assert server.process.poll() is None, server.log()[-3000:]
                    try:
                        r = await http.get("/health")
                    except httpx.ConnectError:  # the launcher has not bound the port yet
                        await anyio.sleep(0.05)
                        continue
                    statuses.append(r.status_code)
                    if r.status_code == 503:  # answered while starting, not queued until ready
                        gen = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                                       "max_tokens": 1})
                        if gen.status_code != 200:  # the ranks may have become ready in between
                            assert gen.status_code == 503, gen.text
                            assert gen.json()["error"]["message"]
                    await anyio.sleep(0.05)
        return statuses
    finally:
        server.kill_all()


@pytest.fixture
def run_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary directory of these deployments' own (TMPDIR), so that other deployments on the machine (a
    concurrent test run, a hand-run server) neither add to nor remove from the run directories counted here."""
    root = Path(tempfile.mkdtemp(prefix="adp-lc-"))  # short: the deployment's Unix sockets live under it too
    monkeypatch.setenv("TMPDIR", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _run_dirs(root: Path) -> set[str]:
    return {str(p) for p in root.glob("asyncdp-*") if p.is_dir()}


async def test_a_sigkilled_launcher_leaves_no_run_directory_once_its_children_exited(tmp_path: Path,
                                                                                   run_root: Path) -> None:
    before = _run_dirs(run_root)
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2") as server:
        children = descendants(server.process.pid)
        ours = _run_dirs(run_root) - before
        assert len(ours) == 1, ours  # the deployment's run directory, while it runs
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=10)
        with anyio.fail_after(30):
            while any(_alive(pid) for pid in children):  # noqa: ASYNC110 - polling other processes
                await anyio.sleep(0.1)
        assert not (ours & _run_dirs(run_root)), f"left behind: {ours}\n{server.log()[-3000:]}"


def test_the_next_launch_removes_the_run_directory_of_a_deployment_killed_whole(tmp_path: Path,
                                                                              run_root: Path) -> None:
    before = _run_dirs(run_root)
    with serve(tmp_path, "-dp", "1") as first:
        ours = _run_dirs(run_root) - before
        assert len(ours) == 1, ours
        stale = Path(ours.pop())
        first.kill_every_process()  # the whole tree at once (kill -9 of all of it, an OOM kill of its cgroup)
        assert not first.wait_gone(10), first.log()[-3000:]
    assert stale.is_dir() and (stale / "owner").is_file()  # nobody was left to remove it
    with serve(tmp_path, "-dp", "1") as second:
        assert not stale.exists()
        assert f"removed {stale}, the run directory of a deployment (launcher pid {first.process.pid})" in second.log()
        assert len(_run_dirs(run_root) - before) == 1  # the second deployment's own
    assert not (_run_dirs(run_root) - before)


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()  # noqa: ASYNC240 - a tiny /proc read
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"


async def test_many_streams_reset_at_once_do_not_flood_the_log_with_send_warnings(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "2", "--api-server-count", "1", "--max-model-len", "2048") as server:
        body = json.dumps({"model": MODEL, "prompt": "cancel me", "max_tokens": 1500, "stream": True,
                           "ignore_eos": True}).encode()
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        num_streams = 100

        def open_stream() -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            sock.sendall(request)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # streaming has begun
            return sock

        socks: list[socket.socket] = []

        async def open_one() -> None:
            socks.append(await anyio.to_thread.run_sync(open_stream))

        async with anyio.create_task_group() as tg:  # opened side by side (anyio's 40 worker threads)
            for _ in range(num_streams):
                tg.start_soon(open_one)
        assert len(socks) == num_streams
        for sock in socks:  # every client resets its connection at once (RST, not FIN)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        with anyio.fail_after(60):  # every stream is aborted and released
            async with httpx.AsyncClient(base_url=server.base_url, timeout=10.0) as http:
                while any(r["inflight"] for r in (await http.get("/server_info")).json()["managed_ranks"]):  # noqa: ASYNC110
                    await anyio.sleep(0.2)
        warnings = len(re.findall(r"socket\.send\(\) raised exception", server.log()))
        assert warnings <= 1, f"{warnings} send warnings\n{server.log()[-2000:]}"


