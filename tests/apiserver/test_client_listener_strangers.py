"""Strangers on an API server's client listener (TCP on the DP address when engines live on other nodes), over a
real socket on 127.0.0.1: each connection is dropped with at most one line that names its address, a port scan's
connect-and-close only at DEBUG, and the client keeps waiting for its real engines."""

from __future__ import annotations

import logging
import struct

import anyio
import pytest

from asyncdp import messages as m
from asyncdp.apiserver.client import DPClient
from asyncdp.transport import listen
from tests.apiserver.client_links import _config


class _Logged(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.event = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.event.set()


CASES = {  # what the stranger sends, the level of the one line, words of it
    "nothing": (b"", logging.DEBUG, "closed before its first frame"),
    "half_a_frame": (struct.pack(">I", 100) + b"\x82", logging.DEBUG, "closed before its first frame"),
    "http": (b"GET / HTTP/1.1\r\nhost: x\r\n\r\n", logging.WARNING, "not an asyncdp peer (b'GET / HTTP/1.1'"),
    "heartbeat": (b"", logging.WARNING, "sent Heartbeat instead of EngineReady"),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES)
async def test_a_stranger_on_the_client_listener_is_dropped_with_one_line_naming_it(caplog, case):
    sent, level, words = CASES[case]
    if case == "heartbeat":
        payload = m.encode(m.Heartbeat(sender="x", seq=1))
        sent = struct.pack(">I", len(payload)) + payload
    caplog.set_level(logging.DEBUG, logger="asyncdp.apiserver")
    logged = _Logged()
    logging.getLogger("asyncdp.apiserver").addHandler(logged)
    client = DPClient(_config(), tokenizer=None)
    listener, addr = await listen("tcp", host="127.0.0.1")
    host, port = addr.removeprefix("tcp:").rsplit(":", 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(client._links.accept, listener, tg)
        async with await anyio.connect_tcp(host, int(port)) as stream:
            local_port = stream.extra(anyio.abc.SocketAttribute.local_port)
            if sent:
                await stream.send(sent)
            if case in ("http", "heartbeat"):  # the client closes it
                with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await stream.receive()
        with anyio.fail_after(5):
            await logged.event.wait()
        assert not client.is_healthy()
        tg.cancel_scope.cancel()
    logging.getLogger("asyncdp.apiserver").removeHandler(logged)
    lines = [r for r in caplog.records if r.name.startswith("asyncdp.apiserver")]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == level and words in lines[0].getMessage()
    assert f"127.0.0.1:{local_port}" in lines[0].getMessage()
