"""Child processes of a deployment: spawn, control channel, parent-death detection, orderly stop.

Every asyncdp child is ``python -m asyncdp.worker --control-fd N``. The parent keeps the other end of a Unix
socket pair: the *control channel*. It carries typed messages (:data:`asyncdp.messages.ControlMessage`, the one
msgpack codec) in length-prefixed frames both ways: the parent sends a ``WorkerHello`` first (the child's role
config, :mod:`asyncdp.config.roles`), then commands (``Stopping``, ``Shutdown``, ``ProcessTable``); the child
reports events (``CoordinatorListening``, ``ApiListening``, ``ChildReady``, ``ApiStopped``). An unknown or
malformed frame is a :class:`~asyncdp.errors.ProtocolError`; readers log and drop it (the framing stays intact). EOF on the channel means the parent died, and
the child exits (spec §12.5 "no orphans"); on Linux the child also asks for SIGHUP on parent death (prctl), which
starts a bounded grace on a thread of its own (:func:`asyncdp.runtime.exit_after_parent_death`).
A child that finds its parent gone when it ends removes the deployment's run directory (the parent removes it
itself on an orderly stop, but not when it was SIGKILLed).

Children start in their own session, so a terminal's Ctrl-C reaches only the top process, which then stops
children in order (API servers -> engines -> coordinator).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import anyio.abc
import sniffio
from anyio.streams.buffered import BufferedByteReceiveStream

from asyncdp import messages as m
from asyncdp.config.flags import SECRET_ENVS
from asyncdp.config.roles import RoleConfig
from asyncdp.errors import ChildExited, ProtocolError

log = logging.getLogger(__name__)

MAX_CONTROL_FRAME = 16 << 20
_HEADER = struct.Struct(">I")
C = TypeVar("C", bound=m.ControlMessage)


def frame(msg: m.ControlMessage) -> bytes:
    data = m.encode(msg)
    return _HEADER.pack(len(data)) + data


def read_frame_blocking(fd: int) -> m.ControlMessage | None:
    """Read exactly one frame from ``fd`` without consuming anything after it (the worker hello, read before the
    event loop starts). None at EOF."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_CONTROL_FRAME:
        raise ProtocolError(f"control frame of {size} bytes exceeds {MAX_CONTROL_FRAME}")
    data = _read_exactly(fd, size)
    return None if data is None else m.decode_control(data)


