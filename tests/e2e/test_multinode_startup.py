"""End to end: what a multi-node launch says when the deployment it names is not there (spec §4.2, §5.3).

* a headless node whose ``-dpp`` names an HTTP port exits 1 with one line naming the address and the flags.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import pytest

from tests.e2e.conftest import MODEL, Server
from tests.e2e.multinode import Deployment, headless, launch_node, wait_code

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


def last_error(node: Server) -> str:
    errors = [line for line in node.log().splitlines() if line.startswith("ERROR ")]
    return errors[-1] if errors else ""


@asynccontextmanager
async def http_port() -> AsyncIterator[int]:
    """An HTTP server on 127.0.0.1, port 0, answering what hypercorn answers a request it cannot parse."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def answer(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(b"HTTP/1.1 400 \r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, answer)
        yield listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.cancel_scope.cancel()


async def test_a_headless_node_pointed_at_an_http_port_exits_1_naming_the_address_and_the_flags(tmp_path: Path) -> None:
    async with http_port() as port:
        node = launch_node(headless("-dp", "3", "-dpl", "1", "-dpr", "2"), port, tmp_path / "headless.log", MODEL)
        dep = Deployment([node], [headless()], port, MODEL)
        try:
            assert await wait_code(node, 60, dep) == 1
        finally:
            dep.kill_all()
    line = last_error(node)
    assert f"the peer at tcp:127.0.0.1:{port} is not an asyncdp handshake listener" in node.log(), node.log()
    assert "--data-parallel-address/--data-parallel-rpc-port" in node.log(), node.log()
    assert "Traceback" not in node.log() and "bytes exceeds" not in node.log(), node.log()
    assert "headless node stopped (exit status 1)" in line, node.log()
