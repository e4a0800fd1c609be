"""Rank hints (spec §7.6): ``X-data-parallel-rank`` / ``data_parallel_rank`` and their global forms.

Parsed here from headers and body into a ``RankHint``; range checks (E2, E3) belong to the client, which knows
the managed ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncdp.api.engine_client import RankHint
from asyncdp.api.schemas import _Common
from asyncdp.errors import HTTPError


def _bad(field: str, message: str) -> HTTPError:
    return HTTPError(400, message, param=field)


def _as_int(field: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _bad(field, f"{field} must be an integer (got {value!r}).")


def _rank_headers(headers: Any) -> tuple[str | None, str | None]:
    """The first ``X-data-parallel-rank`` and ``X-data-parallel-global-rank`` values (names case-insensitive),
    in one pass: werkzeug's ``Headers.get`` scans every header per name, which showed per request."""
    local = global_ = None
    for name, value in headers.items():
        key = name.lower()
        if key == "x-data-parallel-rank":
            if local is None:
                local = value
        elif key == "x-data-parallel-global-rank" and global_ is None:
            global_ = value
    return local, global_


def _one_of(field: str, header: str | None, body: Any) -> int | None:
    from_header = _as_int(field, header) if header is not None else None
    from_body = _as_int(field, body) if body is not None else None
    if from_header is not None and from_body is not None and from_header != from_body:
        raise _bad(field, f"conflicting rank hints: header says {field}={from_header}, body says {from_body}.")
    return from_header if from_header is not None else from_body


def parse_rank_hint(
    headers: Any, req: _Common, managed_ranks: Callable[[], list[dict[str, Any]] | None] | None = None,
) -> RankHint | None:
    """Read ``X-data-parallel-rank`` / ``data_parallel_rank`` (local index) and the global forms.

    ``managed_ranks`` (a call returning ``server_info()["managed_ranks"]``, made only then) lets a local and a global hint be compared: if both are given
    and name different engines, that is a 400 here.
    """
    local_header, global_header = _rank_headers(headers)
    local = _one_of("data_parallel_rank", local_header, req.data_parallel_rank)
    global_ = _one_of("data_parallel_global_rank", global_header, req.data_parallel_global_rank)
    if local is None and global_ is None:
        return None
    ranks = managed_ranks() if local is not None and global_ is not None and managed_ranks else None
    if ranks:
        by_index = {r.get("local_index"): r.get("dp_rank") for r in ranks}
        if local in by_index and by_index[local] != global_:
            raise _bad("data_parallel_rank",
                       f"conflicting rank hints: data_parallel_rank {local} is engine {by_index[local]}, "
                       f"but data_parallel_global_rank is {global_}.")
    return RankHint(local_index=local, global_rank=global_)
