"""Arrival processes of the routing benchmark (spec routing-bench §4.0 "Arrivals" and "Relative ladders").

An arrival process is data: a frozen struct that says how a workload's send times were made, plus the pure
functions that make them. Every workload fixes its open-loop send times in its records (invariant C1), so the
structs here are what the report prints and what ``--rate-scale`` rewrites, not something the simulator
interprets again, with two exceptions it must honour: the ``max_concurrency`` cap of any mode and the
:class:`Dispatch` gate (W4: ready requests issued at a rate, at most ``max_parallel`` outstanding).

Modes: :class:`Poisson` (exponential gaps), :class:`Burst` (everything at t=0, SGLang's ``--request-rate
inf``), :class:`Closed` (each client resends after its previous answer plus ``think_s``), :class:`Trace`
(recorded timestamps divided by ``speed``), :class:`Ladder` (Poisson stages of ``(rate_rps, duration_s)``),
:class:`RelativeLadder` (rungs as fractions of R_sat, the cache-blind saturation rate, which only the simulator
can measure: its times are stored at R_sat = 1 req/s and :func:`retime` says to divide them by the measured
R_sat) and :class:`Dispatch`.

``--rate-scale X`` multiplies every rate. On fixed send times that is a time compression by X: a Poisson
process at rate r compressed by X is a Poisson process at rate r·X, and the records (C1) stay the same.
Closed-loop and think times are not rates and do not change.

Which router replica a request reaches (C5) is also decided here: :func:`router_of`, by request index or by a
digest of the routing key.

Randomness: only the ``random.Random`` passed in (the workload's ``arrivals`` stream); times are rounded to
whole microseconds (spec §1.2), expressed in milliseconds.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from hashlib import blake2b

import msgspec

from asyncdp.errors import ConfigError

#: The rungs of a relative ladder, as fractions of R_sat (spec §4.0); 0.7 is the reference rung.
RELATIVE_RUNGS = (0.3, 0.5, 0.7, 0.85, 1.0, 1.2)
REFERENCE_RUNG = 0.7


class _Mode(msgspec.Struct, frozen=True, tag_field="mode", forbid_unknown_fields=True):
    max_concurrency: int | None = None


class Poisson(_Mode, frozen=True, tag="poisson"):
    rate_rps: float = 1.0


class Burst(_Mode, frozen=True, tag="burst"):
    pass


class Closed(_Mode, frozen=True, tag="closed"):
    concurrency: int = 1
    think_s: float = 0.0


class Trace(_Mode, frozen=True, tag="trace"):
    speed: float = 1.0


class Ladder(_Mode, frozen=True, tag="ladder"):
    """Stages ``(rate_rps, duration_s)`` run one after the other. ``requests_per_rung``, when set (a resolved
    relative ladder), says which records belong to which rung; otherwise the stage boundaries do."""

    rungs: tuple[tuple[float, float], ...] = ()
    requests_per_rung: tuple[int, ...] = ()


class RelativeLadder(_Mode, frozen=True, tag="relative_ladder"):
    """Rungs ``fractions × R_sat`` of ``requests_per_rung`` requests each; stored times assume R_sat = 1 req/s."""

    fractions: tuple[float, ...] = RELATIVE_RUNGS
    requests_per_rung: tuple[int, ...] = ()
    reference: float = REFERENCE_RUNG


class Dispatch(_Mode, frozen=True, tag="dispatch"):
    """W4's dispatcher: ready requests leave at ``rate_rps`` with at most ``max_parallel`` outstanding."""

    rate_rps: float = 1.0
    max_parallel: int = 1
    order: str = "random"  # or "fifo": which ready request goes next
    process: str = "poisson"  # or "uniform": the gaps between issues


Arrival = Poisson | Burst | Closed | Trace | Ladder | RelativeLadder | Dispatch


def _us(t_ms: float) -> float:
    return round(t_ms * 1000.0) / 1000.0


def poisson_times_ms(rate_rps: float, n: int, rng: random.Random, start_ms: float = 0.0) -> list[float]:
    """``n`` arrival times of a Poisson process at ``rate_rps``; the first one ``start_ms`` + one gap."""
    if rate_rps <= 0:
        raise ConfigError(f"an arrival rate must be > 0 req/s (got {rate_rps}).")
    out: list[float] = []
    t = start_ms
    for _ in range(n):
        t += rng.expovariate(rate_rps) * 1000.0
        out.append(_us(t))
    return out


def uniform_times_ms(rate_rps: float, n: int, start_ms: float = 0.0) -> list[float]:
    """``n`` evenly spaced arrival times at ``rate_rps`` (W4's uniform dispatcher; W5's fixed schedule)."""
    if rate_rps <= 0:
        raise ConfigError(f"an arrival rate must be > 0 req/s (got {rate_rps}).")
    return [_us(start_ms + (i + 1) * 1000.0 / rate_rps) for i in range(n)]


def burst_times_ms(n: int) -> list[float]:
    return [0.0] * n


def ladder_times_ms(rungs: Sequence[tuple[float, float]], rng: random.Random) -> list[tuple[float, int]]:
    """Poisson arrivals through each ``(rate_rps, duration_s)`` stage in turn, as ``(t_ms, rung_index)``."""
    out: list[tuple[float, int]] = []
    start_ms = 0.0
    for index, (rate, duration_s) in enumerate(rungs):
        if rate <= 0 or duration_s <= 0:
            raise ConfigError(f"ladder rung {index} needs a rate and a duration > 0 (got {rate}, {duration_s}).")
        end_ms = start_ms + duration_s * 1000.0
        t = start_ms
        while True:
            t += rng.expovariate(rate) * 1000.0
            if t >= end_ms:
                break
            out.append((_us(t), index))
        start_ms = end_ms
    return out


