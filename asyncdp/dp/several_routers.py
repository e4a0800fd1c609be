"""asyncdp's policy with several routers (H7, shared state): which prompts it claims through the coordinator's prefix
directory, which ranks it would accept for one, and what it learns from the directory's answers and announcements (:mod:`.prefix_directory`,
docs/discussion/routing-policy.md "Several routers"), and from a rank's prefix-cache reset, which every router hears
of. A base of :class:`~.asyncdp_policy.AsyncdpPolicy`."""

from __future__ import annotations

from collections.abc import Sequence

from asyncdp.dp.asyncdp_state import AsyncdpState
from asyncdp.dp.owner_index import prompt_hashes
from asyncdp.dp.policy import Policy, RequestView
from asyncdp.dp.prefix_directory import MAX_CLAIM_BLOCKS
from asyncdp.dp.spread import near_cheapest
from asyncdp.dp.ties import tie_key
from asyncdp.dp.unseen import CostOrder, raised


class SeveralRouters(Policy):
    """The policy's hooks for the prefix directory; the settings are :class:`~.asyncdp_policy.AsyncdpPolicy`'s."""

    prefix: bool  # False: no prefix index, nothing to claim
    directory: bool  # False (asyncdp@local): never ask the directory
    claim_in_phase: bool  # True (asyncdp@claim_all): claim new prompts while the phase weights hold too
    deep_claims: bool  # False (asyncdp@shallow): claim only prompts whose first block is new
    spread: bool  # False (asyncdp@no_spread): a new prompt goes to the cheapest rank by load
    fill_new: bool  # True (asyncdp@fill): the others' unseen work is poured for new prompts too
    unseen_fill: float  # 0 (asyncdp@no_fill): the others' unseen work is not estimated

    def spread_applies(self, state: AsyncdpState) -> bool:  # AsyncdpPolicy's: whether the spread rule holds
        raise NotImplementedError

    def _within(self, req: RequestView) -> float:  # AsyncdpPolicy's: the spread window for req
        raise NotImplementedError


    def claim_hashes(self, state: AsyncdpState, req: RequestView) -> Sequence[int]:
        """With other routers, a prompt whose first block this router never placed, or a long run after one it did
        (:mod:`.deep_claims`), is claimed through the coordinator: another may have placed it
        (:mod:`asyncdp.dp.prefix_directory`)."""
        if state.num_routers < 2 or not self.directory or not self.prefix or req.rank_hint is not None:
            return ()
        if state.phase_scale >= 1.0 and not self.claim_in_phase:
            # Most recent prompts were new to every rank and the phase weights hold in full (W9): prompts that do not
            # recur need no agreement, and the directory, placing by the others' recent new-prefix tokens, would
            # undo the weights (W9 at R = 4 read 3.5 x R = 1's mean TTFT)
            return ()
        hashes = prompt_hashes(req, state.block_size)
        if not hashes:
            return ()
        if not state.index.owners.get(hashes[0], 0):
            return hashes[:MAX_CLAIM_BLOCKS]
        return state.deep.claim(state.index, hashes) if self.deep_claims else ()  # a run after a placed prefix

    def on_prefix_owner(self, state: AsyncdpState, dp_rank: int | None, hashes: Sequence[int], matched: int,
                        others: Sequence[float]) -> None:
        """Record what another router placed on ``dp_rank`` (the directory's match) in this router's index, and
        the other routers' recent new-prefix tokens per rank (:meth:`AsyncdpState.set_shared`)."""
        head = state.deep.take_head(hashes)
        if matched and dp_rank is not None and dp_rank not in state.excluded:
            state.index.insert(dp_rank, (*(head or ()), *hashes[:matched]))
        if head is None:  # a deep claim's answer is a lookup: the others' new-prefix counts are for new prefixes
            state.set_shared(others)

    def on_prefix_placed(self, state: AsyncdpState, dp_rank: int, prompt_tokens: int) -> None:
        """Another router's long new prefix on ``dp_rank``: its prefill counts there with the others' new-prefix tokens
        until the next snapshot shows it (:meth:`AsyncdpState.add_shared`)."""
        if self.directory:
            state.add_shared(dp_rank, prompt_tokens)

    def claim_candidates(self, state: AsyncdpState, req: RequestView, now_us: int) -> list[int]:
        """With several routers, for a claimed prompt (no rank holds it) while the spread rule applies: the ranks
        ``select`` spreads it among (miss cost within the spread window of the cheapest), cheapest first, then in
        the scan order from the key. The directory picks the one owning the fewest prefixes of every router's; this
        router's own count (``index.roots``) is of the prefixes it has seen (:mod:`.prefix_directory`)."""
        hashes = prompt_hashes(req, state.block_size) if self.prefix else ()
        if not (self.spread and hashes and self.spread_applies(state)) or state.index.owners.get(hashes[0], 0):
            return []
        decayed = state.decayed_costs(now_us)
        base, mbase = (state.base, state.mbase) if decayed is None else (decayed[0], decayed[2])
        if self.fill_new and (unseen := self.unseen_fill * state.unseen(now_us)) > 0 and state.order is not None:
            order = state.order if decayed is None else CostOrder(base, mbase)
            mbase = raised(mbase, base, order.level(unseen)[0])
        if (cheapest := min(mbase)) == float("inf"):
            return []
        return near_cheapest(mbase, cheapest, self._within(req), tie_key(req, hashes) % state.n)

    def claim_is_deep(self, state: AsyncdpState, hashes: Sequence[int]) -> bool:
        return state.deep.is_deep(hashes)

    def on_cache_reset(self, state: AsyncdpState, dp_rank: int) -> None:
        """The rank dropped its prefix cache: its part of the index goes, so no hit is predicted there, and its
        memory term reads empty (the fill its last snapshot reported is gone too)."""
        state.index.drop_rank(dp_rank)
        state.fill[dp_rank] = 0.0
        state.update(dp_rank)

