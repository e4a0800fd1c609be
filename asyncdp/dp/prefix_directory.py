"""The DP coordinator's prefix directory: where N API servers agree to put a prompt prefix none of them has placed.

Theory of operation
-------------------
Each API server routes with its own state (routing-bench C5). A prefix-aware policy learns where a prefix lives
from what *it* sent, so when several API servers see a new prefix at about the same moment (a burst, a new
system prompt rolled out), each places it on the rank that looks cheapest from its own quarter of the traffic,
and the prefix is prefilled up to N times on up to N ranks (routing-bench H7, ai-dynamo/dynamo#589; W1's burst at
R = 4 read 3 copies of each group and 0.22 x the goodput of R = 1). Snapshots cannot fix that: they come every
100 ms and say nothing about prefixes.

So the first request of a prefix an API server has never placed asks the coordinator (``PrefixClaim``): it sends
the prompt's chained block hashes and the rank its own policy would pick, and waits for the answer
(``PrefixOwner``, one round trip on the coordinator link; an API server that gets no answer in time routes on its
own). The directory keys claims by the first block hash and by the claimant's managed ranks (API servers of
different hybrid-LB nodes never share ranks, so they never share entries):

- a key claimed within the last ``ttl_s`` (refreshed by every claim of it) answers its owner, and how many leading
  blocks of this prompt the first claimant's prompt shared (what the owner will have cached: the claimant
  records that in its own index, so its accounting and its next decisions see the hit);
- a new key goes to the claimant's proposal, unless the ranks of its scope already got a decidedly unequal share
  of the recent new prefixes: the directory keeps, per rank, the prompt tokens of the prefixes it placed, decaying
  with ``decay_s``, and a proposal more than ``slack`` of this prompt above the scope's least-loaded rank gives
  way to that rank. That is the one thing every API server's view lacks in a burst (each saw its own placements
  only); in steady traffic the counters have decayed and the proposal, which weighs load, memory and KV, stands.

The answer binds that one request: it goes to the owner (unless the owner died or is not this API server's), and
from then on the API server's own index knows the prefix, so it never asks again for it while it holds it.
Entries are bounded (``max_entries``, oldest first) and expire after ``ttl_s``; a dead rank's entries go, and a
dead rank is never chosen. Pure: the caller passes the time; the coordinator serves it from its client links.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CLAIM_TTL_S", "MAX_CLAIM_BLOCKS", "Claim", "PrefixDirectory"]

CLAIM_TTL_S = 2.0  # [ours] a claim coordinates placements made at about the same time, then routers know
DECAY_S = 0.5  # [ours] how long the per-rank count of recent new-prefix tokens takes to fall by e
SLACK = 0.25  # [ours] a proposal stands while its rank is within this fraction of the prompt of the least loaded
MAX_ENTRIES = 65_536
MAX_CLAIM_BLOCKS = 1024  # the hashes a claim carries: matches are counted up to this many blocks


@dataclass(slots=True)
class Claim:
    owner: int
    hashes: tuple[int, ...]  # the first claimant's prompt: later claimants match against it
    at_s: float  # last claimed


class PrefixDirectory:
    def __init__(self, dp_size: int, *, ttl_s: float = CLAIM_TTL_S, decay_s: float = DECAY_S, slack: float = SLACK,
                 max_entries: int = MAX_ENTRIES) -> None:
        self.dp_size = dp_size
        self.ttl_s, self.decay_s, self.slack, self.max_entries = ttl_s, decay_s, slack, max_entries
        self.entries: OrderedDict[tuple[int, int, int], Claim] = OrderedDict()  # least recently claimed first
        self.recent = [0.0] * self.dp_size  # new-prefix prompt tokens placed per rank, decayed to recent_at_s
        self.recent_at_s = 0.0
        self.dead: set[int] = set()

    def claim(self, hashes: Sequence[int], proposal: int, prompt_tokens: int, scope: tuple[int, int],
              now_s: float) -> tuple[int, int]:
        """``(owner, matched)``: the rank this prompt's request goes to, and how many of ``hashes`` it is predicted
        to hold. ``scope`` is the claimant's managed ranks as ``(first, last)``, inclusive; ``proposal`` is in it.
        Raises ValueError for a claim that does not fit that description."""
        first, last = scope
        if not hashes or not 0 <= first <= proposal <= last < self.dp_size:
            raise ValueError(f"bad prefix claim: {len(hashes)} hashes, proposal {proposal}, scope {scope}, "
                             f"dp_size {self.dp_size}")
        self._expire(now_s)
        key = (first, last, hashes[0])
        entry = self.entries.get(key)
        if entry is not None:
            entry.at_s = now_s
            self.entries.move_to_end(key)
            return entry.owner, _common_prefix(entry.hashes, hashes)
        owner = self._place(proposal, prompt_tokens, first, last, now_s)
        self.entries[key] = Claim(owner, tuple(hashes[:MAX_CLAIM_BLOCKS]), now_s)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)
        return owner, 0

    def drop_rank(self, rank: int) -> None:
        """A rank died: its prefixes are gone and it is never chosen again."""
        self.dead.add(rank)
        for key in [k for k, c in self.entries.items() if c.owner == rank]:
            del self.entries[key]

    def _place(self, proposal: int, prompt_tokens: int, first: int, last: int, now_s: float) -> int:
        if now_s > self.recent_at_s:
            f = math.exp(-(now_s - self.recent_at_s) / self.decay_s)
            self.recent = [x * f for x in self.recent]
            self.recent_at_s = now_s
        recent, dead = self.recent, self.dead
        live = [r for r in range(first, last + 1) if r not in dead]
        if not live:  # nobody to ask: the claimant's own pick stands (its engines tell it who is alive)
            return proposal
        floor = min(recent[r] for r in live)
        owner = proposal
        if proposal in dead or recent[proposal] > floor + self.slack * prompt_tokens:
            n = last - first + 1  # the least loaded, first in a scan from the proposal (no bias to rank 0)
            owner = next(r for k in range(n) if (r := first + (proposal - first + k) % n) in live
                         and recent[r] == floor)
        recent[owner] += prompt_tokens
        return owner

    def _expire(self, now_s: float) -> None:
        entries = self.entries
        while entries:
            key, oldest = next(iter(entries.items()))
            if now_s - oldest.at_s <= self.ttl_s:
                return
            del entries[key]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k
