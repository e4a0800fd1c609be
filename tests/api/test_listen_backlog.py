"""The HTTP listener keeps the pending-connection queue asyncdp asks for: Hypercorn listens again on the socket it
is handed, and with its default (100) a burst of clients past that waited for SYN retries."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from asyncdp.transport.http_socket import LISTEN_BACKLOG
from tests.api.conftest import running

pytestmark = pytest.mark.anyio


def _listen_queue(port: int) -> int:
    """The accept queue's limit of the socket listening on ``port`` (``ss`` shows it as Send-Q)."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    (line,) = out.splitlines()
    return int(line.split()[2])


def _somaxconn() -> int:
    return int(Path("/proc/sys/net/core/somaxconn").read_text())


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs iproute2's ss")
async def test_the_listener_keeps_its_backlog_once_hypercorn_serves_it() -> None:
    expected = min(LISTEN_BACKLOG, _somaxconn())
    async with running() as srv:
        port = int(srv.base_url.rsplit(":", 1)[1])
        assert (await srv.http.get("/health")).status_code == 200  # Hypercorn is serving the socket by now
        assert _listen_queue(port) == expected
