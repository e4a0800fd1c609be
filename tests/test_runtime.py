"""The event-loop guard every asyncdp process runs under: a queued wake-up of a cancelled future is not an error."""
from __future__ import annotations

import asyncio
import logging

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
