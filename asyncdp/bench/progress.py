"""The progress of a long ``asyncdp bench`` command on stderr: ``bench routing``'s runs, ``bench calibrate``'s
points.

On a terminal, a tqdm bar when tqdm is installed, redrawn at most twice a second (not at every item). Anywhere
else (a CI log, a file, a pipe: a bar's carriage returns would pile up there as one endless line) and without
tqdm, plain lines: the first item, then at most one line every ``every_s`` seconds, and the last one, each with the
count, the share done, the seconds since the start and the latest item, e.g. ``asyncdp bench: 12/68 runs done
(18 %) after 41 s; latest: w2 vllm seed 1 (done at 40.7 s)``. An hour-long run writes a few hundred lines.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["EVERY_S", "Progress"]

EVERY_S = 10.0  # seconds between two plain progress lines (the first and the last item always get one)


class Progress:
    """``advance(label)`` once per item done, then ``close()`` (or use it as a context manager)."""

    def __init__(self, total: int, *, prefix: str, unit: str, stream: TextIO | None = None,
                 every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.prefix = prefix
        self.unit = unit
        self.stream = sys.stderr if stream is None else stream
        self.every_s = every_s
        self.clock = clock
        self.done = 0
        self._started = clock()
        self._last_line: float | None = None
        self._bar: Any = None
        if _isatty(self.stream):
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=total, file=self.stream, unit=unit, mininterval=0.5, dynamic_ncols=True)

    def advance(self, label: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(1)
            return
        now = self.clock()
        due = self._last_line is None or now - self._last_line >= self.every_s or self.done >= self.total
        if due:
            self._last_line = now
            share = 100.0 * self.done / self.total if self.total else 100.0
            print(f"{self.prefix}: {self.done}/{self.total} {self.unit}s done ({share:.0f} %) after "
                  f"{now - self._started:.0f} s; latest: {label}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or closed
        return False
