"""asyncdp's policy with several routers (H7, shared state): which prompts it claims through the coordinator's prefix
directory, and what it learns from the directory's answers and announcements (:mod:`.prefix_directory`,
docs/discussion/routing-policy.md "Several routers"). A base of :class:`~.asyncdp_policy.AsyncdpPolicy`."""

from __future__ import annotations

from collections.abc import Sequence

from asyncdp.dp.asyncdp_state import AsyncdpState
from asyncdp.dp.owner_index import prompt_hashes
from asyncdp.dp.policy import Policy, RequestView
from asyncdp.dp.prefix_directory import MAX_CLAIM_BLOCKS


class SeveralRouters(Policy):
    """The policy's hooks for the prefix directory; the settings are :class:`~.asyncdp_policy.AsyncdpPolicy`'s."""

    prefix: bool  # False: no prefix index, nothing to claim
    directory: bool  # False (asyncdp@local): never ask the directory
    claim_in_phase: bool  # True (asyncdp@claim_all): claim new prompts while the phase weights hold too
    deep_claims: bool  # False (asyncdp@shallow): claim only prompts whose first block is new

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

    def claim_is_deep(self, state: AsyncdpState, hashes: Sequence[int]) -> bool:
        return state.deep.is_deep(hashes)

