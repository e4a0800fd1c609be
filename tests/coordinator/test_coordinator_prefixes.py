"""The DP coordinator's prefix directory, in trio's virtual time: clients agree on a new prefix's owner
through it, a dead owner loses its prefixes, claims' candidates and deep claims, a long new prefix told to
every other client, and a client that leaves takes its counts with it."""

from __future__ import annotations

import logging

import pytest
import trio

from asyncdp.coordinator.core import CoordinatorConfig
from asyncdp.dp.prefix_directory import LONG_PLACEMENT_TOKENS
from asyncdp.messages import PrefixCacheReset, PrefixClaim, PrefixOwner, PrefixPlaced
from tests.coordinator.harness import coordinator

# ---------------------------------------------------------------- the prefix directory


def claim(seq: int, hashes: list[int], proposal: int, first: int = 0, last: int = 3) -> PrefixClaim:
    return PrefixClaim(seq=seq, hashes=hashes, proposal=proposal, prompt_tokens=16 * len(hashes),
                       first_rank=first, last_rank=last)


@pytest.mark.trio
async def test_clients_agree_on_a_new_prefix_through_the_coordinator_and_a_dead_owner_loses_it(autojump_clock,
                                                                                               caplog):
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        engines = await h.engines(4)
        a, b = await h.client(0), await h.client(1)
        await a.send(claim(7, [11, 12, 13, 14], proposal=1))
        t_sent = trio.current_time()
        t, owner = await a.expect(PrefixOwner)
        assert owner == PrefixOwner(seq=7, owner=1, matched=0, others=[0.0] * 4) and t == t_sent  # at once
        await b.send(claim(3, [11, 12, 99], proposal=2))  # the same system prompt, another question
        _, owner = await b.expect(PrefixOwner)
        # the owner, the blocks it shares, and client a's new-prefix tokens (64) on rank 1
        assert owner == PrefixOwner(seq=3, owner=1, matched=2, others=[0.0, 64.0, 0.0, 0.0])
        # a malformed claim (a proposal outside its own scope) is dropped with a warning; the link stays up
        with caplog.at_level(logging.WARNING):
            await b.send(claim(4, [5], proposal=3, first=0, last=1))
            await b.send(claim(5, [5], proposal=0, first=0, last=1))
            _, owner = await b.expect(PrefixOwner)
        assert owner.seq == 5 and "dropping a prefix claim" in caplog.text
        # the owner's engine dies: the prefix is placed again, not on it
        await engines[1].close()
        await trio.sleep(6)
        await b.send(claim(6, [11, 12, 99], proposal=1))
        _, owner = await b.expect(PrefixOwner)
        assert owner.owner != 1 and owner.matched == 0


@pytest.mark.trio
async def test_a_claims_candidates_reach_the_directory_which_counts_every_clients_prefixes(autojump_clock, caplog):
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        await h.engines(4)
        a, b = await h.client(0), await h.client(1)
        await a.send(claim(1, [21, 22], proposal=0))
        _, owner = await a.expect(PrefixOwner)
        assert owner.owner == 0
        await trio.sleep(10)  # the recent new-prefix tokens decay away; the entry stays
        # b never saw a's prefix: for it, rank 0 is as good as rank 3, but rank 0 owns one prefix and rank 3 none
        await b.send(PrefixClaim(seq=1, hashes=[31], proposal=0, prompt_tokens=16, first_rank=0, last_rank=3,
                                 candidates=[0, 3]))
        _, owner = await b.expect(PrefixOwner)
        assert owner.owner == 3
        with caplog.at_level(logging.WARNING):  # a candidate outside the claimant's scope: dropped, link kept
            await b.send(PrefixClaim(seq=2, hashes=[41], proposal=0, prompt_tokens=16, first_rank=0, last_rank=1,
                                     candidates=[0, 2]))
            await b.send(claim(3, [41], proposal=1))
            _, owner = await b.expect(PrefixOwner)
        assert owner.seq == 3 and "dropping a prefix claim" in caplog.text


