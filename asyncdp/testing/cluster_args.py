"""The checks the simulation harness makes of its arguments before anything runs, so a misuse fails at the call
with an error that names the argument and its valid range, not as a lost request, a hang or a bare ``IndexError``
deep inside (:mod:`asyncdp.testing.cluster`)."""

from __future__ import annotations

from collections.abc import Iterable

from asyncdp.errors import ConfigError


def check_index(name: str, value: object, count: int) -> int:
    """``value`` as an index in ``0 .. count - 1``; else a ``ValueError`` naming ``name`` and that range."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise ValueError(f"{name} must be an int in 0 .. {count - 1} (got {value!r}).")
    return value


def check_count(name: str, value: object, minimum: int) -> int:
    """An ``open_sim_cluster`` size argument: an int >= ``minimum``; else a ``ConfigError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum} (got {value!r}).")
    return value


def check_unique_ids(request_ids: Iterable[str]) -> None:
    """Refuse a batch that names one request id twice: the second request would be refused as already in flight
    and its result would overwrite the first's under the same key."""
    seen: set[str] = set()
    for rid in request_ids:
        if rid in seen:
            raise ValueError(f"request id {rid!r} is given more than once; every request of a batch needs its own "
                             "id (leave request_id None for a generated one).")
        seen.add(rid)
