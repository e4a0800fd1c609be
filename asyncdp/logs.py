"""Logging set-up shared by every asyncdp process: one line per record, prefixed by the process's role."""

from __future__ import annotations

import logging
import os
import sys


def setup_logging(*, prefix: str, level: str | int = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            f"%(levelname)s %(asctime)s.%(msecs)03d ({prefix} pid={os.getpid()}) %(name)s: %(message)s",
            datefmt="%H:%M:%S",
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Hypercorn's access log is noise under load tests; its error log stays.
    logging.getLogger("hypercorn.access").setLevel(logging.WARNING)
