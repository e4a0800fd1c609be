"""PURE: the router's own ``GET /load``, its endpoints' last ``/load`` answers merged, so the router can be watched
or put behind another router (``asyncdp route --endpoint`` of this router's address).

Theory of operation. :func:`router_load` builds the document from what the poller knows (no I/O, no clock of its
own: ``now_s`` is an argument). It follows the telemetry contract's shape where a router reads it (``seq`` and
``ranks``, the fields :func:`asyncdp.router.score.checked_load` checks), so another router scores this one as the
sum of its endpoints' ranks:

* ``seq``: the router's own counter (:attr:`Poller.seq`), which moves when an endpoint's numbers change (a new
  ``seq`` in its answer) or an endpoint becomes usable or unusable;
* ``ranks``: every rank of every endpoint's last answer, as it came, plus ``endpoint`` (its URL); ``up`` is
  false as well for the ranks of an endpoint the router does not use now (stale, unreachable, marked down);
* ``endpoints``: one entry per ``--endpoint``, in order: ``url``, ``usable``, ``score``, ``age_s`` (seconds
  since its last answer; ``null`` before any), ``error``, ``num_inflight``, ``sent_since_seq`` and ``load``, its
  last answer as it came (kept after a failed poll; ``null`` before any).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncdp.router.score import EndpointLoad, score


def router_load(endpoints: Sequence[EndpointLoad], now_s: float, stale_after_s: float, seq: int) -> dict[str, Any]:
    """The router's ``/load`` document (see the module docstring)."""
    ranks: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    ages: list[float] = []
    for ep in endpoints:
        s = score(ep, now_s, stale_after_s)
        age_s = None if ep.last_load is None else round(now_s - ep.polled_at_s, 3)
        if age_s is not None:
            ages.append(age_s)
        entries.append({"url": ep.url, "usable": s is not None, "score": s, "age_s": age_s,
                        "error": ep.last_error, "num_inflight": ep.num_inflight,
                        "sent_since_seq": ep.sent_since_seq, "load": ep.last_load})
        for rank in (ep.last_load or {}).get("ranks", []):
            ranks.append({**rank, "up": bool(rank.get("up")) and s is not None, "endpoint": ep.url})
    return {"seq": seq, "mode": "router", "age_s": min(ages) if ages else None,
            "num_usable": sum(1 for e in entries if e["usable"]), "ranks": ranks, "endpoints": entries}
