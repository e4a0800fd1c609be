"""A router's approximate, per-rank index of block hashes it routed (llm-d's prefix index, AIBrix's, Dynamo's
``--no-kv-events`` mode).

Each rank has an LRU (an ``OrderedDict`` of hash -> last insert time, oldest first) bounded by ``capacity``
blocks: inserting refreshes an entry and evicts the least recently inserted ones beyond the bound. With
``ttl_us`` an entry older than the TTL counts as absent in every query (queries are pure: they never purge);
``insert`` purges the expired entries it meets at the old end. Queries take ``now_us`` for that reason.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class BlockIndex:
    capacity: int
    ttl_us: int | None = None
    ranks: list[OrderedDict[int, int]] = field(default_factory=list)

    @classmethod
    def empty(cls, dp_size: int, capacity: int, ttl_us: int | None = None) -> BlockIndex:
        return cls(capacity, ttl_us, [OrderedDict() for _ in range(dp_size)])

    def _live(self, t: int | None, now_us: int) -> bool:
        return t is not None and (self.ttl_us is None or now_us - t <= self.ttl_us)

    def holds(self, rank: int, h: int, now_us: int = 0) -> bool:
        return self._live(self.ranks[rank].get(h), now_us)

    def prefix_run(self, rank: int, hashes: Sequence[int], now_us: int = 0) -> int:
        """The number of leading hashes the rank holds, stopping at the first it lacks."""
        d = self.ranks[rank]
        n = 0
        for h in hashes:
            if not self._live(d.get(h), now_us):
                break
            n += 1
        return n

    def insert(self, rank: int, hashes: Sequence[int], now_us: int = 0) -> None:
        d = self.ranks[rank]
        for h in hashes:
            d[h] = now_us
            d.move_to_end(h)
        while len(d) > self.capacity:
            d.popitem(last=False)
        if self.ttl_us is not None:
            while d:
                h, t = next(iter(d.items()))
                if now_us - t <= self.ttl_us:
                    break
                del d[h]

    def size(self, rank: int) -> int:
        return len(self.ranks[rank])

    def drop_rank(self, rank: int) -> None:
        self.ranks[rank].clear()
