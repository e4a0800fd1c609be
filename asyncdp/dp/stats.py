"""The coordinator's stats intake and publish schedule (spec §6.1-6.3), sans I/O.

Theory of operation. :class:`StatsBook` keeps the latest ``(waiting, running, kv_cache_usage)`` of every rank, and
beside them its prompt tokens still to compute (``prefill_tokens``, [ours]: the work a waiting count hides) and
its prefix cache's fill (``cache_fill``, [ours]: what each router's own index sees a part of), and
decides when the coordinator publishes a ``StatsSnapshot``. The coordinator's core loop asks
:meth:`StatsBook.next_publish_deadline` each time it starts waiting for input, feeds every ``RankStats`` to
:meth:`StatsBook.on_rank_stats`, and when the deadline passes calls :meth:`StatsBook.take_snapshot`, which
returns the payload and restarts the interval. Time is passed in (seconds, any monotonic origin).

Schedule: while counts change, at most one snapshot per ``publish_interval_s`` (100 ms); when nothing changes, a
heartbeat snapshot every ``heartbeat_interval_s`` (5 s). In wave (MoE) mode the book keeps a *step snapshot*: a
consistent copy of the counts taken when the first stats of a newer ``(wave, step)`` arrive; without one, the
loop waits at least ``step_snapshot_wait_s`` (50 ms) after each input so a step's stats can complete. In external
mode engines send no stats and every payload is ``counts=None`` (never misleading zeros).

Dead ranks (dense) keep their last counts and ignore later stats; clients learn of the death on their own links. A
dead rank whose restarted node brings it back (:meth:`StatsBook.mark_alive`) starts again from zero counts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

Counts = list[tuple[int, int, float]]


@dataclass(frozen=True, slots=True)
class Publication:
    counts: Counts | None  # all N ranks in global order; None in external mode
    prefill_tokens: list[int] | None = None  # the same ranks' prompt tokens still to compute; None with counts
    cache_fill: list[float] | None = None  # the same ranks' prefix cache fill; None with counts


class StatsBook:
    def __init__(self, dp_size: int, *, wave_mode: bool, external: bool = False, now_s: float = 0.0,
                 publish_interval_s: float = 0.1, heartbeat_interval_s: float = 5.0,
                 step_snapshot_wait_s: float = 0.05) -> None:
        self.dp_size = dp_size
        self.wave_mode = wave_mode
        self.external = external
        self.publish_interval_s = publish_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.step_snapshot_wait_s = step_snapshot_wait_s
        self._counts: Counts = [(0, 0, 0.0)] * dp_size
        self._prefill: list[int] = [0] * dp_size
        self._fill: list[float] = [0.0] * dp_size
        self.stats_changed = False
        self.last_wave = -1
        self.last_step = -1
        self.step_snapshot: Counts | None = None
        self._step_prefill: list[int] = []  # prefill_tokens as of step_snapshot
        self._step_fill: list[float] = []  # cache_fill likewise
        self.last_publish_s = now_s
        self._dead: set[int] = set()

    @property
    def counts(self) -> Counts:
        return list(self._counts)

    @property
    def prefill_tokens(self) -> list[int]:
        return list(self._prefill)

    @property
    def cache_fill(self) -> list[float]:
        return list(self._fill)

    def current(self) -> Publication:
        """Every rank's latest stats, as a snapshot for a client that just joined."""
        return Publication(self.counts, self.prefill_tokens, self.cache_fill)

    def on_rank_stats(self, dp_rank: int, num_waiting: int, num_running: int, kv_cache_usage: float,
                      step: int = 0, wave: int = 0, prefill_tokens: int = 0, cache_fill: float = 0.0) -> bool:
        """Apply one rank's stats (§6.2); returns False when dropped (unknown or dead rank, external mode)."""
        if not 0 <= dp_rank < self.dp_size or dp_rank in self._dead or self.external:
            return False
        if self._counts[dp_rank] == (num_waiting, num_running, kv_cache_usage) and (
                self._prefill[dp_rank] != prefill_tokens or self._fill[dp_rank] != cache_fill):
            # Only the prompt tokens (a long prefill's next chunk) or the cache's fill moved: they ride on the next
            # snapshot the counts call for, and the publish schedule stays the counts' own.
            self._prefill[dp_rank] = prefill_tokens
            self._fill[dp_rank] = cache_fill
            return True
        if self.wave_mode:
            if (wave, step) > (self.last_wave, self.last_step):
                if self.stats_changed:
                    self.step_snapshot = list(self._counts)  # the previous step, complete
                    self._step_prefill = list(self._prefill)
                    self._step_fill = list(self._fill)
                self.last_wave, self.last_step = wave, step
            elif (wave, step) != (self.last_wave, self.last_step):
                log.debug("stats for an older step from rank %d", dp_rank)  # normal when ranks lag
        self._counts[dp_rank] = (num_waiting, num_running, kv_cache_usage)
        self._prefill[dp_rank] = prefill_tokens
        self._fill[dp_rank] = cache_fill
        self.stats_changed = True
        return True

    def mark_dead(self, dp_rank: int) -> None:
        self._dead.add(dp_rank)

    def mark_alive(self, dp_rank: int) -> None:
        """A dead rank's engine subscribed again (dense: its node was restarted): it starts from no load."""
        if dp_rank in self._dead:
            self._dead.discard(dp_rank)
            self._counts[dp_rank], self._prefill[dp_rank], self._fill[dp_rank] = (0, 0, 0.0), 0, 0.0
            self.stats_changed = True

    def next_publish_deadline(self, now_s: float) -> float:
        """When to publish if no input arrives first (§6.3); recompute after every input."""
        interval = self.publish_interval_s if self.stats_changed else self.heartbeat_interval_s
        min_wait = self.step_snapshot_wait_s if (self.wave_mode and self.step_snapshot is None) else 0.0
        return max(now_s + min_wait, self.last_publish_s + interval)

    def take_snapshot(self, now_s: float) -> Publication | None:
        """The payload to publish now, or None if the current interval has not elapsed yet."""
        interval = self.publish_interval_s if self.stats_changed else self.heartbeat_interval_s
        if now_s < self.last_publish_s + interval:
            return None
        self.last_publish_s = now_s
        if self.external:
            return Publication(None)
        if self.step_snapshot is not None:
            payload, prefill, fill, self.step_snapshot = self.step_snapshot, self._step_prefill, self._step_fill, None
        else:
            payload, prefill, fill = list(self._counts), list(self._prefill), list(self._fill)
            self.stats_changed = False
        return Publication(payload, prefill, fill)