def relative_ladder_times(ladder: RelativeLadder, rng: random.Random) -> list[tuple[float, int]]:
    """The relative ladder at R_sat = 1 req/s: ``requests_per_rung`` Poisson arrivals per rung, as (t_ms, rung)."""
    out: list[tuple[float, int]] = []
    t = 0.0
    for index, (fraction, count) in enumerate(zip(ladder.fractions, ladder.requests_per_rung, strict=True)):
        for _ in range(count):
            t += rng.expovariate(fraction) * 1000.0
            out.append((_us(t), index))
    return out


def split_evenly(n: int, parts: int) -> tuple[int, ...]:
    """``n`` requests over ``parts`` rungs, the earlier rungs one larger where it does not divide."""
    return tuple(n // parts + (1 if i < n % parts else 0) for i in range(parts))


def relative_ladder(r_sat_rps: float, fractions: Sequence[float] = RELATIVE_RUNGS,
                    duration_s: float = 60.0) -> Ladder:
    """The absolute ladder ``fractions × r_sat_rps``, ``duration_s`` per rung, once R_sat is measured."""
    if r_sat_rps <= 0:
        raise ConfigError(f"R_sat must be > 0 req/s (got {r_sat_rps}).")
    return Ladder(rungs=tuple((f * r_sat_rps, duration_s) for f in fractions))


def scale_rates(arrival: Arrival, rate_scale: float) -> Arrival:
    """``arrival`` with every rate multiplied by ``rate_scale`` (``--rate-scale``); closed loop is unchanged."""
    if rate_scale <= 0:
        raise ConfigError(f"--rate-scale must be > 0 (got {rate_scale}).")
    if isinstance(arrival, Poisson | Dispatch):
        return msgspec.structs.replace(arrival, rate_rps=arrival.rate_rps * rate_scale)
    if isinstance(arrival, Trace):
        return msgspec.structs.replace(arrival, speed=arrival.speed * rate_scale)
    if isinstance(arrival, Ladder):
        return msgspec.structs.replace(
            arrival, rungs=tuple((r * rate_scale, d / rate_scale) for r, d in arrival.rungs))
    if isinstance(arrival, RelativeLadder):
        return msgspec.structs.replace(arrival, fractions=tuple(f * rate_scale for f in arrival.fractions))
    return arrival


def retime(arrival: Arrival, rate_scale: float = 1.0, r_sat_rps: float | None = None) -> tuple[Arrival, float]:
    """How to replay stored send times: the arrival label after ``--rate-scale`` (and R_sat), and the divisor.

    Stored times are at the generator's nominal rates, at trace speed 1, and at R_sat = 1 req/s for a relative
    ladder; the send times are the stored ones divided by the divisor. A relative ladder becomes the absolute
    :class:`Ladder` it stands for (each rung's duration is its expected length). Closed loop: divisor 1.
    """
    label = scale_rates(arrival, rate_scale)
    if isinstance(arrival, RelativeLadder):
        if r_sat_rps is None or r_sat_rps <= 0:
            raise ConfigError("a relative ladder needs the measured R_sat (> 0 req/s) before it can be replayed.")
        rates = [f * rate_scale * r_sat_rps for f in arrival.fractions]
        ladder = Ladder(max_concurrency=arrival.max_concurrency, requests_per_rung=arrival.requests_per_rung,
                        rungs=tuple((r, n / r) for r, n in zip(rates, arrival.requests_per_rung, strict=True)))
        return ladder, rate_scale * r_sat_rps
    if isinstance(arrival, Closed):
        return label, 1.0
    if isinstance(arrival, Trace):
        return label, rate_scale * arrival.speed
    return label, rate_scale


def resolve_times_ms(times_ms: Sequence[float | None], divisor: float) -> list[float | None]:
    """Stored send times divided by ``divisor`` (see :func:`retime`), rounded to whole microseconds."""
    return [None if t is None else _us(t / divisor) for t in times_ms]


def rung_indices(arrival: Arrival, times_ms: Sequence[float | None]) -> list[int] | None:
    """The ladder rung of each request (records in order), for per-rung metrics; None if not a ladder."""
    counts: tuple[int, ...] = ()
    if isinstance(arrival, RelativeLadder | Ladder):
        counts = arrival.requests_per_rung
    if counts:
        out = [k for k, n in enumerate(counts) for _ in range(n)]
        return out[:len(times_ms)] + [len(counts) - 1] * (len(times_ms) - len(out))
    if not isinstance(arrival, Ladder):
        return None
    ends, total = [], 0.0
    for _, duration_s in arrival.rungs:
        total += duration_s * 1000.0
        ends.append(total)
    return [min(bisect.bisect_right(ends, t or 0.0), len(ends) - 1) for t in times_ms]


ROUTER_ASSIGN = ("index", "key")


def router_of(req_id: int, routing_key: str | None, routers: int, assign: str) -> int:
    """The router replica a request arrives at (C5). A key's router is a digest of it, not ``hash()``: the same in
    every process and run."""
    if assign == "key" and routing_key is not None and routers > 1:
        digest = blake2b(routing_key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(digest, "big") % routers
    return req_id % routers
