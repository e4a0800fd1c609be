"""The KV-event shape precise-class policies read (routing-bench §2.1 "KV events"), and the exact index over them.

A rank's engine reports, after a step, the full blocks it made findable (``stored``) and those it evicted
(``removed``); ``cleared`` drops everything a rank held (a restart or a reset). Block hashes are the engine's
chained hashes (``block_manager.hash_block_tokens``, equal to :func:`asyncdp.dp.peers.hashing.hash_block`) at the
engine's block size. The simulator emits these; :class:`KvEventIndex` folds them into the per-rank set of
cached block hashes, which is what `dynamo_kv`, `llmd_weighted@precise` and `sglang_cache_aware@events` query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

KvEventKind = Literal["stored", "removed", "cleared"]


@dataclass(frozen=True, slots=True)
class KvEvent:
    """One rank's change to its cached blocks. ``block_hashes`` is empty for ``cleared``."""

    dp_rank: int
    kind: KvEventKind
    block_hashes: tuple[int, ...] = ()


@dataclass(slots=True)
class KvEventIndex:
    """Per rank, the set of block hashes its engine reports as cached."""

    held: list[set[int]] = field(default_factory=list)

    @classmethod
    def empty(cls, dp_size: int) -> KvEventIndex:
        return cls([set() for _ in range(dp_size)])

    def apply(self, ev: KvEvent) -> None:
        if not 0 <= ev.dp_rank < len(self.held):
            return  # an event for a rank this router does not manage
        s = self.held[ev.dp_rank]
        if ev.kind == "stored":
            s.update(ev.block_hashes)
        elif ev.kind == "removed":
            s.difference_update(ev.block_hashes)
        else:
            s.clear()

    def overlap(self, rank: int, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` the rank holds (the longest consecutive run from the start)."""
        s = self.held[rank]
        n = 0
        for h in hashes:
            if h not in s:
                break
            n += 1
        return n

    def size(self, rank: int) -> int:
        return len(self.held[rank])
