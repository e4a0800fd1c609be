"""A signal gate for tests/e2e/test_stop_before_signal_handlers.py, on ``PYTHONPATH`` only for the command it holds.

With ``ASYNCDP_TEST_SIGNAL_GATE=PATH`` in the environment, the process's first event loop (asyncio or trio, as
anyio runs it) runs, right after the first step of its main task and before any other task's, a callback of the
loop's own (no task's) that creates ``PATH`` and then waits, in Python code, until ``PATH.release`` exists: a stop
signal sent once ``PATH`` exists reaches the process, for certain, inside its running event loop, in the loop's
own code, before the server's own signal handlers are in place. The variable is taken out of the environment, so
the process's children run ungated.
"""

import os
import time

_gate = os.environ.pop("ASYNCDP_TEST_SIGNAL_GATE", None)


def _hold() -> None:
    open(_gate, "w").close()  # noqa: SIM115 - a marker
    while not os.path.exists(_gate + ".release"):
        time.sleep(0.01)  # Python code: a signal's handler runs here


if _gate:
    import asyncio.base_events

    import trio

    _run_forever = asyncio.base_events.BaseEventLoop.run_forever
    _trio_run = trio.run
    _held = False

    def _first() -> bool:
        global _held
        first, _held = not _held, True
        return first

    def run_forever(self):  # type: ignore[no-untyped-def]
        if _first():
            self.call_soon(_hold)  # after the main task's first step, which is queued already
        return _run_forever(self)

    def trio_run(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not _first():
            return _trio_run(fn, *args, **kwargs)

        async def held(*a):  # type: ignore[no-untyped-def]
            trio.lowlevel.current_trio_token().run_sync_soon(_hold)
            return await fn(*a)

        return _trio_run(held, *args, **kwargs)

    asyncio.base_events.BaseEventLoop.run_forever = run_forever
    trio.run = trio_run
