"""The per-request write path of :mod:`asyncdp.api.metrics`: an engine's series by attribute, and writers of
prometheus_client's counters, gauges and histograms that record exactly what its own calls record, for less CPU.

A request makes about thirty value writes (a dozen histogram observations, each a sum and a bucket, and the
counters and the in-flight gauge). prometheus_client's calls check their arguments on every call, and in
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, several API processes) each value write also takes the library's
global lock, asks the kernel for the process id (to notice a fork) and looks its slot up in the file's index before
it writes the two doubles into the mmapped file: 29.5 µs per request against 13 µs in one process. :class:`MmapValue`
keeps the slot's position and writes the same bytes the same way (one slice assignment, never ``pack_into``, whose
transient zeros a concurrent reader could see); it keeps the value object's own copy current, so prometheus_client
reads the same value. A fork (``os.register_at_fork``) sends the next write through prometheus_client's own call,
which re-opens the files in the child, and the writer follows. The lock is not taken: the API process writes its
metrics from its event-loop thread only, and a slice assignment is one step under the GIL.

Every writer falls back to prometheus_client's own object where the internals are not as expected.
"""

from __future__ import annotations

import math
import os
import struct
import time
from bisect import bisect_left
from typing import Any

_pack_two_doubles = struct.Struct("dd").pack
_forks = [0]  # how many forks this process is away from the one that made the writers
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


class MmapValue:
    """A multiprocess value's ``inc`` and ``set`` (see the module docstring)."""

    __slots__ = ("_value", "_file", "_pos", "_forks")

    def __init__(self, value: Any) -> None:
        self._value = value
        self._bind()

    def _bind(self) -> None:
        value = self._value
        self._file = value._file
        self._pos = value._file._positions[value._key]
        self._forks = _forks[0]

    def inc(self, amount: float) -> None:
        value = self._value
        if self._forks != _forks[0] or value._file is not self._file:
            value.inc(amount)  # prometheus_client notices the fork and re-opens its files
            self._bind()
            return
        total = value._value = value._value + amount
        value._timestamp = 0.0
        pos = self._pos
        self._file._m[pos:pos + 16] = _pack_two_doubles(total, 0.0)

    def set(self, amount: float, timestamp: float | None = None) -> None:
        value = self._value
        if self._forks != _forks[0] or value._file is not self._file:
            value.set(amount, timestamp=timestamp)
            self._bind()
            return
        value._value = amount
        value._timestamp = stamp = timestamp or 0.0
        pos = self._pos
        self._file._m[pos:pos + 16] = _pack_two_doubles(amount, stamp)


def fast_value(value: Any) -> Any:
    """A metric child's value object as an :class:`MmapValue` in multiprocess mode, else itself."""
    if not getattr(value, "_multiprocess", False):
        return value
    try:
        return MmapValue(value)
    except (AttributeError, KeyError, TypeError):
        return value


class FastCounter:
    """A counter child's ``inc`` without prometheus_client's per-call checks (a child is always observable; the
    amounts are never negative here), through :func:`fast_value`."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    @staticmethod
    def of(child: Any) -> Any:
        value = getattr(child, "_value", None)
        return child if value is None else FastCounter(fast_value(value))

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._value.inc(amount)


class FastGauge:
    """A gauge child's ``set`` (stamped with the time of the call for a "mostrecent" gauge, as ``Gauge.set``
    does), through :func:`fast_value`; :func:`set_at` stamps it with the engine's time instead."""

    __slots__ = ("_value", "_most_recent")

    def __init__(self, value: Any, most_recent: bool) -> None:
        self._value = value
        self._most_recent = most_recent

    @staticmethod
    def of(child: Any) -> Any:
        value = getattr(child, "_value", None)
        most_recent = getattr(child, "_is_most_recent", None)
        return child if value is None or most_recent is None else FastGauge(fast_value(value), most_recent)

    def set(self, amount: float) -> None:
        self._value.set(float(amount), timestamp=time.time() if self._most_recent else None)


class FastHistogram:
    """A histogram child's ``observe`` as prometheus_client's (the sum, then the first bucket whose bound is at
    least the amount; none for NaN), bisecting instead of scanning the buckets and without the per-call checks
    that a labelled child without exemplars always passes: a third less CPU, and a request makes a dozen."""

    __slots__ = ("_sum", "_buckets", "_bounds")

    def __init__(self, sum_value: Any, buckets: list[Any], bounds: list[float]) -> None:
        self._sum, self._buckets, self._bounds = sum_value, buckets, bounds

    @staticmethod
    def of(child: Any) -> Any:
        """A fast observer of ``child``; ``child`` itself where prometheus_client's internals are not as expected."""
        try:
            sum_value, buckets, bounds = child._sum, child._buckets, list(child._upper_bounds)
        except AttributeError:
            return child
        ok = len(buckets) == len(bounds) and bounds == sorted(bounds) and bounds[-1] == math.inf
        if not ok:
            return child
        return FastHistogram(fast_value(sum_value), [fast_value(b) for b in buckets], bounds)

    def observe(self, amount: float) -> None:
        self._sum.inc(amount)
        if amount == amount:  # not NaN
            self._buckets[bisect_left(self._bounds, amount)].inc(1)


def fast_writer(metric: Any, child: Any) -> Any:
    """``metric``'s ``child`` as its writer: a histogram's as :class:`FastHistogram`, a counter's as
    :class:`FastCounter`, a gauge's as :class:`FastGauge`; any other as it is."""
    from prometheus_client import Counter, Gauge, Histogram

    if isinstance(metric, Histogram):
        return FastHistogram.of(child)
    if isinstance(metric, Counter):
        return FastCounter.of(child)
    if isinstance(metric, Gauge):
        return FastGauge.of(child)
    return child


class EngineSeries:
    """``series.X`` is ``metrics.X``'s writer for one engine, taken on first use from ``Metrics._c`` (the one
    cache of children, as writers: a series shows on ``/metrics`` once made, as before), then a plain attribute:
    one lookup per call, not one per series."""

    def __init__(self, metrics: Any, engine: int | str) -> None:
        self._metrics = metrics
        self._engine = engine

    def __getattr__(self, name: str) -> Any:  # only for a series not made yet
        value = self._metrics._c(getattr(self._metrics, name), self._engine)
        setattr(self, name, value)
        return value


def set_at(gauge: Any, value: float, at: float) -> None:
    """Set a "mostrecent" gauge child (or its :class:`FastGauge`) with the timestamp ``at`` instead of the time of the call, which
    ``Gauge.set`` would take: multiprocess mode shows the value with the newest timestamp over all processes.
    (``_value`` is prometheus_client's value object; its ``set`` takes the timestamp, a private seam since 0.17.)"""
    gauge._value.set(float(value), timestamp=at)
