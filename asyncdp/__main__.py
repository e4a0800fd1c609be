"""``python -m asyncdp`` and the ``asyncdp`` command: :func:`asyncdp.cli.main`, then the exit.

A server's top process ends with ``os._exit`` once its output is flushed: its children are gone and its files
closed by then, and the interpreter's teardown (collecting torch's objects) took 0.45 s more on an idle machine
and up to 2.4 s on a loaded one, past the 4.1 s a stop with ``--shutdown-timeout 0`` has (spec §12.5). Other
commands exit normally. (:func:`~asyncdp.cli.main` itself returns, for tests that run it in-process.)
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

from asyncdp.cli import main


def entry() -> NoReturn:
    code = main()
    if sys.argv[1:2] != ["serve"]:
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
