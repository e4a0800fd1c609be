"""What every asyncdp process runs under: the event-loop guard (a queued wake-up of a cancelled future is not an
error) and the parent-death backstop of a child."""
from __future__ import annotations

import asyncio
import logging
import sys

import anyio
import anyio.lowlevel
import pytest

from asyncdp import runtime
from tests.parent_death import assert_grace_after_parent_death


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
    assert_grace_after_parent_death(_MIDDLE, _CHILD, tmp_path / "cleaned")
