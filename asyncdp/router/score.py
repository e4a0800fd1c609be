"""PURE: what the router knows about each endpoint, and which endpoint a request goes to.

Theory of operation. :class:`EndpointLoad` is everything the router knows about one endpoint: its last ``GET /load``
answer and when it came (``polled_at_s``, on the caller's clock), the requests the router sent there since that
answer's ``seq`` last changed (``sent_since_seq``: they are not in its numbers yet) and the requests the router
has in flight there now. Every change goes through one of its methods (:meth:`~EndpointLoad.observe`,
:meth:`~EndpointLoad.observe_failure`, :meth:`~EndpointLoad.mark_down`, :meth:`~EndpointLoad.request_started`,
:meth:`~EndpointLoad.request_finished`); the poller and the proxy only call them.

:func:`score` says how busy an endpoint is, in requests' worth (lower is better; None: do not use it), as the example
router of ``docs/howto/external-lb.md`` does, summed over the endpoint's ranks that are up:
``max(waiting + running, inflight)``, plus ``prefill_tokens / 512``, plus up to 10 requests' worth of KV-cache
pressure above 80 % usage; then plus ``sent_since_seq``. :func:`candidates` orders the usable endpoints best
first: by score, then by the fewest requests this router has in flight there, then by index. The proxy tries
them in that order, each once.

Nothing here reads a clock, a socket or an event loop: ``now_s`` is an argument (tests/router/test_score.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

KV_SOFT_LIMIT = 0.8  # above this KV-cache usage a rank is penalised ...
KV_WEIGHT = 50.0  # ... by up to 10 requests' worth at 100 % usage
PREFILL_TOKENS_PER_REQUEST = 512  # prompt tokens still to compute that weigh as much as one more request


def checked_load(load: Any) -> dict[str, Any]:
    """``load`` if it has the fields :func:`score` reads (the ``/load`` telemetry contract), else ValueError: an
    endpoint that answers ``/load`` with something else (not an asyncdp server) is not used, not a crash."""
    def number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    try:
        ok = isinstance(load["seq"], int) and isinstance(load["ranks"], list) and all(
            isinstance(r["up"], bool) and all(number(r[k]) for k in ("waiting", "running", "inflight",
                                                                        "kv_cache_usage"))
            and number(r.get("prefill_tokens", 0))
            for r in load["ranks"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not an asyncdp /load answer: missing or mistyped {exc}") from None
    if not ok:
        raise ValueError("not an asyncdp /load answer: a field has the wrong type")
    return load


@dataclass
class EndpointLoad:
    """What the router knows about one endpoint (see the module docstring)."""

    url: str
    load: dict[str, Any] | None = None  # the last checked /load answer; None: unknown, down or unreachable
    last_load: dict[str, Any] | None = None  # the last checked /load answer, kept when it failed since
    polled_at_s: float = 0.0  # when that answer came, on the caller's clock
    seq_key: tuple[int, int] | None = None  # (api_process_rank, seq) of the last answer
    sent_since_seq: int = 0  # requests sent here since seq_key last changed
    num_inflight: int = 0  # requests this router has in flight here now
    num_polls: int = 0  # /load polls finished, answered or not
    last_error: str | None = None  # why the last poll or request could not use it

    def observe(self, load: dict[str, Any], now_s: float) -> bool:
        """A checked ``/load`` answer arrived at ``now_s``; whether its numbers changed. A new ``seq`` (per API
        process behind the port) means the numbers include what was sent before, so ``sent_since_seq`` starts
        again from 0."""
        key = (int(load.get("api_process_rank") or 0), int(load["seq"]))
        changed = key != self.seq_key
        if changed:
            self.sent_since_seq = 0
        self.seq_key, self.load, self.last_load, self.polled_at_s = key, load, load, now_s
        self.num_polls += 1
        self.last_error = None
        return changed

    def observe_failure(self, reason: str) -> None:
        """A poll failed (refused, timed out, not 200, not the contract): out until it answers again."""
        self.load = None
        self.num_polls += 1
        self.last_error = reason

    def mark_down(self, reason: str) -> None:
        """A proxied request could not connect: out until the next poll answers."""
        self.load = None
        self.last_error = reason

    def request_started(self) -> None:
        self.sent_since_seq += 1
        self.num_inflight += 1

    def request_finished(self) -> None:
        self.num_inflight -= 1


def score(endpoint: EndpointLoad, now_s: float, stale_after_s: float) -> float | None:
    """How busy ``endpoint`` is, in requests' worth (lower is better), or None when it must not be used: no
    answer, an answer older than ``stale_after_s``, or no rank up."""
    load = endpoint.load
    if load is None or now_s - endpoint.polled_at_s > stale_after_s:
        return None
    ranks = [r for r in load["ranks"] if r["up"]]
    if not ranks:
        return None
    total = 0.0
    for r in ranks:
        queued = max(r["waiting"] + r["running"], r["inflight"])
        prefill = r.get("prefill_tokens", 0) / PREFILL_TOKENS_PER_REQUEST  # absent from older servers
        kv = KV_WEIGHT * max(0.0, r["kv_cache_usage"] - KV_SOFT_LIMIT)
        total += queued + prefill + kv
    return total + endpoint.sent_since_seq


def candidates(endpoints: Sequence[EndpointLoad], now_s: float, stale_after_s: float) -> list[int]:
    """Indices of the usable endpoints, best first: by score, then fewest in flight from here, then index."""
    keyed = [(s, ep.num_inflight, i) for i, ep in enumerate(endpoints)
             if (s := score(ep, now_s, stale_after_s)) is not None]
    return [i for _s, _n, i in sorted(keyed)]
