"""Rank hints (spec §4.2, §7.6): parsed once, resolved once, as pure functions.

``parse_rank`` turns one hint value (an int, or a header's string) into an int or raises E1; the HTTP layer
(:mod:`asyncdp.api.rank_hint`) calls it for every header and body form. ``resolve_rank_hint`` checks a parsed
hint against the ranks one client manages (E2 out of range, E3 not served here, and a local and a global form
that name different ranks) and returns the local index; the load balancer and the fake client both use it, so
no layer builds ``/server_info`` to re-check a hint.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Sequence

from asyncdp.errors import InvalidRequestError

_INT_RE = re.compile(r"[+-]?[0-9]+")
_MAX_DIGITS = 18  # [ours] more is no rank (and Python refuses int() of over 4 300 digits: a ValueError, not E1)


def parse_rank(value: object, field: str = "data_parallel_rank") -> int:
    """An int, or a string holding one (headers are strings); anything else is E1."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _INT_RE.fullmatch(text := value.strip()):
        if len(text.lstrip("+-").lstrip("0")) > _MAX_DIGITS:
            raise InvalidRequestError(f"{field} is out of range (an integer of {len(text)} characters).",
                                      field=field)
        return int(text)
    raise InvalidRequestError(f"{field} must be an integer (got {_shown(value)}).", field=field)


def _shown(value: object) -> str:
    """A short rendering of a bad hint that cannot recurse: a JSON array or object by its kind (its repr
    would recurse as deep as it nests: a RecursionError, a 500, for one nested ~990 deep), a scalar by its
    repr cut to 64 characters (a string cut before its repr is built)."""
    if isinstance(value, list):
        return f"an array of {len(value)} item(s)"
    if isinstance(value, dict):
        return f"an object with {len(value)} key(s)"
    if not isinstance(value, str | int | float | bool) and value is not None:
        return type(value).__name__
    shown = repr(value[:65] if isinstance(value, str) else value)
    return shown if len(shown) <= 64 else shown[:60] + "..."


def resolve_rank_hint(ranks: Sequence[int], local_hint: object = None, global_hint: object = None) -> int | None:
    """The index among ``ranks`` (ascending global ranks) a hint names, or None without one. Raises E1, E2, E3."""
    n = len(ranks)
    local = glob = None
    if local_hint is not None:
        local = parse_rank(local_hint, "data_parallel_rank")
        if not 0 <= local < n:
            if n == 1:  # an external-LB rank endpoint: say which rank it serves
                raise InvalidRequestError(
                    f"data_parallel_rank {local} is out of range [0, 1): this endpoint serves only data-parallel "
                    f"rank {ranks[0]} (send data_parallel_rank 0, or data_parallel_global_rank {ranks[0]}).",
                    field="data_parallel_rank")
            raise InvalidRequestError(f"data_parallel_rank {local} is out of range [0, {n}).",
                                      field="data_parallel_rank")
    if global_hint is not None:
        g = parse_rank(global_hint, "data_parallel_global_rank")
        glob = bisect_left(ranks, g)
        if glob >= n or ranks[glob] != g:
            raise InvalidRequestError(
                f"data_parallel_global_rank {g} is not served by this endpoint "
                f"(ranks {ranks[0]}..{ranks[-1]}).", field="data_parallel_global_rank")
    if local is not None and glob is not None and local != glob:
        raise InvalidRequestError(
            f"data_parallel_rank {local} and data_parallel_global_rank {global_hint} name different "
            f"ranks ({ranks[local]} and {ranks[glob]}).", field="data_parallel_rank")
    return local if local is not None else glob
