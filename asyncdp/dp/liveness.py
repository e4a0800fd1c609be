"""The one liveness rule of asyncdp: a peer is dead once it has been silent for longer than its timeout.

Every role that watches a peer (the coordinator its engines and clients, a rank its coordinator, an API server's
client the coordinator, an API process its siblings in the node table) keeps one :class:`Liveness` per peer:
``heard(now_s)`` on every frame, ``expired(now_s)`` or ``deadline_s()`` to decide. Any frame counts, not only
heartbeats. Time comes in as an argument (``anyio.current_time()`` in the shells, virtual in tests), so the rule
is pure and the same on every clock.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from asyncdp.errors import ConfigError

STALL_SLACK_S = 0.5  # [ours] a watcher that wakes this long after it planned to was itself not running
STALL_GRACE_S = 1.0  # [ours] how long its peers' frames of that time then get to be read (at most timeout / 2)
# [ours] A MoE peer left in an orderly way (Goodbye) before this process was asked to stop: the signals of a whole
# group's stop reach its processes a moment apart, so it still counts as "shutting down too" (spec §8.7: exit 0) if
# its own request to stop arrives within this long.
PEER_STOP_GRACE_S = 2.0


def check_heartbeat_settings(interval_s: float, timeout_s: float) -> None:
    """``--dp-heartbeat-interval-s`` must be positive and below ``--dp-heartbeat-timeout-s``."""
    if not 0 < interval_s < timeout_s:
        raise ConfigError(
            "--dp-heartbeat-interval-s must be > 0 and below --dp-heartbeat-timeout-s "
            f"(got {interval_s:g} and {timeout_s:g}).")


@dataclass
class Liveness:
    """When a peer was last heard from, and whether its silence passed ``timeout_s``."""

    timeout_s: float
    last_heard_s: float = field(default=0.0)

    def heard(self, now_s: float) -> None:
        self.last_heard_s = max(self.last_heard_s, now_s)

    def silence_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.last_heard_s)

    def deadline_s(self) -> float:
        """The time at which the peer counts as dead unless it is heard from before."""
        return self.last_heard_s + self.timeout_s

    def expired(self, now_s: float) -> bool:
        return expired(self.last_heard_s, now_s, self.timeout_s)

    def excuse_late_wake(self, planned_s: float, now_s: float) -> bool:
        """Whether the watcher, waking at ``now_s`` for a check it planned at ``planned_s``, was itself not
        running meanwhile (its process stopped, swapped out or starved for more than ``STALL_SLACK_S``). The
        peer's frames of that time are then still unread, so its silence is not judged now: it counts as heard
        so that its deadline is ``STALL_GRACE_S`` (at most half the timeout) away, and what the reader reads
        meanwhile counts as usual. A peer that is really gone is declared dead that much later."""
        if now_s - planned_s <= STALL_SLACK_S:
            return False
        grace = min(STALL_GRACE_S, self.timeout_s / 2)
        self.last_heard_s = max(self.last_heard_s, now_s - self.timeout_s + grace)
        return True

    def describe(self, peer: str, now_s: float) -> str:
        return f"no heartbeat from {peer} for {self.silence_s(now_s):.1f} s (timeout {self.timeout_s:g} s)"


def expired(last_heard_s: float, now_s: float, timeout_s: float) -> bool:
    """:meth:`Liveness.expired` for a peer whose last-heard time lives elsewhere (a shared-memory slot)."""
    return now_s - last_heard_s > timeout_s
