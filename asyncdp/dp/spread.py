"""New prompts spread by prefix count, a rule of asyncdp's policy for a prompt no rank holds.

Such a prompt goes to the cheapest rank by load (H2), and that is decided by whichever ranks are prefilling at that
instant, a transient; the rank a new prefix lands on is where all its later requests go. Equally popular prefix
groups whose working set nearly fills the cluster's KV (W2: 150 groups, 73 %) then end 16-21 to a rank, and at the
edge of capacity the rank with the most overflows first. Under this rule the prompt goes to the rank holding the
fewest prefixes (the first blocks in this router's index, :class:`~.owner_index.OwnerIndex` ``roots``) among the
ranks whose miss cost is within ``min(prompt, spread_tokens)`` (512) tokens of the cheapest, so the counts even out
as under ``ray_prefix``'s "smallest tree" while a busy rank is never a candidate.

With several API servers each one's index holds only the prefixes it has seen; a claimed new prompt carries the
candidates (``AsyncdpPolicy.claim_candidates``) and the coordinator's prefix directory applies the count of every
API server's prefixes (:mod:`.prefix_directory`).

A count of prefixes stands for load only where prefixes recur about equally often, so the policy applies the rule
only while (a) no request of about the last 256 began with a hot prefix (``AsyncdpState.hot_recently``: one that
began a quarter of a rank's share of the recent requests; W7's Zipf documents, where most documents are cold and
a few draw most requests) and (b) fewer than about half the recent prompts were new (``phase_scale`` 0: where
most are new, as in W9, nothing recurs and the phase weights place them). ``asyncdp@no_spread`` turns it off.
``asyncdp@spread`` (within one prefill of the prompt) and ``asyncdp@spread512`` apply it without the gates,
wherever the phase weights are not in full; on W7 they lengthen the queues behind new long documents
(docs/benchmarks.md, "New prompts spread by prefix count" and the paragraphs after it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def ranks_within(mbase: Sequence[float], mbest: float, within: float) -> list[int]:
    """The ranks whose miss cost ``mbase`` is within ``within`` tokens of the cheapest (``mbest``), in rank order."""
    lim = mbest + within
    return [r for r in range(len(mbase)) if mbase[r] <= lim]


def near_cheapest(mbase: Sequence[float], mbest: float, within: float, start: int) -> list[int]:
    """The ranks whose miss cost ``mbase`` is within ``within`` tokens (the prompt's length, or the policy's
    ``spread_tokens`` if fewer) of the cheapest (``mbest``): cheapest first, then in the scan order from ``start``.
    The rule's candidates, in ``select`` and in a claim to the prefix directory."""
    n = len(mbase)
    return sorted(ranks_within(mbase, mbest, within), key=lambda r: (mbase[r], (r - start) % n))


def fewest(count: Callable[[int], int], candidates: Sequence[int], proposal: int) -> int:
    """Among ``candidates`` (in order of preference), the one with the fewest ``count``: ``proposal`` when it is
    one of them and counts no more than they do, else the first with the fewest; ``proposal`` when there are none.
    The policy counts the prefixes in its own index, the prefix directory its entries (every router's)."""
    if not candidates:
        return proposal
    least = min(count(r) for r in candidates)
    if proposal in candidates and count(proposal) == least:
        return proposal
    return next(r for r in candidates if count(r) == least)


def fewest_prefixes(roots: Sequence[set[int]], mbase: Sequence[float], mbest: float, mpick: int, within: float,
                    start: int) -> int:
    """The rule in ``select``: among :func:`near_cheapest`, the rank holding the fewest prefixes of this router's
    index (``roots``), ``mpick`` (the cheapest) first among equals."""
    return fewest(lambda r: len(roots[r]), near_cheapest(mbase, mbest, within, start), mpick)
