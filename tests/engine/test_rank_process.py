"""The engine process main, without a front-end: what it does when the handshake never comes."""

from __future__ import annotations

import socket

import anyio
import anyio.abc
import pytest
import trio

from asyncdp.config.flags import EngineConfig
from asyncdp.config.roles import EngineRole
from asyncdp.engine.rank_process import HANDSHAKE_TIMEOUT_S, run_rank_process
from asyncdp.transport.control import ControlChannel


@pytest.mark.trio
async def test_missing_front_end_exits_1_after_the_handshake_timeout(tmp_path, autojump_clock):
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    control = ControlChannel(await anyio.abc.UNIXSocketStream.from_socket(child))
    role = EngineRole(dp_rank=0, dp_size=1, engine=EngineConfig(executor="sim"),
                      handshake_addr=f"unix:{tmp_path / 'nobody-listens.sock'}")
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT_S + 60):  # virtual seconds; the parent stays alive throughout
            code = await run_rank_process(role, control)
    finally:
        await control.aclose()
        parent.close()
    assert code == 1
