"""What the DP client does with each message its engine links bring in, and with the coordinator's snapshots.

Theory of operation
-------------------
:class:`~asyncdp.apiserver.engine_links.EngineLinks` reads the links and calls :meth:`EngineEvents.on_message` for
every frame after ``EngineReady`` (``EngineDead`` aside) and :meth:`EngineEvents.on_dead` once when a link ends;
the coordinator follower calls :meth:`EngineEvents.on_snapshot`. The client composes one :class:`EngineEvents`
over its own balancer, request streams, utility calls, load view and metrics, and keeps admission, routing and
the shutdown state: it hands in ``release`` (give a finished request's slot back), ``abandoned`` (the shutdown
reason while it shuts down, else None) and ``on_wave`` (the wave the coordinator last published).

``EngineOutputs`` are posted to their streams (:func:`~asyncdp.apiserver.request_stream.apply_outputs`) after
their tokens are counted in the metrics; each finished request is recorded (if it finished with an answer) and
released. When a rank dies (``EngineDead`` or link EOF) it
leaves the balancer, its requests and the utility calls waiting on it fail at once with ``EngineDeadError``
(and are released), its gauges drop to 0; the other ranks keep serving (dense, spec §13). A rank that stops in
order says so first (``RankDraining``): it leaves the balancer's choices at once, while its own requests finish
(unless it is the last one); its end is then logged at INFO ("gone"), a death at ERROR ("dead"). A rank that reset
its prefix cache (``PrefixCacheReset``, whichever API server asked) is told to the balancer, whose policy forgets
the prefixes it sent there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from asyncdp import messages as m
from asyncdp.apiserver.engine_links import UtilityCalls
from asyncdp.apiserver.load_view import LoadView
from asyncdp.apiserver.request_stream import RequestStream, apply_outputs, now_us, tell_policy
from asyncdp.apiserver.stats_export import export_scheduler_stats, observe_tokens, record_finished
from asyncdp.dp.balance import LoadBalancer
from asyncdp.errors import EngineDeadError

log = logging.getLogger("asyncdp.apiserver.client")  # the client's log name: its lines read as before the split


class EngineEvents:
    """The client's handlers of engine-link frames, link ends and coordinator snapshots."""

    def __init__(self, lb: LoadBalancer, requests: dict[str, RequestStream], utility: UtilityCalls, load: LoadView,
                 metrics: Any, *, is_moe: bool, release: Callable[[RequestStream], None],
                 abandoned: Callable[[], str | None], on_wave: Callable[[int, bool], None]) -> None:
        self._lb = lb
        self._requests = requests  # the client's streams, shared: the client registers, these handlers post
        self._utility = utility
        self._load = load
        self._metrics = metrics
        self._is_moe = is_moe
        self._release = release
        self._abandoned = abandoned
        self._on_wave = on_wave

    def on_message(self, rank: int, msg: m.Message) -> None:
        if isinstance(msg, m.EngineOutputs):
            self.on_outputs(msg)
        elif isinstance(msg, m.UtilityResult):
            self._utility.on_result(rank, msg)
        elif isinstance(msg, m.RankDraining) and self._abandoned() is None and self._lb.mark_draining(rank):
            log.info("engine rank %d is stopping; new requests go to the other ranks while its own finish", rank)
        elif isinstance(msg, m.PrefixCacheReset):
            self._lb.on_cache_reset(rank)  # the policy no longer counts on the prefixes it sent there

    def on_outputs(self, msg: m.EngineOutputs) -> None:
        now = time.monotonic()
        tell_policy(self._lb, self._requests, msg)
        if self._metrics is not None:
            observe_tokens(self._metrics, msg.dp_rank, self._requests, msg, now)
        for req in apply_outputs(self._requests, msg, now, self._abandoned()):
            if self._metrics is not None:
                record_finished(self._metrics, msg.dp_rank, req, now)
            self._release(req)
        if msg.scheduler_stats is not None:
            self._load.on_scheduler_stats(msg.dp_rank, msg.scheduler_stats, now)
            if self._metrics is not None:
                export_scheduler_stats(self._metrics, msg.dp_rank, msg.scheduler_stats, self._is_moe, msg.timestamp)

    def on_dead(self, rank: int, reason: str) -> None:
        if self._abandoned() is None:  # (a rank that stopped in order was out of the balancer already)
            gone = self._lb.is_draining(rank)
            log.log(logging.INFO if gone else logging.ERROR, "engine rank %d is %s (%s); it leaves the load balancer",
                    rank, "gone" if gone else "dead", reason)
        if self._metrics is not None:
            self._metrics.set_engine_up(rank, False)
            self._metrics.clear_engine_state(rank, is_moe=self._is_moe)
        self._utility.on_rank_dead(rank, reason)
        for rid in self._lb.mark_dead(rank):
            req = self._requests.get(rid)
            if req is not None:
                req.fail(EngineDeadError(f"engine rank {rank} died: {reason}"))
                # Released here, not by the generator: a generator that was already closed will never run again.
                self._release(req)

    def on_snapshot(self, snap: m.StatsSnapshot) -> None:
        self._on_wave(snap.wave, snap.running)
        self._load.on_snapshot(snap, time.monotonic())
        self._lb.on_snapshot(snap.counts, seq=snap.seq, now_us=now_us(), prefill_tokens=snap.prefill_tokens,
                             cache_fill=snap.cache_fill)  # (counts None, wave-only: it changes nothing)
