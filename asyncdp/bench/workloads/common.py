"""What the workload generators share: named random streams, option parsing, draws, and the record builder.

A generator is ``(scale, seed, options) -> Workload`` and is deterministic: every random draw comes from a
stream of :func:`stream` (``random.Random`` seeded with BLAKE2b-64 of ``"{seed}/workload/{name}"``, spec §1.2),
and nothing iterates over a set or a string-keyed dict in an order that matters. :class:`Options` takes the
user's options, hands out defaults, checks each value's type and range, and rejects what the generator did not
ask for: an unknown name (a typo) and an option of the workload that does nothing with this scale, preset or
arrival (:meth:`Options.skip`, e.g. W2's ``stages`` at quick scale) are errors naming the workload, the scale and
the options that apply, rather than silently ignored knobs. The resolved values go into the workload header.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from hashlib import blake2b
from typing import Any, TypeVar

from asyncdp.bench.arrivals import (
    RELATIVE_RUNGS,
    Arrival,
    Burst,
    Poisson,
    RelativeLadder,
    burst_times_ms,
    poisson_times_ms,
    relative_ladder_times,
    split_evenly,
)
from asyncdp.bench.materialise import ideal_hit_rate
from asyncdp.bench.records import Record, Workload, check_records
from asyncdp.errors import ConfigError

SCALES = ("quick", "full", "dp32")
T = TypeVar("T")


def stream(seed: int, name: str) -> random.Random:
    """The workload's random stream ``name`` (spec §1.2: BLAKE2b-64 of ``"{seed}/workload/{name}"``)."""
    digest = blake2b(f"{seed}/workload/{name}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


#: The most requests a generator makes: a typo such as ``num_requests=1000000000`` (or a long ``duration_s`` that
#: sizes W9's chains) would otherwise fill the memory before the first run; the largest spec workload is W9 at dp
#: 32 (320 000 requests).
MAX_REQUESTS = 2_000_000


class Options:
    """The user's options for one generator at one scale: :meth:`get` and :meth:`choice` read them (with their
    defaults), :meth:`skip` names those that do nothing here, and :meth:`check` (also run by :meth:`resolved`)
    fails on any option given that was neither read nor skipped."""

    def __init__(self, workload: str, options: Mapping[str, Any] | None, scale: str = "quick") -> None:
        self.workload = workload
        self.scale = scale
        self._given = dict(options or {})
        self._resolved: dict[str, Any] = {}
        self._skipped: dict[str, str] = {}

    def given(self, name: str) -> bool:
        """Whether the user gave option ``name``."""
        return name in self._given

    def get(self, name: str, default: T, kind: Callable[[Any], T] | None = None, *, least: float = 0,
            most: float | None = None, positive: bool = False) -> T:
        """Option ``name`` (``default`` when not given) converted by ``kind`` (the default's type); a number must
        be finite, within [``least``, ``most``] and, if ``positive`` (a rate, a duration), above 0."""
        raw = self._given.get(name, default)
        convert: Callable[[Any], Any] = kind or type(default)
        try:
            value = raw if raw is None else convert(raw)
        except (TypeError, ValueError) as exc:
            what = getattr(convert, "__name__", "value")
            raise ConfigError(f"{self.workload}: option {name}={raw!r} is not a valid {what}.") from exc
        if isinstance(value, int | float) and not isinstance(value, bool):  # counts, lengths, rates, fractions
            if not math.isfinite(value):
                raise ConfigError(f"{self.workload}: option {name}={raw!r} must be a finite number.")
            if positive and not value > 0:
                raise ConfigError(f"{self.workload}: option {name}={raw!r} must be > 0.")
            if positive and not math.isfinite(1 / value):  # a denormal rate: its gaps overflow
                raise ConfigError(f"{self.workload}: option {name}={raw!r} is too small: its inverse overflows.")
            if value < least:
                raise ConfigError(f"{self.workload}: option {name}={raw!r} must be >= {_number(least)}.")
            if most is not None and value > most:
                raise ConfigError(f"{self.workload}: option {name}={raw!r} must be <= {_number(most)}.")
        self._resolved[name] = value
        return value  # type: ignore[return-value]

    def choice(self, name: str, default: str, allowed: Sequence[str]) -> str:
        value = self.get(name, default, str)
        if value not in allowed:
            raise ConfigError(f"{self.workload}: option {name}={value!r} must be one of {', '.join(allowed)}.")
        return value

    def skip(self, name: str, why: str) -> None:
        """Option ``name`` is one of the workload's but does nothing with this scale, preset or arrival (``why``
        says what it is for, e.g. "it is the rate of arrival=poisson (this run has arrival=burst)"): given, it is an
        error, not a knob silently ignored."""
        self._skipped.setdefault(name, why)

    def expect_requests(self, count: float, what: str) -> None:
        """The generator is about to make ``count`` requests (``what``: the options that give that many)."""
        if count > MAX_REQUESTS:
            raise ConfigError(f"{self.workload}: {what} would make {count:,.0f} requests; the generators make at "
                              f"most {MAX_REQUESTS:,} (a bigger workload would fill the memory before its first run).")

    def check(self) -> None:
        """Fail on an option given that the generator did not read (see the class docstring)."""
        unknown = sorted(set(self._given) - set(self._resolved))
        where = f"{self.workload} at --scale {self.scale}"
        takes = ", ".join(sorted(self._resolved))
        for name in unknown:
            if name in self._skipped:
                raise ConfigError(f"{where}: option {name} does nothing here: {self._skipped[name]}; "
                                  f"{self.workload} takes here: {takes}.")
        if unknown == ["preset"]:  # name@preset of a workload that has none
            raise ConfigError(f"{self.workload} has no presets (got {self.workload}@{self._given['preset']}); "
                              f"its options: {takes}.")
        if unknown:
            raise ConfigError(f"{where}: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                              f"{self.workload} takes here: {takes}.")

    def resolved(self) -> dict[str, Any]:
        self.check()
        return dict(sorted(self._resolved.items()))


def _number(value: float) -> str:
    """A bound as the user would type it: ``4194304``, ``172800``, ``0.5``."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def check_scale(workload: str, scale: str, allowed: Sequence[str] = SCALES) -> None:
    if scale not in allowed:
        raise ConfigError(f"{workload} has no scale {scale!r}; it has {', '.join(allowed)}.")


def zipf_picker(n: int, alpha: float, rng: random.Random) -> Callable[[random.Random], int]:
    """Draw an index in [0, n) with P(popularity rank k) ∝ k^-alpha over a permutation seeded from ``rng``."""
    order = list(range(n))
    rng.shuffle(order)
    cum = list(itertools.accumulate((k + 1) ** -alpha for k in range(n)))
    total = cum[-1]

    def pick(r: random.Random) -> int:
        return order[min(bisect.bisect_left(cum, r.random() * total), n - 1)]

    return pick


def lognormal_int(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma))))


def uniform_length(rng: random.Random, length: int, range_ratio: float) -> int:
    """SGLang's ``range_ratio``: U[ratio·L, L] when ratio < 1, else L."""
    if range_ratio >= 1.0:
        return length
    return rng.randint(max(1, int(length * range_ratio)), length)


def open_loop(n: int, mode: str, rate_rps: float, rng: random.Random,
              fractions: Sequence[float] = RELATIVE_RUNGS) -> tuple[list[float], Arrival]:
    """Send times of ``n`` open-loop requests: ``burst``, ``poisson`` at ``rate_rps``, or a relative ``ladder``."""
    if mode == "burst":
        return burst_times_ms(n), Burst()
    if mode == "poisson":
        return poisson_times_ms(rate_rps, n, rng), Poisson(rate_rps=rate_rps)
    ladder = RelativeLadder(fractions=tuple(fractions), requests_per_rung=split_evenly(n, len(fractions)))
    return [t for t, _ in relative_ladder_times(ladder, rng)], ladder


ARRIVAL_MODES = ("burst", "poisson", "ladder")


def arrival_options(opts: Options, mode: str, rate_rps: float) -> tuple[str, float]:
    """The ``arrival`` option of an open-loop generator (default ``mode``) and, for ``poisson`` only, its
    ``rate_rps`` (default ``rate_rps``; the other modes have no rate of their own)."""
    mode = opts.choice("arrival", mode, ARRIVAL_MODES)
    if mode != "poisson":
        opts.skip("rate_rps", f"it is the rate of arrival=poisson (this run has arrival={mode})")
        return mode, rate_rps
    return mode, opts.get("rate_rps", rate_rps, positive=True)


class Builder:
    """Collects records (``req_id`` = index) and makes the Workload, with its ideal hit rate."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def add(self, *, segments: Sequence[tuple[str, int]], output_length: int, group: str,
            t_arrival_ms: float | None = None, client: int = 0, turn: int = 0, after_req: int | None = None,
            think_ms: float = 0.0, routing_key: str | None = None,
            hash_ids: Sequence[int] | None = None) -> int:
        req_id = len(self.records)
        segs = tuple((sid, int(length)) for sid, length in segments)
        self.records.append(Record(
            req_id=req_id, t_arrival_ms=t_arrival_ms, client=client, turn=turn, after_req=after_req,
            think_ms=round(think_ms * 1000.0) / 1000.0, segments=segs,
            input_length=sum(length for _, length in segs), output_length=int(output_length), group=group,
            hash_ids=None if hash_ids is None else tuple(hash_ids), routing_key=routing_key))
        return req_id

    def build(self, *, name: str, scale: str, seed: int, options: Options, arrival: Arrival, dp_size: int,
              **header: Any) -> Workload:
        records = tuple(self.records)
        check_records(records, name)
        block_size = header.get("block_size", 16)
        return Workload(name=name, scale=scale, seed=seed, arrival=arrival, records=records,
                        ideal_hit_rate=round(ideal_hit_rate(records, block_size), 6), dp_size=dp_size,
                        options=options.resolved(), **header)


def as_bool(value: Any) -> bool:
    """An option flag: a bool, or one of true/false/1/0/yes/no."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
