"""The typed control channel between a parent and its child processes: one codec, tagged unions, and a frame
that is no control message is a ProtocolError (never a KeyError on a dict)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys

import anyio
import anyio.abc
import msgspec
import pytest

from asyncdp import messages as m
from asyncdp.config.flags import EngineConfig
from asyncdp.config.roles import EngineRole
from asyncdp.errors import ProtocolError
from asyncdp.transport.control import ControlChannel, follow_parent, frame, read_frame_blocking


def _raw(obj: object) -> bytes:
    data = msgspec.msgpack.encode(obj)
    return struct.pack(">I", len(data)) + data


async def _pair() -> tuple[socket.socket, ControlChannel]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return parent, ControlChannel(await anyio.abc.UNIXSocketStream.from_socket(child))


@pytest.mark.anyio
async def test_every_control_message_round_trips_through_the_channel():
    parent, channel = await _pair()
    sent = [m.Stopping(), m.Shutdown(reason="rank 1 died"), m.ChildReady(dp_rank=3), m.ApiStopped(drained=2, aborted=1),
            m.CoordinatorListening(engine_addr="unix:/e", client_addr="unix:/c"), m.ApiListening(client_addr="unix:/a"),
            m.PeerLeftGroup(dp_rank=1, reason="rank 1: its MoE group ended (rank 0 shut down)"),
            m.ProcessTable(processes=[m.ProcessRow(role="engine", rank=0, client_index=None, pid=7, host="h",
                                                   ports={})])]
    try:
        parent.sendall(b"".join(frame(msg) for msg in sent))
        got = [await channel.receive() for _ in sent]
    finally:
        await channel.aclose()
        parent.close()
    assert got == sent


@pytest.mark.anyio
@pytest.mark.parametrize("payload", [
    {"type": "Launch", "rank": 1},  # an unknown tag
    {"type": "Shutdown", "reason": 5},  # a malformed field
    {"cmd": "stopping"},  # the old untyped dict
])
async def test_unknown_or_malformed_control_frame_is_a_protocol_error(payload):
    parent, channel = await _pair()
    try:
        parent.sendall(_raw(payload))
        with pytest.raises(ProtocolError):
            await channel.receive()
    finally:
        await channel.aclose()
        parent.close()


@pytest.mark.anyio
async def test_a_link_message_on_the_control_channel_is_a_protocol_error():
    parent, channel = await _pair()
    try:
        data = m.encode(m.Goodbye(dp_rank=0))
        parent.sendall(struct.pack(">I", len(data)) + data)
        with pytest.raises(ProtocolError):
            await channel.receive()
    finally:
        await channel.aclose()
        parent.close()


@pytest.mark.anyio
async def test_child_drops_a_bad_command_and_still_follows_the_next_one():
    parent, channel = await _pair()
    seen: list[m.ControlMessage] = []
    try:
        parent.sendall(_raw({"type": "Reboot"}) + frame(m.Shutdown(reason="teardown")))
        parent.shutdown(socket.SHUT_WR)  # then the parent is gone
        with anyio.fail_after(5):
            await follow_parent(channel, seen.append, who="test child")
    finally:
        await channel.aclose()
        parent.close()
    assert seen == [m.Shutdown(reason="teardown")]


def test_worker_hello_carries_the_typed_role_config_and_is_read_frame_exactly():
    role = EngineRole(dp_rank=2, dp_size=4, engine=EngineConfig(executor="sim"), handshake_addr="unix:/hs")
    hello = m.WorkerHello(role=role, name="asyncdp-engine-dp2", parent_pid=1, run_dir="/tmp/asyncdp-x")
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        parent.sendall(frame(hello) + frame(m.Stopping()))
        first = read_frame_blocking(child.fileno())
        second = read_frame_blocking(child.fileno())
    finally:
        parent.close()
        child.close()
    assert first == hello and isinstance(first, m.WorkerHello) and first.role.engine == EngineConfig(executor="sim")
    assert second == m.Stopping()  # nothing after the hello was consumed with it


def test_worker_refuses_a_first_frame_that_is_not_a_hello():
    from asyncdp.worker import read_hello

    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        parent.sendall(frame(m.Stopping()))
        with pytest.raises(ProtocolError, match="expected WorkerHello"):
            read_hello(child.fileno())
    finally:
        parent.close()
        child.close()


@pytest.mark.anyio
async def test_the_channel_records_that_its_peer_is_gone_once_a_receive_meets_the_end():
    parent, channel = await _pair()
    parent.sendall(frame(m.Stopping()))
    assert isinstance(await channel.receive(), m.Stopping)
    assert not channel.peer_gone
    parent.close()
    with pytest.raises(anyio.EndOfStream):
        await channel.receive()
    assert channel.peer_gone
    await channel.aclose()


def test_a_child_knows_its_parent_exited_from_the_parents_pidfd_even_while_getppid_still_names_it():
    from asyncdp.worker import parent_exited

    stand_in = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    pidfd = os.pidfd_open(stand_in.pid)
    try:
        ppid = os.getppid()  # what getppid() still returns while the real parent is exiting
        assert not parent_exited(ppid, pidfd, wait_s=0.0)  # the stand-in lives
        assert not parent_exited(ppid, None, wait_s=1.0)  # no pidfd: getppid() alone
        assert parent_exited(stand_in.pid, pidfd, wait_s=0.0)  # getppid() names another process: gone
        stand_in.send_signal(signal.SIGKILL)
        assert parent_exited(ppid, pidfd, wait_s=10.0)  # readable once it has exited, before it is reaped
    finally:
        stand_in.kill()
        stand_in.wait()
        os.close(pidfd)


_CHILD = ("import signal, sys, time\n"
          "if sys.argv[1] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
          "print('ready', flush=True)\n"
          "time.sleep(60)\n")


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "killed"), [("stubborn", True), ("obedient", False)])
async def test_stop_marks_a_child_it_had_to_kill_and_only_that_one(kind, killed):
    # The launcher's exit status reads ``killed``: a stop that needed SIGKILL was not orderly.
    from asyncdp.transport.control import ChildProcess

    proc = await anyio.open_process([sys.executable, "-c", _CHILD, kind], start_new_session=True,
                                    stderr=subprocess.DEVNULL)
    child = ChildProcess(name=kind, role="engine", rank=1, process=proc, control=None)  # type: ignore[arg-type]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(child.watch_exit)
            assert proc.stdout is not None
            with anyio.fail_after(30):
                assert (await proc.stdout.receive()).startswith(b"ready")  # its SIGTERM handler is in place
            code = await child.stop(grace_s=0.5)
        assert child.killed is killed
        assert code == (-signal.SIGKILL if killed else -signal.SIGTERM)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.aclose()
