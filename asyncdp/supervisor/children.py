"""A supervised child process: spawn, parent-death arming, exit watching, signals, killing its tree.

Theory of operation. Each child is spawned (not forked into a copy of the supervisor: ``fork`` + ``exec`` of
``python -m asyncdp serve ...``) in its own session, with stdout and stderr inherited so that its log lines
appear in the supervisor's output, and stdin on ``/dev/null``. The environment is the supervisor's, with this
asyncdp first on ``PYTHONPATH`` (a child runs the very code its parent runs), plus the command's own variables.

No orphans (spec §12.5): between fork and exec the child asks the kernel for SIGKILL when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, Linux) and exits at once if the parent is already gone. The kernel sends that
signal when the parent *thread* that forked ends, so the fork happens here, on the event loop's own thread,
which lives as long as the supervisor: ``subprocess.Popen`` is called directly (it returns once the child has
exec'd, in milliseconds), not through a worker thread as trio's ``open_process`` would (a worker thread exits
when idle and would kill a healthy child). SIGKILL, not SIGTERM: an orphan must go within 5 s whatever its
``--shutdown-timeout``; its own children then see their parent gone and exit (their own no-orphan rule).

The exit is awaited on a pidfd (``os.pidfd_open`` + ``anyio.wait_readable``; a 50 ms poll where pidfds are
missing), then reaped with ``Popen.poll``. Nothing else reaps these pids: neither anyio backend waits on a
process it did not start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from pathlib import Path

import anyio

from asyncdp import runtime
from asyncdp.config.flags import environ
from asyncdp.supervisor.derive import ChildCommand

log = logging.getLogger("asyncdp.supervisor")

_POLL_S = 0.05


def describe_exit(returncode: int) -> str:
    """``1`` -> ``"status 1"``; ``-9`` -> ``"signal SIGKILL"`` (as in "exited with ...")."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"


def child_environment(extra: dict[str, str]) -> dict[str, str]:
    """The supervisor's environment, this asyncdp first on ``PYTHONPATH``, plus ``extra``."""
    env = {**environ(), **extra}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, from one scan of ``/proc`` (empty where there is no ``/proc``)."""
    parents: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()  # the command name in parentheses may hold spaces
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class SupervisedChild:
    """One child of the supervisor, started by :meth:`spawn`."""

    def __init__(self, command: ChildCommand, popen: subprocess.Popen[bytes]) -> None:
        self.command = command
        self.popen = popen
        self.exited = anyio.Event()

    @classmethod
    def spawn(cls, command: ChildCommand) -> SupervisedChild:
        popen = subprocess.Popen(
            list(command.argv), stdin=subprocess.DEVNULL, stdout=None, stderr=None, start_new_session=True,
            env=child_environment(dict(command.env)), preexec_fn=runtime.die_with_parent_preexec(os.getpid(), block_stops=True))
        return cls(command, popen)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    @property
    def alive(self) -> bool:
        return self.popen.returncode is None

    def describe(self) -> str:
        """``child rank 3 (port 8001, pid 4242)``."""
        return self.command.describe(self.pid)

    async def wait_exit(self) -> int:
        """Wait until the child has exited (and reap it); its return code (negative: killed by a signal)."""
        try:
            pidfd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pidfd = None
        try:
            while (code := self.popen.poll()) is None:
                if pidfd is not None:
                    await anyio.wait_readable(pidfd)
                else:
                    await anyio.sleep(_POLL_S)
        finally:
            if pidfd is not None:
                os.close(pidfd)
        self.exited.set()
        return code

    def send_signal(self, sig: int) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def kill_tree(self) -> None:
        """SIGKILL the child, its process group and every descendant (the asyncdp processes it started lead
        sessions of their own, so the group alone does not reach them)."""
        if not self.alive:
            return
        below = descendants(self.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        for pid in [self.pid, *below]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
