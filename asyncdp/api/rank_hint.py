"""Rank hints (spec §7.6): ``X-data-parallel-rank`` / ``data_parallel_rank`` and their global forms.

Parsed here from headers and body into a ``RankHint`` (values through :func:`asyncdp.dp.hints.parse_rank`);
range checks (E2, E3) and the local-vs-global check belong to the client, which knows the managed ranks.
"""

from __future__ import annotations

from typing import Any

from asyncdp.api.engine_client import RankHint
from asyncdp.api.schemas import _Common
from asyncdp.dp.hints import parse_rank
from asyncdp.errors import HTTPError, InvalidRequestError


def _as_int(field: str, value: Any) -> int:
    try:
        return parse_rank(value, field)
    except InvalidRequestError as exc:  # E1: a 400 naming the field
        raise HTTPError(400, str(exc), param=field) from None


# Every header a request's routing reads (rank hints here, routing keys in :mod:`.routing_key`), lower case, and
# X-Request-Id (the response's id, :mod:`.request_ids`), collected in the same pass.
ROUTING_HEADERS = frozenset(("x-data-parallel-rank", "x-data-parallel-global-rank", "x-session-id", "x-user-id",
                             "x-request-id"))


def routing_headers(headers: Any) -> dict[str, str]:
    """The first value of each of :data:`ROUTING_HEADERS` the request has (names case-insensitive), in one pass:
    werkzeug's ``Headers.get`` scans every header per name, which showed per request."""
    found: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        if key in ROUTING_HEADERS and key not in found:
            found[key] = value
    return found


def _one_of(field: str, header: str | None, body: Any) -> int | None:
    from_header = _as_int(field, header) if header is not None else None
    from_body = _as_int(field, body) if body is not None else None
    if from_header is not None and from_body is not None and from_header != from_body:
        raise HTTPError(400, f"conflicting rank hints: header says {field}={from_header}, body says {from_body}.", param=field)
    return from_header if from_header is not None else from_body


def parse_rank_hint(headers: Any, req: _Common) -> RankHint | None:
    """Read ``X-data-parallel-rank`` / ``data_parallel_rank`` (local index) and the global forms (E1 here; the
    header and the body form of one hint must agree). Resolving the hint against the managed ranks (E2, E3, a
    local and a global form naming different ranks) is the client's, once, in :mod:`asyncdp.dp.hints`.
    ``headers`` may be the request's :func:`routing_headers` already (one pass for the hint and the key)."""
    found = routing_headers(headers)
    local = _one_of("data_parallel_rank", found.get("x-data-parallel-rank"), req.data_parallel_rank)
    global_ = _one_of("data_parallel_global_rank", found.get("x-data-parallel-global-rank"),
                      req.data_parallel_global_rank)
    if local is None and global_ is None:
        return None
    return RankHint(local_index=local, global_rank=global_)
