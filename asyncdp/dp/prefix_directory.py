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
  way to that rank. In steady traffic the counters have decayed and the proposal, which weighs load, memory and
  KV, stands.

A claimant whose policy spreads new prompts by prefix count (:mod:`asyncdp.dp.spread`) also sends its
``candidates``: the ranks it would accept for this new prefix, cheapest first (those within its spread window of the
cheapest by load). Its own count of the prefixes on each rank is of the ones it has seen, a fraction of them with
several API servers, so for a new key the directory picks among the candidates the rank that owns the fewest of
its entries, the proposal first among equals, then the candidates' order (the recent-tokens check above still
applies to that pick). Its entries are every claimant's placements. With 4 API servers on W2 at full scale, each
API server's own count left 17-22 of the 150 equal groups on a rank; ``ray_prefix``-style evenness needs the count
of all of them.

Every answer also carries, per rank of the scope, the *other* claimants' share of those counters: the prefill
work the others just placed, which this API server's view lacks until a snapshot shows it. Without it, in a burst
an API server that happened to be the first claimant of more prefixes on one rank than on another sees that rank
as busy and spreads its later requests of those prefixes over other ranks, though the directory balanced the
placements over everyone's (W1 at R = 4: 1.11 copies of each group, 0.94-0.96 x the goodput of R = 1; with the
counts, one copy and the same goodput). The counters are kept per claimant (the coordinator's client link) and a
claimant's go when it leaves.

A *deep* claim (``deep=True``) is of a run that follows a prefix the claimant placed: a conversation's history after a
system prompt every rank holds, whose earlier turns reached other API servers (W5 at R = 4: 2.02 x R = 1's mean TTFT
without it). Its hashes start at the run's first block, whose chained hash stands for the whole prompt up to it, so
it is keyed like any other claim. A known key answers as any other; an unknown one records the claimant's proposal
as its owner, unplaced and uncounted in ``owned`` and ``recent``: the claimant's policy already weighed the prefix it
holds, and placing these runs as new prefixes moved conversations off the ranks their routers chose (W5's hit rate
at the quick scale read 0.75 against 0.79).

Long placements. A new prefix of at least ``LONG_PLACEMENT_TOKENS`` is a prefill that queues whatever the other API
servers send to its rank meanwhile (W8's 55 000-token prompts, W7's 8-32 k documents), and their view of that rank
lacks it until a snapshot shows it, up to 100 ms later. The answer says how many tokens it placed (``placed``), and
the coordinator tells every other client at once (``PrefixPlaced``): each counts them on that rank until its next
snapshot, as it counts the ``others`` of an answer.

Routers that know a prefix never claim it again, so an entry's age says nothing about how much the prefix is used:
the TTL is long (``CLAIM_TTL_S``, ten minutes), and the size bounds do the real work. With 30 s, W7's long
documents (Zipf, full scale, R = 4) were placed again whenever a router first asked for one more than 30 s after
the last router that did: hit rate 0.835 against 0.928 at R = 1, mean TTFT 2.5 x; with ten minutes 0.926 and
1.06 x. An owner that evicted the prefix meanwhile is no worse a place for it than any other rank.

The answer sends that one request to the owner (unless the owner died or is not this API server's), and from then
on the API server's own index knows the prefix, so it never asks again for it while it holds it. Entries are
bounded (``max_entries``, and ``max_blocks`` hashes over all of them, oldest first) and expire after ``ttl_s``; a
dead rank's entries go, and a dead rank is never chosen; a rank that reset its prefix cache loses its entries too. Pure: the caller passes the time; the coordinator serves
it from its client links.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from asyncdp.dp.spread import fewest

__all__ = ["CLAIM_TTL_S", "LONG_PLACEMENT_TOKENS", "MAX_CLAIM_BLOCKS", "Answer", "Claim", "PrefixDirectory"]

CLAIM_TTL_S = 600.0  # [ours] how long a prefix nobody claims again stays placed (see the module docstring)
DECAY_S = 0.5  # [ours] how long the per-rank count of recent new-prefix tokens takes to fall by e
SLACK = 0.25  # [ours] a proposal stands while its rank is within this fraction of the prompt of the least loaded
MAX_ENTRIES = 65_536
MAX_STORED_BLOCKS = 1 << 22  # hashes kept over all entries (8 bytes each: 32 MiB at most)
MAX_CLAIM_BLOCKS = 1024  # the hashes a claim carries: matches are counted up to this many blocks
LONG_PLACEMENT_TOKENS = 8192  # [ours] a new prefix this long is told to the other clients at once (PrefixPlaced)


@dataclass(slots=True)
class Claim:
    owner: int
    hashes: array[int]  # the first claimant's prompt (signed 64-bit): later claimants match against it
    at_s: float  # last claimed
    deep: bool = False  # recorded by a deep claim: not in the prefix counts (owned)


@dataclass(frozen=True, slots=True)
class Answer:
    owner: int  # the rank the claimed prompt's request goes to
    matched: int  # leading blocks of the claimed hashes the owner is predicted to hold
    others: list[float]  # per rank of the scope: the other claimants' recent new-prefix prompt tokens
    placed: int = 0  # the prompt tokens of a new prefix this claim placed on owner (0: a known or deep one)


class PrefixDirectory:
    def __init__(self, dp_size: int, *, ttl_s: float = CLAIM_TTL_S, decay_s: float = DECAY_S, slack: float = SLACK,
                 max_entries: int = MAX_ENTRIES, max_blocks: int = MAX_STORED_BLOCKS) -> None:
        self.dp_size = dp_size
        self.ttl_s, self.decay_s, self.slack = ttl_s, decay_s, slack
        self.max_entries, self.max_blocks = max_entries, max_blocks
        self.blocks = 0  # hashes stored over all entries
        self.entries: OrderedDict[tuple[int, int, int], Claim] = OrderedDict()  # least recently claimed first
        # new-prefix prompt tokens placed per rank: in all (decayed to recent_at_s, on every claim) and per claimant
        # (each decayed to its own time, only when that claimant claims: a claim costs O(ranks), not O(claimants x
        # ranks), with an API server per rank at large dp)
        self.recent = [0.0] * dp_size
        self.recent_at_s = 0.0
        self.by_client: dict[int, tuple[list[float], float]] = {}  # client -> (counts, decayed to this time)
        self.dead: set[int] = set()
        self.owned = [0] * dp_size  # entries per owner rank (the prefix count that spreads new prefixes)

    def claim(self, hashes: Sequence[int], proposal: int, prompt_tokens: int, scope: tuple[int, int],
              now_s: float, client: int = 0, candidates: Sequence[int] = (), *, deep: bool = False) -> Answer:
        """Where this prompt's request goes (:class:`Answer`). ``scope`` is the claimant's managed ranks as
        ``(first, last)``, inclusive; ``proposal`` is in it; ``client`` names the claimant (its counts are left out
        of ``others``); ``candidates`` (in the scope, at most one per rank of it; may be empty) are the ranks it
        would accept for a new prefix, cheapest first. ``deep``: the hashes are a run that follows a prefix the
        claimant placed (a conversation's history after a shared system prompt); a known key answers as any other,
        an unknown one records the proposal as its owner, unplaced and uncounted (the claimant's policy already
        weighed the prefix it holds). Raises ValueError for a claim that does not fit that description."""
        first, last = scope
        if not hashes or not 0 <= first <= proposal <= last < self.dp_size:
            raise ValueError(f"bad prefix claim: {len(hashes)} hashes, proposal {proposal}, scope {scope}, "
                             f"dp_size {self.dp_size}")
        if len(candidates) > last - first + 1 or any(not first <= c <= last for c in candidates):
            raise ValueError(f"bad prefix claim: candidates {list(candidates)[:8]} for scope {scope}")
        self._expire(now_s)
        self.recent = self._decayed(self.recent, self.recent_at_s, now_s)
        self.recent_at_s = now_s
        mine = self._decayed(*self.by_client.get(client, ([0.0] * self.dp_size, now_s)), now_s)
        self.by_client[client] = (mine, now_s)
        key = (first, last, hashes[0])
        entry = self.entries.get(key)
        if entry is not None:
            entry.at_s = now_s
            self.entries.move_to_end(key)
            return Answer(entry.owner, _common_prefix(entry.hashes, hashes), self._others(mine, first, last))
        try:
            stored = array("q", hashes[:MAX_CLAIM_BLOCKS])
        except OverflowError:
            raise ValueError("bad prefix claim: a block hash is not a signed 64-bit integer") from None
        if deep:
            owner = proposal
        else:
            live = [c for c in candidates if c not in self.dead]
            owner = self._place(fewest(self.owned.__getitem__, live, proposal), prompt_tokens, first, last)
            self.owned[owner] += 1
            self.recent[owner] += prompt_tokens
            mine[owner] += prompt_tokens
        self.entries[key] = Claim(owner, stored, now_s, deep)
        self.blocks += len(stored)
        while len(self.entries) > self.max_entries or self.blocks > self.max_blocks:
            self._pop(next(iter(self.entries)))
        return Answer(owner, 0, self._others(mine, first, last), 0 if deep else prompt_tokens)

    def forget_client(self, client: int) -> None:
        """A claimant left: its counts no longer stand for anyone's view (its placements stay)."""
        entry = self.by_client.pop(client, None)
        if entry is not None:
            mine = self._decayed(*entry, self.recent_at_s)
            self.recent = [max(0.0, t - m) for t, m in zip(self.recent, mine, strict=True)]

    def drop_rank(self, rank: int) -> None:
        """A rank died: its prefixes are gone and it is never chosen again."""
        self.dead.add(rank)
        self.forget_rank(rank)

    def forget_rank(self, rank: int) -> None:
        """The rank's prefixes are gone (it died, or reset its prefix cache): a claim of one is a new prefix again."""
        for key in [k for k, c in self.entries.items() if c.owner == rank]:
            self._pop(key)

    def _pop(self, key: tuple[int, int, int]) -> None:
        entry = self.entries.pop(key)
        self.blocks -= len(entry.hashes)
        if not entry.deep:
            self.owned[entry.owner] -= 1

    def _others(self, mine: list[float], first: int, last: int) -> list[float]:
        """The scope's counts less the claimant's own (both decayed to now)."""
        recent = self.recent
        return [max(0.0, recent[r] - mine[r]) for r in range(first, last + 1)]

    def _decayed(self, counts: list[float], at_s: float, now_s: float) -> list[float]:
        """``counts`` as of ``at_s``, decayed to ``now_s`` (a long idle time forgets them)."""
        if now_s <= at_s:
            return counts
        f = math.exp(-(now_s - at_s) / self.decay_s)
        return [x * f for x in counts] if f >= 1e-6 else [0.0] * len(counts)

    def _place(self, proposal: int, prompt_tokens: int, first: int, last: int) -> int:
        recent, dead = self.recent, self.dead
        live = [r for r in range(first, last + 1) if r not in dead]
        if not live:  # nobody to ask: the claimant's own pick stands (its engines tell it who is alive)
            return proposal
        floor = min(recent[r] for r in live)
        if proposal not in dead and recent[proposal] <= floor + self.slack * prompt_tokens:
            return proposal
        n = last - first + 1  # the least loaded, first in a scan from the proposal (no bias to rank 0)
        return next(r for k in range(n) if (r := first + (proposal - first + k) % n) in live and recent[r] == floor)

    def _expire(self, now_s: float) -> None:
        entries = self.entries
        while entries:
            key, oldest = next(iter(entries.items()))
            if now_s - oldest.at_s <= self.ttl_s:
                return
            self._pop(key)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k
