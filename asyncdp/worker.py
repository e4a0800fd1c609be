"""Entry point of every asyncdp child process: ``python -m asyncdp.worker --control-fd N --name NAME``.

It reads a typed ``WorkerHello`` (the role's frozen config from :mod:`asyncdp.config.roles`) from the control
channel (blocking, before the event loop starts, because the anyio backend is part of it), names the process for
``ps``, arms parent-death detection and runs the role's main, chosen by the type of the role config, under
:func:`asyncdp.runtime.run`. A first frame that is no ``WorkerHello`` is a ProtocolError (exit 1). Exit codes: 0 orderly, 1 failure (spec implementation frame).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import select
import sys
from collections.abc import Awaitable

from asyncdp import messages as m
from asyncdp import runtime
from asyncdp.config.roles import ApiServerRole, CoordinatorRole, EngineRole, RoleConfig
from asyncdp.errors import ProtocolError
from asyncdp.logs import setup_logging
from asyncdp.transport.control import ControlChannel, read_frame_blocking

log = logging.getLogger("asyncdp.worker")

def role_main(role: RoleConfig, control: ControlChannel) -> Awaitable[int]:
    """The main of the role ``role`` configures. Imported lazily: a coordinator child must not pay for torch."""
    if isinstance(role, EngineRole):
        from asyncdp.engine.rank_process import run_rank_process

        return run_rank_process(role, control)
    if isinstance(role, CoordinatorRole):
        from asyncdp.coordinator.process import run_coordinator_process

        return run_coordinator_process(role, control)
    if isinstance(role, ApiServerRole):
        from asyncdp.apiserver.process import run_api_process

        return run_api_process(role, control)
    raise ProtocolError(f"no process main for role config {type(role).__name__}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncdp.worker")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--name", default="asyncdp-worker")
    args = parser.parse_args(argv)
    try:
        import setproctitle

        setproctitle.setproctitle(args.name)
    except ImportError:
        pass
    hello = read_hello(args.control_fd)
    # The control channel's EOF ends the process in order; this is the backstop, for a main thread that is busy
    # (a parent under trio forks from a worker thread: the kernel's parent-death signal would follow that thread).
    runtime.exit_after_parent_death(hello.parent_pid, PARENT_DEATH_GRACE_S,
                                    functools.partial(remove_orphaned_run_dir, hello.run_dir),
                                    by_signal=hello.parent_death_signal)
    parent = _pidfd(hello.parent_pid)
    setup_logging(prefix=hello.log_prefix or args.name, level=hello.log_level)
    control: ControlChannel | None = None

    async def run() -> int:
        nonlocal control
        control = await ControlChannel.from_fd(args.control_fd)
        return await role_main(hello.role, control)

    try:
        return runtime.run(run, backend=hello.backend)
    except KeyboardInterrupt:
        return 0
    finally:
        saw_eof = control is not None and control.peer_gone
        if parent_exited(hello.parent_pid, parent, wait_s=PARENT_EXIT_WAIT_S if saw_eof else 0.0):
            remove_orphaned_run_dir(hello.run_dir)
        if parent is not None:
            os.close(parent)


PARENT_EXIT_WAIT_S = 2.0
PARENT_DEATH_GRACE_S = 5.0  # after the kernel's parent-death signal, the longest a child takes to end by itself


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (Linux 5.3+), readable once that process has exited; None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def parent_exited(parent_pid: int, pidfd: int | None, *, wait_s: float) -> bool:
    """Whether the parent, ``parent_pid``, is gone. A SIGKILLed parent's descriptors close (its children see EOF
    on their control channels) while it is still exiting, before the kernel hands its children to a new parent, so
    ``getppid()`` alone can still name it: a child that saw the EOF waits up to ``wait_s`` on the parent's pidfd
    for its exit to complete."""
    if os.getppid() != parent_pid:
        return True
    if pidfd is None:
        return False
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(wait_s * 1000.0))


def remove_orphaned_run_dir(run_dir: str | None) -> None:
    """The parent died without cleaning up (SIGKILL): remove its run directory. Every orphaned child tries;
    whichever ends last removes what the others still held. Only an ``asyncdp-*`` directory is touched."""
    if not run_dir or not os.path.basename(os.path.normpath(run_dir)).startswith("asyncdp-"):
        return
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)


def read_hello(fd: int) -> m.WorkerHello:
    """The first control frame, which must be the ``WorkerHello``; exit 1 if the parent is gone before it."""
    hello = read_frame_blocking(fd)
    if hello is None:
        sys.exit(1)  # parent gone before sending the configuration
    if not isinstance(hello, m.WorkerHello):
        raise ProtocolError(f"expected WorkerHello as the first control frame, got {type(hello).__name__}")
    return hello


if __name__ == "__main__":
    exit_code = main()
    logging.shutdown()
    sys.stderr.flush()
    # A hard exit: an execution thread stuck in a collective must not keep a dead rank alive (spec §8.8).
    os._exit(exit_code)
