"""How often a router's recent requests began with each prefix: the demand behind asyncdp's hot-spot rules (H3).

:class:`PrefixRates` is read by :meth:`~.asyncdp_state.AsyncdpState.mark_hot` (which prefixes the hot-spot bound
holds for, and so whether the spread rule applies), :meth:`~.asyncdp_state.AsyncdpState.mark_spill` (which prefixes
get a deliberate replica) and ``hot_recently``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class PrefixRates:
    """How often this router's recent requests began with each first block (H3's "hotter than one rank"): a count
    per first-block hash that every dispatch multiplies by ``1 - 1/window``, so ``count/window`` is the share of
    about the last ``window`` requests. Entries that decayed below half a request are dropped when the dict grows
    past ``4·window``: it stays bounded by the prefixes that are actually recent."""

    window: float = 256.0
    seq: int = 0  # dispatches counted
    counts: dict[int, tuple[float, int]] = field(default_factory=dict)  # hash -> (count, seq when last bumped)

    def bump(self, h: int) -> None:
        self.seq += 1
        decay = 1.0 - 1.0 / self.window
        old = self.counts.get(h)
        self.counts[h] = (1.0 if old is None else old[0] * decay ** (self.seq - old[1]) + 1.0, self.seq)
        if len(self.counts) > 4 * self.window:
            seq = self.seq
            for k in [k for k, (c, at) in self.counts.items() if c * decay ** (seq - at) < 0.5]:
                del self.counts[k]

    def share(self, h: int) -> float:
        """The fraction of about the last ``window`` requests that began with ``h``."""
        entry = self.counts.get(h)
        if entry is None:
            return 0.0
        return entry[0] * (1.0 - 1.0 / self.window) ** (self.seq - entry[1]) / self.window
