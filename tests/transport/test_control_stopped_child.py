"""A stopped child (SIGSTOP: a frozen engine, what a lost heartbeat often is) is killed at once by ``stop``.

It cannot act on SIGTERM until continued, so waiting out its grace only stretched the MoE group's teardown past
the spec's bound for a lost engine (the heartbeat timeout + 2 s): a ``-dpm`` deployment with one engine stopped
took 9.3 s to end, 3.5 s of it the grace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import anyio
import pytest

from asyncdp.transport.control import ChildProcess, process_is_stopped

_CHILD = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


@pytest.mark.anyio
async def test_stop_kills_a_stopped_child_without_waiting_its_grace() -> None:
    proc = await anyio.open_process([sys.executable, "-c", _CHILD], start_new_session=True,
                                    stderr=subprocess.DEVNULL)
    child = ChildProcess(name="frozen", role="engine", rank=1, process=proc, control=None)  # type: ignore[arg-type]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(child.watch_exit)
            assert proc.stdout is not None
            with anyio.fail_after(30):
                assert (await proc.stdout.receive()).startswith(b"ready")
            assert not process_is_stopped(proc.pid)
            os.kill(proc.pid, signal.SIGSTOP)
            for _ in range(1000):  # the kernel stops it asynchronously: up to 10 s
                if process_is_stopped(proc.pid):
                    break
                await anyio.sleep(0.01)
            assert process_is_stopped(proc.pid)
            with anyio.fail_after(15):  # the grace is 60 s: only a kill without it ends in time
                code = await child.stop(grace_s=60)
        assert child.killed
        assert code == -signal.SIGKILL
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.aclose()


def test_a_process_that_is_gone_or_running_is_not_stopped() -> None:
    assert not process_is_stopped(os.getpid())
    assert not process_is_stopped(2**22 + 12345)  # above pid_max's default: no such process
