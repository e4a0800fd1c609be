"""New prompts spread by prefix count, asyncdp's policy's opt-in rule (``asyncdp@spread``).

A prompt no rank holds goes to the cheapest rank by load (H2), and that is decided by whichever ranks are
prefilling at that instant, a transient; the rank a new prefix lands on is where all its later requests go.
Equally popular prefix groups whose working set nearly fills the cluster's KV (W2: 150 groups, 73 %) then end
16-21 to a rank, and at the edge of capacity the rank with the most overflows first. Under this rule the prompt
goes to the rank holding the fewest prefixes (the first blocks in this router's index,
:class:`~.owner_index.OwnerIndex` ``roots``) among the ranks whose miss cost is within one prefill of that prompt
of the cheapest, so the counts even out as under ``ray_prefix``'s "smallest tree" while a busy rank is never a
candidate. The policy applies it while fewer than 90 % of the recent prompts were new (where new prompts share
nothing, as in W9, the phase weights place them). Off by default: new long documents (W7) then queue hits behind
their prefill on the ranks with few documents (docs/benchmarks.md, "New prompts spread by prefix count").
``asyncdp@spread512`` narrows "within one prefill" to within ``min(prompt, 512)`` tokens of the cheapest: a 32 k
document no longer counts a rank 30 k tokens busier than the cheapest as near (docs/benchmarks.md, "`asyncdp@spread`
over W2's whole ladder, and spread within 512 tokens").
"""

from __future__ import annotations

from collections.abc import Sequence


def fewest_prefixes(roots: Sequence[set[int]], mbase: Sequence[float], mbest: float, mpick: int, within: float,
                    start: int) -> int:
    """Among the ranks whose miss cost ``mbase`` is within ``within`` tokens (the prompt's length, or the policy's
    ``spread_tokens`` if fewer) of the cheapest (``mbest``, at
    ``mpick``), the one holding the fewest prefixes: ``mpick`` when it holds no more than they do, else the cheapest
    of those, then the first in the scan order from ``start``."""
    lim, n = mbest + within, len(mbase)
    near = [r for r in range(n) if mbase[r] <= lim]
    fewest = min(len(roots[r]) for r in near)
    if len(roots[mpick]) <= fewest:
        return mpick
    return min((r for r in near if len(roots[r]) == fewest), key=lambda r: (mbase[r], (r - start) % n))
