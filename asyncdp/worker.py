"""Entry point of every asyncdp child process: ``python -m asyncdp.worker --control-fd N --name NAME``.

It reads its role and configuration from the control channel (blocking, before the event loop starts, because
the anyio backend is part of the configuration), names the process for ``ps``, arms parent-death detection and
runs the role's main under :func:`asyncdp.runtime.run`. Exit codes: 0 orderly, 1 failure (spec implementation frame).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from asyncdp import runtime
from asyncdp.logs import setup_logging
from asyncdp.transport.control import ControlChannel

log = logging.getLogger("asyncdp.worker")

PR_SET_PDEATHSIG = 1


def _roles() -> dict[str, Callable[[dict[str, Any], ControlChannel], Awaitable[int]]]:
    # Imported lazily: a coordinator child must not pay for torch.
    def engine(payload: dict[str, Any], control: ControlChannel) -> Awaitable[int]:
        from asyncdp.engine.rank_process import run_rank_process

        return run_rank_process(payload, control)

    def coordinator(payload: dict[str, Any], control: ControlChannel) -> Awaitable[int]:
        from asyncdp.coordinator.process import run_coordinator_process

        return run_coordinator_process(payload, control)

    def api(payload: dict[str, Any], control: ControlChannel) -> Awaitable[int]:
        from asyncdp.apiserver.process import run_api_process

        return run_api_process(payload, control)

    return {"engine": engine, "coordinator": coordinator, "api": api}


def _arm_parent_death_signal(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(1)


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
    hello = _read_control_hello(args.control_fd)
    if hello.get("parent_death_signal", True):
        _arm_parent_death_signal(hello["parent_pid"])
    setup_logging(prefix=hello.get("log_prefix") or args.name, level=hello.get("log_level", "INFO"))
    role_main = _roles()[hello["role"]]

    async def run() -> int:
        control = await ControlChannel.from_fd(args.control_fd)
        return await role_main(hello["payload"], control)

    try:
        return runtime.run(run, backend=hello.get("backend", "asyncio"))
    except KeyboardInterrupt:
        return 0
    finally:
        if os.getppid() != hello["parent_pid"]:
            remove_orphaned_run_dir(hello.get("run_dir"))


def remove_orphaned_run_dir(run_dir: str | None) -> None:
    """The parent died without cleaning up (SIGKILL): remove its run directory. Every orphaned child tries;
    whichever ends last removes what the others still held. Only an ``asyncdp-*`` directory is touched."""
    if not run_dir or not os.path.basename(os.path.normpath(run_dir)).startswith("asyncdp-"):
        return
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)


def _read_control_hello(fd: int) -> dict[str, Any]:
    """Read exactly one line from the control socket without consuming anything after it."""
    data = bytearray()
    while True:
        byte = os.read(fd, 1)
        if not byte:
            sys.exit(1)  # parent gone before sending the configuration
        if byte == b"\n":
            return orjson.loads(bytes(data))
        data += byte


if __name__ == "__main__":
    exit_code = main()
    logging.shutdown()
    sys.stderr.flush()
    # A hard exit: an execution thread stuck in a collective must not keep a dead rank alive (spec §8.8).
    os._exit(exit_code)
