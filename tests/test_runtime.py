"""What every asyncdp process runs under: the event-loop guard (a queued wake-up of a cancelled future is not an
error) and the parent-death backstop of a child."""
from __future__ import annotations

import asyncio
import logging
import os
import select
import signal
import subprocess
import sys
import time

import anyio
import anyio.lowlevel
import pytest

from asyncdp import runtime


def _race(loop_errors: list[dict]) -> None:
    """Queue ``fut.set_result`` and cancel ``fut`` before the handle runs: anyio's raw-socket wait race."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda lp, ctx: loop_errors.append(ctx))
        runtime.install_loop_guards()  # on top of the recording handler, as run() does on top of the default
        fut = loop.create_future()
        loop.call_soon(fut.set_result, None)
        fut.cancel()
        await asyncio.sleep(0.01)
        # an unrelated error still reaches the handler
        loop.call_soon(lambda: 1 / 0)
        await asyncio.sleep(0.01)

    anyio.run(main, backend="asyncio")


def test_the_guard_drops_only_the_cancelled_future_wakeup() -> None:
    errors: list[dict] = []
    _race(errors)
    kinds = [type(ctx.get("exception")).__name__ for ctx in errors]
    assert kinds == ["ZeroDivisionError"], kinds


def test_without_the_guard_asyncio_reports_the_race(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_soon(fut.set_result, None)
        fut.cancel()
        await asyncio.sleep(0.01)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        anyio.run(main, backend="asyncio")
    assert any("InvalidStateError" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_run_passes_arguments_and_works_on_trio() -> None:
    async def add(a: int, b: int) -> int:
        await anyio.lowlevel.checkpoint()
        return a + b

    assert runtime.run(add, 2, 3, backend="trio") == 5
    assert runtime.run(add, 2, 3) == 5


# ---------------------------------------------------------------- parent death

_CHILD = """
import os, sys
from asyncdp import runtime
marker = sys.argv[1]
runtime.exit_after_parent_death(os.getppid(), 0.5, lambda: open(marker, "w").write("cleaned"))
print("armed", flush=True)
sys.stdin.read()  # the main thread is stuck in C (until the test closes the pipe): the grace must start anyway
"""
_MIDDLE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
print(child.pid, flush=True)
sys.stdin.read()  # killed by the test; the test's end closes the pipe, so neither outlives it
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_a_child_whose_parent_dies_gets_its_grace_then_cleans_up_and_exits(tmp_path) -> None:
    marker = tmp_path / "cleaned"
    middle = subprocess.Popen([sys.executable, "-c", _MIDDLE, _CHILD, str(marker)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # the child shares the middle's stdin
    child = exited = -1
    try:
        assert middle.stdout is not None
        child = int(middle.stdout.readline())
        exited = os.pidfd_open(child)  # readable once the child has exited (it is not ours to wait for)
        assert middle.stdout.readline().strip() == "armed"
        # twice the grace: nothing fires while the parent lives
        assert select.select([exited], [], [], 1.0)[0] == [] and not marker.exists()
        middle.kill()
        middle.wait()
        killed = time.monotonic()
        assert select.select([exited], [], [], 10.0)[0] == [exited], "the child outlived its parent"
        took = time.monotonic() - killed
        assert marker.read_text() == "cleaned"
        assert 0.4 <= took < 5, took  # the grace was given, and not much more
    finally:
        middle.kill()
        middle.wait()
        for pipe in (middle.stdin, middle.stdout):
            if pipe is not None:
                pipe.close()
        if exited >= 0:
            if not select.select([exited], [], [], 0)[0]:
                signal.pidfd_send_signal(exited, signal.SIGKILL)
            os.close(exited)