@pytest.mark.trio
async def test_a_deep_claim_reaches_the_directory_which_records_the_proposal_unplaced(autojump_clock):
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        await h.engines(4)
        a, b = await h.client(0), await h.client(1)
        await a.send(claim(1, [21], proposal=1))  # a new prefix on rank 1: its new-prefix tokens are counted
        await a.expect(PrefixOwner)
        # a plain claim proposing rank 1 now gives way; a deep one (a run after a prefix b placed) keeps it
        await b.send(claim(1, [51, 52], proposal=1))
        _, plain = await b.expect(PrefixOwner)
        await b.send(PrefixClaim(seq=2, hashes=[61, 62], proposal=1, prompt_tokens=32, first_rank=0, last_rank=3,
                                 deep=True))
        _, deep = await b.expect(PrefixOwner)
        await a.send(PrefixClaim(seq=2, hashes=[61, 62, 63], proposal=3, prompt_tokens=48, first_rank=0,
                                 last_rank=3, deep=True))
        _, found = await a.expect(PrefixOwner)
    assert plain.owner != 1 and deep.owner == 1 and (found.owner, found.matched) == (1, 2)


@pytest.mark.trio
async def test_a_long_new_prefix_is_told_to_every_other_client_at_once(autojump_clock):
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        await h.engines(4)
        a, b, c = await h.client(0), await h.client(1), await h.client(2)
        await a.send(PrefixClaim(seq=1, hashes=[71, 72], proposal=2, prompt_tokens=LONG_PLACEMENT_TOKENS,
                                 first_rank=0, last_rank=3))
        t_sent = trio.current_time()
        await a.expect(PrefixOwner)
        for other in (b, c):  # the others hear of it before any snapshot could show it
            t, placed = await other.expect(PrefixPlaced)
            assert placed == PrefixPlaced(rank=2, prompt_tokens=LONG_PLACEMENT_TOKENS) and t == t_sent
        await trio.sleep(0.01)
        assert not [msg for _, msg in a.drain() if isinstance(msg, PrefixPlaced)]  # the claimant knows
        # not the claimant; not a shorter new prefix, a known one or a deep claim's run
        await a.send(PrefixClaim(seq=2, hashes=[81], proposal=1, prompt_tokens=LONG_PLACEMENT_TOKENS - 1,
                                 first_rank=0, last_rank=3))
        await b.send(PrefixClaim(seq=1, hashes=[71, 72, 73], proposal=0, prompt_tokens=3 * LONG_PLACEMENT_TOKENS,
                                 first_rank=0, last_rank=3))
        await c.send(PrefixClaim(seq=1, hashes=[91], proposal=0, prompt_tokens=LONG_PLACEMENT_TOKENS, first_rank=0,
                                 last_rank=3, deep=True))
        for peer in (a, b, c):
            await peer.expect(PrefixOwner)
        await trio.sleep(0.01)
        assert not [msg for peer in (a, b, c) for _, msg in peer.drain() if isinstance(msg, PrefixPlaced)]


@pytest.mark.trio
async def test_a_client_that_leaves_takes_its_new_prefix_counts_with_it(autojump_clock):
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        await h.engines(4)
        a, b = await h.client(0), await h.client(1)
        await a.send(claim(1, [21, 22], proposal=2))
        await a.expect(PrefixOwner)
        await b.send(claim(1, [31], proposal=0))
        _, owner = await b.expect(PrefixOwner)
        assert owner.others == [0.0, 0.0, 32.0, 0.0]  # a's new prefix on rank 2
        await a.close()
        await trio.sleep(0.001)  # (the counts decay over 0.5 s: 0.2 % in this time)
        await b.send(claim(2, [41], proposal=1))
        _, owner = await b.expect(PrefixOwner)
        assert owner.others == [0.0, 0.0, 0.0, 0.0]


@pytest.mark.trio
async def test_a_rank_that_reset_its_prefix_cache_loses_its_prefixes_and_stays_eligible(autojump_clock):
    """``PrefixCacheReset`` from an engine: the prefixes placed on its rank are new again (placed anew, no blocks
    predicted cached), while the other ranks' stay known and the rank is still chosen."""
    async with coordinator(CoordinatorConfig(dp_size=4, wave_mode=False)) as h:
        engines = await h.engines(4)
        a, b = await h.client(0), await h.client(1)
        await a.send(claim(1, [11, 12, 13], proposal=1))
        await a.send(claim(2, [21, 22], proposal=2))
        for _ in range(2):
            await a.expect(PrefixOwner)
        await engines[1].send(PrefixCacheReset(dp_rank=1))
        await trio.sleep(10)  # the recent new-prefix tokens decay away (they would move the proposal off rank 1)
        await b.send(claim(1, [11, 12, 99], proposal=1))  # the same system prompt: rank 1 no longer holds it
        await b.send(claim(2, [21, 22, 99], proposal=0))
        _, placed = await b.expect(PrefixOwner)
        _, known = await b.expect(PrefixOwner)
    assert (placed.owner, placed.matched) == (1, 0)
    assert (known.owner, known.matched) == (2, 2)
