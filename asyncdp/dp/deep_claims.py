"""Deep prefix claims: a long run after a prefix this router placed, asked of the coordinator's prefix directory.

Theory of operation. A router claims a prompt through the directory (:mod:`.prefix_directory`) when another router
may have placed it. The first block is not always the tell: a conversation's prompt starts with a system prompt
every router has sent to every rank, then the user's history, whose earlier turns reached other API servers behind
the same port. A router that never saw that history knows the system prompt everywhere and the history nowhere, so
it would pick a rank by load and miss the history's cache (W5 at R = 4: 2.02 x R = 1's mean TTFT, hit rate 0.80
against 0.91).

:meth:`DeepClaims.claim` claims such a run when at least ``DEEP_CLAIM_BLOCKS`` blocks follow the deepest run the
router's index knows. The claim's hashes start at the first block it never sent: that block's chained hash stands
for the whole prompt up to it, so the directory keys it like any claim. The router keeps the head it already knew
(the blocks before the run) until the answer comes, so that :meth:`DeepClaims.take_head` can give the owner's
index entry the whole chain and the index stays prefix-closed. Answers that never come (the directory timed out)
leave heads behind; at most ``MAX_HEADS`` are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from asyncdp.dp.owner_index import OwnerIndex
from asyncdp.dp.prefix_directory import MAX_CLAIM_BLOCKS

DEEP_CLAIM_BLOCKS = 32  # [ours] a known prefix followed by at least this many blocks never sent is claimed
MAX_HEADS = 64  # heads of claims awaiting an answer


@dataclass(slots=True)
class DeepClaims:
    heads: dict[int, tuple[int, ...]] = field(default_factory=dict)  # first block of the run -> the blocks before it

    def claim(self, index: OwnerIndex, hashes: Sequence[int]) -> Sequence[int]:
        """The run to claim of a prompt whose first block some rank holds (``hashes``: its chained block hashes),
        or () when fewer than ``DEEP_CLAIM_BLOCKS`` blocks follow the deepest run ``index`` knows."""
        if len(hashes) <= DEEP_CLAIM_BLOCKS:
            return ()
        lo = index.deepest_run(hashes)
        if len(hashes) - lo < DEEP_CLAIM_BLOCKS:
            return ()
        if len(self.heads) >= MAX_HEADS:
            self.heads.clear()
        self.heads[hashes[lo]] = tuple(hashes[:lo])
        return hashes[lo:lo + MAX_CLAIM_BLOCKS]

    def is_deep(self, hashes: Sequence[int]) -> bool:
        """Whether ``hashes`` is a run :meth:`claim` returned, still awaiting its answer."""
        return bool(hashes) and hashes[0] in self.heads

    def take_head(self, hashes: Sequence[int]) -> tuple[int, ...] | None:
        """The answer to the claim of ``hashes`` came: the blocks before the run, or None for a plain claim."""
        return self.heads.pop(hashes[0], None) if hashes else None
