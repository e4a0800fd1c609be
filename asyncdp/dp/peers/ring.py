"""A consistent-hash ring over ranks (production-stack ``session``, SMG ``consistent_hashing``, vLLM Router).

Each rank owns ``vnodes`` points at ``stable_hash64(f"{rank}/{v}")``; a key maps to the first point clockwise
from ``stable_hash64(key)`` (wrapping), skipping the points of excluded ranks. Skipping rather than rebuilding
is what keeps every key that did not live on a dead rank where it was. The ring is built once and never mutates.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection
from dataclasses import dataclass

from asyncdp.dp.peers.hashing import stable_hash64
from asyncdp.errors import UnavailableError


@dataclass(frozen=True, slots=True)
class HashRing:
    points: tuple[int, ...]
    owners: tuple[int, ...]
    dp_size: int

    @classmethod
    def build(cls, dp_size: int, vnodes: int = 128) -> HashRing:
        pts = sorted((stable_hash64(f"{r}/{v}"), r) for r in range(dp_size) for v in range(vnodes))
        return cls(tuple(p for p, _ in pts), tuple(r for _, r in pts), dp_size)

    def lookup(self, key: str, excluded: Collection[int] = ()) -> int:
        if len(excluded) >= self.dp_size:
            raise UnavailableError("no data-parallel rank is alive")
        n = len(self.points)
        start = bisect_left(self.points, stable_hash64(key))
        for k in range(n):
            r = self.owners[(start + k) % n]
            if r not in excluded:
                return r
        raise UnavailableError("no data-parallel rank is alive")
