"""``python -m asyncdp`` and the ``asyncdp`` command: :func:`asyncdp.cli.main`, then the exit.

A server's top process ends with ``os._exit`` once its output is flushed: its children are gone and its files
closed by then, and the interpreter's teardown (collecting torch's objects) took 0.45 s more on an idle machine
and up to 2.4 s on a loaded one, past the 4.1 s a stop with ``--shutdown-timeout 0`` has (spec §12.5). So does
``bench calibrate``, the other command that loads torch (its profile is written whole, or not at all, by then): a
Ctrl-C took 0.5-2.6 s to end it after its "stopped the sweep" line, all of it that teardown; its exit status (130
or 143 from the ``SystemExit`` a signal raises) is kept. Other commands exit normally. (:func:`~asyncdp.cli.main` itself returns, for tests that run it in-process.)

A stop before the command has its own signal handling (a Ctrl-C or SIGTERM while it still imports, for about a
second, or before its own handlers are installed) ends it as its own handling would, without a traceback: a server
(``serve``, ``route``) exits 0, as a stopped server does (spec §12.5), any other command 128 + the signal's number
(130, 143), as a shell reports it. While the CLI is imported both signals raise through :func:`_stop_early` (so a
stop that lands inside a C extension's import, which Python turns into that import's ``ImportError``, is still
known for a stop). Then SIGINT is Python's own again (``KeyboardInterrupt``), and a server keeps SIGTERM raising
while it prepares its start, so what was begun is unwound (``finally`` blocks run: a run directory or a port lock
is let go). Neither raises inside a server's event loop, where it could land in the loop's own code (asyncio
logged it with a traceback and went on starting, the stop lost): from just before the loop starts until the
server's own handlers are in place, :func:`asyncdp.runtime.run` holds both, and the server takes what it held
first thing (:func:`asyncdp.runtime.take_early_stops`) for an orderly stop that starts nothing more. This module
imports nothing heavy itself: :func:`main` imports the CLI.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn

SERVERS = (["serve"], ["route"])  # commands that run until stopped: a stop is their normal end, exit 0


def main() -> int:
    """:func:`asyncdp.cli.main`, imported on the call (the import takes about a second: see the module's docstring)."""
    with _stops_while_importing():
        from asyncdp.cli import main as cli_main
    return cli_main()


@contextlib.contextmanager
def _stops_while_importing() -> Iterator[None]:
    """SIGINT and SIGTERM raise through :func:`_stop_early` for the block (where the command started with them
    at their defaults); afterwards SIGINT is Python's own again, and SIGTERM too but for a server."""
    installed = [(signum, default) for signum, default in ((signal.SIGINT, signal.default_int_handler),
                                                            (signal.SIGTERM, signal.SIG_DFL))
                 if signal.getsignal(signum) is default]  # (one ignored by whoever started us stays ignored)
    for signum, _default in installed:
        signal.signal(signum, _stop_early)
    try:
        # A multi-port supervisor starts its children with both blocked (asyncdp.runtime.die_with_parent_preexec),
        # so that one it sends before this point waits for this handling: it raises here, if it came.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum for signum, _default in installed])
        yield
    finally:
        for signum, default in installed:
            if signum == signal.SIGTERM and sys.argv[1:2] in SERVERS:
                continue  # raising while the server prepares its start (runtime.run holds it in the loop)
            if signal.getsignal(signum) is _stop_early:
                signal.signal(signum, default)


class _StoppedEarly(BaseException):
    """SIGTERM before the command installed its own handling (raised as SIGINT raises ``KeyboardInterrupt``)."""


_stopped_by: int | None = None  # the signal that stopped the command before its own handling took over


def _stop_early(signum: int, frame: FrameType | None) -> None:
    global _stopped_by
    _stopped_by = signum
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise _StoppedEarly(signum)


def skips_teardown(argv: list[str]) -> bool:
    """Whether the command ``argv`` (without the program name) ends with ``os._exit``: the ones that load torch."""
    return argv[:1] == ["serve"] or argv[:2] == ["bench", "calibrate"]


def entry() -> NoReturn:
    fast = skips_teardown(sys.argv[1:])
    server = sys.argv[1:2] in SERVERS
    stopped_by: int | None = None
    try:
        code = main()
    except SystemExit as exc:  # bench calibrate stopped by a signal (130, 143)
        if not fast or not isinstance(exc.code, int):
            raise
        code = exc.code
    except KeyboardInterrupt:  # Ctrl-C before the command's own handling took over
        stopped_by = signal.SIGINT
    except BaseException:
        # Stopped while importing, or by SIGTERM before a server's own handling took over. Whatever the exception:
        # one raised inside the import of a C extension comes out as that import's ImportError.
        if _stopped_by is None:
            raise
        stopped_by = _stopped_by
    if stopped_by is not None:
        code = 0 if server else 128 + stopped_by
        print(f"asyncdp: stopped by {signal.Signals(stopped_by).name} while starting", file=sys.stderr)
    if not fast:
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
