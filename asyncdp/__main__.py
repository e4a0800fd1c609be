"""``python -m asyncdp`` and the ``asyncdp`` command: :func:`asyncdp.cli.main`, then the exit.

A server's top process ends with ``os._exit`` once its output is flushed: its children are gone and its files
closed by then, and the interpreter's teardown (collecting torch's objects) took 0.45 s more on an idle machine
and up to 2.4 s on a loaded one, past the 4.1 s a stop with ``--shutdown-timeout 0`` has (spec §12.5). So does
``bench calibrate``, the other command that loads torch (its profile is written whole, or not at all, by then): a
Ctrl-C took 0.5-2.6 s to end it after its "stopped the sweep" line, all of it that teardown; its exit status (130
or 143 from the ``SystemExit`` a signal raises) is kept. Other commands exit normally. (:func:`~asyncdp.cli.main` itself returns, for tests that run it in-process.)
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

from asyncdp.cli import main


def skips_teardown(argv: list[str]) -> bool:
    """Whether the command ``argv`` (without the program name) ends with ``os._exit``: the ones that load torch."""
    return argv[:1] == ["serve"] or argv[:2] == ["bench", "calibrate"]


def entry() -> NoReturn:
    fast = skips_teardown(sys.argv[1:])
    try:
        code = main()
    except SystemExit as exc:  # bench calibrate stopped by a signal (130, 143)
        if not fast or not isinstance(exc.code, int):
            raise
        code = exc.code
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