def _read_exactly(fd: int, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


class ControlChannel:
    """Typed control messages in length-prefixed msgpack frames over a connected Unix socket."""

    def __init__(self, stream: anyio.abc.ByteStream) -> None:
        self._stream = stream
        self._reader = BufferedByteReceiveStream(stream)
        self._lock = anyio.Lock()
        self.peer_gone = False  # a receive reached the end of the stream: the other side closed it or died

    @classmethod
    async def from_fd(cls, fd: int) -> ControlChannel:
        return cls(await anyio.abc.UNIXSocketStream.from_socket(socket.socket(fileno=fd)))

    async def send(self, msg: m.ControlMessage) -> None:
        async with self._lock:
            await self._stream.send(frame(msg))

    async def receive(self) -> m.ControlMessage:
        """The next message; EndOfStream when the peer is gone, ProtocolError for a frame that is not one."""
        try:
            (size,) = _HEADER.unpack(await self._reader.receive_exactly(_HEADER.size))
            if size > MAX_CONTROL_FRAME:
                raise ProtocolError(f"control frame of {size} bytes exceeds {MAX_CONTROL_FRAME}")
            data = await self._reader.receive_exactly(size)
        except (anyio.IncompleteRead, anyio.BrokenResourceError, ConnectionError):
            self.peer_gone = True
            raise anyio.EndOfStream from None
        return m.decode_control(data)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self._stream.aclose()
            except OSError:
                pass


async def follow_parent(control: ControlChannel, on_command: Callable[[m.ControlMessage], None], *,
                        who: str) -> None:
    """Child side: hand every command from the parent to ``on_command``; return when the channel reaches EOF,
    which means the parent died (the caller then ends the process with exit code 1). A frame that is no control
    message is logged and dropped."""
    while True:
        try:
            cmd = await control.receive()
        except anyio.EndOfStream:
            log.error("%s: the parent process is gone; exiting", who)
            return
        except ProtocolError as exc:
            log.error("%s: dropped a control frame from the parent: %s", who, exc)
            continue
        on_command(cmd)


@dataclass
class ChildProcess:
    """A spawned child as its parent sees it."""

    name: str
    role: str
    rank: int | None
    process: anyio.abc.Process
    control: ControlChannel
    events: dict[type, m.ControlMessage] = field(default_factory=dict)  # the last of each type
    _changed: anyio.Event = field(default_factory=anyio.Event)
    exited: anyio.Event = field(default_factory=anyio.Event)
    events_ended: anyio.Event = field(default_factory=anyio.Event)  # its control channel reached EOF
    killed: bool = False  # its parent SIGKILLed its tree while it ran: it did not stop in order

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def describe(self) -> str:
        rank = "" if self.rank is None else f" rank {self.rank}"
        return f"{self.role}{rank} ({self.name}, pid {self.pid})"

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def read_events(self) -> None:
        """Task: record the child's control events until EOF."""
        while True:
            try:
                msg = await self.control.receive()
            except anyio.EndOfStream:
                self.events_ended.set()
                return
            except ProtocolError as exc:
                log.error("%s: dropped a control frame: %s", self.describe(), exc)
                continue
            self.events[type(msg)] = msg
            self._notify()

    def event(self, kind: type[C]) -> C | None:
        """The last ``kind`` event the child reported, if any."""
        found = self.events.get(kind)
        return found if isinstance(found, kind) else None

    async def wait_event(self, kind: type[C]) -> C:
        """Wait until the child reported a ``kind`` event; raise ChildExited if it died first."""
        while (found := self.event(kind)) is None:
            if self.exited.is_set():
                raise ChildExited(self)
            await self._changed.wait()
        return found

    async def watch_exit(self) -> int:
        """Task: wait for the process to end; returns its exit code."""
        code = await self.process.wait()
        self.exited.set()
        self._notify()
        return code

    def send_signal(self, sig: int = signal.SIGTERM) -> None:
        if self.process.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill_tree(self) -> None:
        """SIGKILL the child's whole process group (it leads its own session)."""
        if self.process.returncode is None:
            self.killed = True
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.send_signal(signal.SIGKILL)

    async def stop(self, *, grace_s: float, sig: int = signal.SIGTERM) -> int | None:
        """Signal, wait up to ``grace_s``, then kill the tree. Returns the exit code (None if unknown).

        A stopped child (SIGSTOP, a frozen container; what a lost heartbeat often is) cannot act on the signal
        until continued, so it is killed at once: its grace would only stretch the teardown (spec §13 bounds a
        lost engine's teardown by the heartbeat timeout + 2 s)."""
        self.send_signal(sig)
        if process_is_stopped(self.pid) and not self.exited.is_set():
            log.warning("%s is stopped (SIGSTOP or frozen), so it cannot exit by itself; killing", self.describe())
            grace_s = 0.0
        with anyio.move_on_after(grace_s):
            await self.exited.wait()
        if not self.exited.is_set():
            if grace_s:
                log.warning("%s did not exit within %.1f s; killing", self.describe(), grace_s)
            self.kill_tree()
            with anyio.move_on_after(2.0):
                await self.exited.wait()
        return self.process.returncode


def process_is_stopped(pid: int) -> bool:
    """Whether ``pid`` is in the stopped state (``T``: SIGSTOP or SIGTSTP; ``t``: stopped by a tracer). False when it
    cannot be told (no ``/proc``, the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) S ...": comm may hold spaces and parentheses, so the state follows the last ')'.
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] in (b"T", b"t")


def _child_env(extra: dict[str, str] | None) -> dict[str, str]:
    """The parent's environment, with the parent's own asyncdp first on the path: a child must run the very
    code its parent runs (a source checkout, a worktree), not whatever else is installed. Without the variables
    that hold a secret (the deployment secret, the API key): a child gets them in its role config, and its
    environment is readable in /proc."""
    env = {**{k: v for k, v in os.environ.items() if k not in SECRET_ENVS}, **(extra or {})}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


async def spawn_child(
    *,
    name: str,
    role: str,
    rank: int | None,
    config: RoleConfig,
    backend: str,
    pass_fds: tuple[int, ...] = (),
    env: dict[str, str] | None = None,
    log_prefix: str | None = None,
    log_level: str = "INFO",
    run_dir: str | None = None,
) -> ChildProcess:
    """Start ``python -m asyncdp.worker`` for ``role`` and send it its configuration (a ``WorkerHello``).

    ``run_dir``: the deployment's run directory (sockets, metrics files). A child that outlives its parent
    (the launcher was SIGKILLed) removes it on its way out, so the directory cannot outlive the deployment."""
    parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        child_fd = child_sock.fileno()
        process = await anyio.open_process(
            [sys.executable, "-m", "asyncdp.worker", "--control-fd", str(child_fd), "--name", name],
            stdin=None,
            stdout=None,
            stderr=None,
            pass_fds=(child_fd, *pass_fds),
            start_new_session=True,
            env=_child_env(env),
        )
    except BaseException:
        parent_sock.close()
        raise
    finally:
        child_sock.close()
    control = ControlChannel(await anyio.abc.UNIXSocketStream.from_socket(parent_sock))
    child = ChildProcess(name=name, role=role, rank=rank, process=process, control=control)
    await control.send(m.WorkerHello(
        role=config, name=name, parent_pid=os.getpid(), backend=backend,
        # PR_SET_PDEATHSIG fires when the *thread* that forked the child exits. asyncio forks from the event-loop
        # thread, which lives as long as the parent; trio forks from a worker thread of its cache, which exits
        # when idle and would signal a healthy child seconds after it started. There the child watches a pidfd
        # of its parent instead (asyncdp.runtime), besides the control channel's EOF.
        parent_death_signal=sniffio.current_async_library() != "trio",
        log_prefix=log_prefix or name, log_level=log_level, run_dir=run_dir))
    return child
