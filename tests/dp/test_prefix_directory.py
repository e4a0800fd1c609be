"""The coordinator's prefix directory (asyncdp/dp/prefix_directory.py): where several API servers agree to put a new
prefix, and the policy and balancer hooks that ask it and learn from its answers."""

from __future__ import annotations

import random

import pytest

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy, prompt_hashes
from asyncdp.dp.balance import LoadBalancer
from asyncdp.dp.policy import Decision, RankLoad, RequestView, Snapshot
from asyncdp.dp.prefix_directory import MAX_CLAIM_BLOCKS, PrefixDirectory

ALL4 = (0, 3)


def om(answer) -> tuple[int, int]:
    return answer.owner, answer.matched


def test_first_claim_places_the_prefix_on_the_proposal_and_later_claims_get_it_with_their_match():
    d = PrefixDirectory(4)
    assert om(d.claim([1, 2, 3, 4], 2, 64, ALL4, now_s=0.0)) == (2, 0)
    # another router, another proposal: the first claim stands; 3 of its blocks match the first claimant's
    assert om(d.claim([1, 2, 3, 9, 9], 0, 80, ALL4, now_s=0.1)) == (2, 3)
    # a prompt sharing only the first block matches one block
    assert om(d.claim([1, 7], 1, 32, ALL4, now_s=0.2)) == (2, 1)


def test_a_proposal_on_a_rank_that_already_got_more_new_prefixes_gives_way_to_the_least_loaded():
    d = PrefixDirectory(4)
    assert om(d.claim([10], 1, 1000, ALL4, now_s=0.0)) == (1, 0)
    # rank 1 got 1000 new-prefix tokens at this instant; a proposal of rank 1 is now 1000 > 0.25*1000 over the
    # floor, so the least loaded rank after it in scan order takes it
    assert om(d.claim([20], 1, 1000, ALL4, now_s=0.0)) == (2, 0)
    assert om(d.claim([30], 1, 1000, ALL4, now_s=0.0)) == (3, 0)
    assert om(d.claim([40], 1, 1000, ALL4, now_s=0.0)) == (0, 0)
    # every rank has one: the proposal stands again
    assert om(d.claim([50], 1, 1000, ALL4, now_s=0.0)) == (1, 0)


def test_the_counts_decay_so_in_steady_traffic_the_proposal_stands():
    d = PrefixDirectory(4, decay_s=0.5)
    assert om(d.claim([10], 1, 1000, ALL4, now_s=0.0)) == (1, 0)
    assert om(d.claim([20], 1, 1000, ALL4, now_s=0.001)) == (2, 0)  # a moment later: still counted
    assert om(d.claim([30], 1, 1000, ALL4, now_s=10.0)) == (1, 0)  # 20 decay times later: forgotten


def test_claims_expire_after_the_ttl_unless_refreshed():
    d = PrefixDirectory(4, ttl_s=2.0, decay_s=0.01)  # (30 s by default)
    assert om(d.claim([5, 6], 0, 32, ALL4, now_s=0.0)) == (0, 0)
    assert om(d.claim([5, 6], 3, 32, ALL4, now_s=1.5)) == (0, 2)  # refreshed at 1.5
    assert om(d.claim([5, 6], 3, 32, ALL4, now_s=3.0)) == (0, 2)  # 1.5 s after the refresh: still there
    assert om(d.claim([5, 6], 3, 32, ALL4, now_s=5.5)) == (3, 0)  # expired: a new placement, the new proposal


def test_a_dead_rank_loses_its_prefixes_and_is_never_chosen():
    d = PrefixDirectory(3)
    assert om(d.claim([1], 1, 100, (0, 2), now_s=0.0)) == (1, 0)
    d.drop_rank(1)
    assert not d.entries
    # its prefix is placed again; the dead proposal gives way to the next live rank in scan order
    assert om(d.claim([1], 1, 100, (0, 2), now_s=0.0)) == (2, 0)


def test_scopes_of_different_nodes_never_share_an_entry_and_stay_in_their_ranks():
    d = PrefixDirectory(8)
    assert om(d.claim([1, 2], 1, 100, (0, 3), now_s=0.0)) == (1, 0)
    assert om(d.claim([1, 2], 5, 100, (4, 7), now_s=0.0)) == (5, 0)  # another node's API server: its own entry
    d.claim([3], 5, 1000, (4, 7), now_s=0.0)
    owner = d.claim([4], 5, 1000, (4, 7), now_s=0.0).owner
    assert 4 <= owner <= 7 and owner != 5


def test_the_directory_is_bounded_and_refuses_malformed_claims():
    d = PrefixDirectory(2, max_entries=3)
    for h in range(10):
        d.claim([h], 0, 16, (0, 1), now_s=0.0)
    assert len(d.entries) == 3
    assert list(d.entries)[0] == (0, 1, 7)  # the oldest went first
    d.claim(list(range(5000)), 0, 80_000, (0, 1), now_s=0.0)
    assert len(d.entries[(0, 1, 0)].hashes) == MAX_CLAIM_BLOCKS  # a long prompt is kept to its first blocks
    for bad in (([], 0, (0, 1)), ([1], 2, (0, 1)), ([1], 0, (1, 1)), ([1], 0, (0, 2)), ([1 << 63], 0, (0, 1))):
        with pytest.raises(ValueError):
            d.claim(bad[0], bad[1], 16, bad[2], now_s=0.0)


def test_the_hashes_kept_over_all_entries_are_bounded_too():
    d = PrefixDirectory(2, max_blocks=100)
    for h in range(5):
        d.claim([h] + [7] * 39, 0, 640, (0, 1), now_s=0.0)  # 40 blocks each
    assert d.blocks == 80 and [k[2] for k in d.entries] == [3, 4]
    d.drop_rank(d.entries[(0, 1, 3)].owner)
    assert d.blocks == 40 and len(d.entries) == 1


def test_a_new_prefix_goes_to_the_candidate_that_owns_the_fewest_entries_of_every_claimant():
    d = PrefixDirectory(4, decay_s=1e-9)  # the recent-token counts forgotten at once: only the entry counts act
    assert om(d.claim([1], 2, 100, ALL4, now_s=0.0, client=1, candidates=[2, 0])) == (2, 0)
    assert d.owned == [0, 0, 1, 0]
    # another claimant proposes rank 2 again: rank 0, next in its candidates' order, owns fewer
    assert om(d.claim([2], 2, 100, ALL4, now_s=1.0, client=2, candidates=[2, 0, 1])) == (0, 0)
    # the proposal stands among equals, and a rank outside the candidates is never chosen (rank 3 owns none)
    assert om(d.claim([3], 1, 100, ALL4, now_s=2.0, client=1, candidates=[0, 1, 2])) == (1, 0)
    assert om(d.claim([4], 2, 100, ALL4, now_s=3.0, client=3, candidates=[2, 1])) == (2, 0)
    assert d.owned == [1, 1, 2, 0]
    # no candidates: the proposal, whatever it owns; a known key: its owner, with no count
    assert om(d.claim([5], 2, 100, ALL4, now_s=4.0)) == (2, 0)
    assert om(d.claim([1, 7], 3, 100, ALL4, now_s=5.0, candidates=[3])) == (2, 1)
    assert d.owned == [1, 1, 3, 0]
    d.drop_rank(2)  # a dead candidate is skipped, and its entries no longer count
    assert d.owned == [1, 1, 0, 0]
    assert om(d.claim([6], 0, 100, ALL4, now_s=6.0, candidates=[2, 0, 3])) == (3, 0)
    with pytest.raises(ValueError):
        d.claim([7], 0, 100, ALL4, now_s=7.0, candidates=[0, 4])  # outside the scope
    with pytest.raises(ValueError):
        d.claim([7], 0, 100, (0, 1), now_s=7.0, candidates=[0, 1, 0])  # more than the scope's ranks


def test_the_entry_counts_fall_as_entries_expire_or_are_evicted():
    d = PrefixDirectory(2, ttl_s=10.0, max_entries=2, decay_s=1e-9)
    for h, t in ((1, 0.0), (2, 1.0), (3, 2.0)):
        d.claim([h], 0, 16, (0, 1), now_s=t)
    assert d.owned == [2, 0]  # the oldest went at the bound
    d.claim([4], 1, 16, (0, 1), now_s=11.5)  # entries 2 (claimed at 1.0) and 3 (2.0): 2 expired at 11.5
    assert d.owned == [1, 1] and sum(d.owned) == len(d.entries)


def test_a_deep_claim_looks_a_run_up_or_records_the_proposal_without_placing_or_counting_it():
    d = PrefixDirectory(4, max_entries=2, decay_s=1e-9)
    d.claim([10], 1, 1000, ALL4, now_s=0.0)  # a new prefix on rank 1: counted
    # rank 1 has the recent new-prefix tokens, so a new prefix proposed there would give way; a run after a prefix
    # the claimant placed keeps its proposal, and nothing is counted for it
    assert om(d.claim([70, 71], 1, 5000, ALL4, now_s=0.0, client=1, deep=True)) == (1, 0)
    assert d.owned == [0, 1, 0, 0] and d.recent[1] == 1000
    # another router finds it, with its match, as any entry
    assert om(d.claim([70, 71, 72], 3, 6000, ALL4, now_s=0.1, client=2, deep=True)) == (1, 2)
    d.claim([80], 2, 10, ALL4, now_s=0.2)  # the bound evicts the oldest entry, the counted one ...
    d.claim([90], 2, 10, ALL4, now_s=0.3)  # ... then the deep one, which was never counted
    assert d.owned == [0, 0, 2, 0] and sum(d.owned) == len(d.entries)



def test_an_answer_says_how_many_tokens_of_a_new_prefix_it_placed():
    # what the coordinator tells the other claimants at once when it is a long prefill (PrefixPlaced)
    d = PrefixDirectory(4)
    assert d.claim([10, 11], 1, 20_000, ALL4, now_s=0.0).placed == 20_000  # a new prefix, placed on rank 1
    assert d.claim([10, 12], 2, 30_000, ALL4, now_s=0.1, client=1).placed == 0  # a known one: placed before
    assert d.claim([20], 3, 9_000, ALL4, now_s=0.2, deep=True).placed == 0  # a deep run: recorded, not placed


# ---------------------------------------------------------------- the policy and the balancer


def _prompt(i: int, prefix: tuple[int, ...]) -> tuple[int, ...]:
    return (*prefix, *range(10_000 + 100 * i, 10_000 + 100 * i + 16))


SYSTEM = tuple(range(2000, 2000 + 16 * 8))  # 8 blocks


def test_asyncdp_claims_only_prompts_whose_first_block_it_never_placed_and_only_with_other_routers():
    pol = AsyncdpPolicy()
    alone = pol.init(4, 0, 1)
    assert pol.claim_hashes(alone, RequestView("a", _prompt(0, SYSTEM))) == ()
    state = pol.init(4, 0, 2)
    req = RequestView("a", _prompt(0, SYSTEM))
    assert tuple(pol.claim_hashes(state, req)) == prompt_hashes(req, 16)
    pol.on_prefix_owner(state, 3, prompt_hashes(req, 16), 8, [0.0] * 4)
    assert pol.claim_hashes(state, RequestView("b", _prompt(1, SYSTEM))) == ()  # it knows the first block now
    hinted = RequestView("c", _prompt(2, tuple(range(90_000, 90_016))), rank_hint=1)
    assert pol.claim_hashes(state, hinted) == ()


def test_a_learned_owner_draws_the_next_requests_of_the_prefix_like_its_own_placements():
    lb = LoadBalancer([0, 1, 2, 3], client_index=1, client_count=2, policy="asyncdp")
    ask = lb.claim("r0", _prompt(0, SYSTEM))
    assert ask is not None
    hashes, proposal = ask.hashes, ask.proposal
    owner = (proposal + 1) % 4  # all tied: the proposal is the key's rank; the directory names another
    # the directory says another router put the system prompt on that rank (its 8 blocks match)
    assert lb.on_prefix_owner(hashes, owner, 8, [0.0] * 4) == owner
    assert lb.select("r0", _prompt(0, SYSTEM), directed=owner) == owner
    # the next request of the prefix needs no claim and goes there on the credit the answer taught
    assert lb.claim("r1", _prompt(1, SYSTEM)) is None
    assert lb.select("r1", _prompt(1, SYSTEM)) == owner


def test_the_balancer_ignores_an_owner_it_does_not_manage_or_that_died_and_a_hint_beats_the_directory():
    lb = LoadBalancer([4, 5, 6, 7], client_index=0, client_count=2, policy="asyncdp")
    ask = lb.claim("r0", _prompt(0, SYSTEM))
    assert ask is not None
    assert ask[1] in (4, 5, 6, 7)
    assert lb.on_prefix_owner(ask[0], 1, 8, [0.0] * 4) is None  # not one of this client's ranks
    assert lb.on_prefix_owner(ask[0], 5, 8, [0.0] * 8) is None  # an answer for other ranks than this client's
    lb.mark_dead(6)
    assert lb.on_prefix_owner(ask[0], 6, 8, [0.0] * 4) is None
    assert lb.select("r0", _prompt(0, SYSTEM), 1, directed=5) == 5  # local index 1 = global 5: the hint
    assert lb.select("r1", _prompt(1, SYSTEM), 3, directed=5) == 7


def test_a_claim_offers_the_ranks_the_spread_rule_chooses_among_cheapest_first():
    pol = AsyncdpPolicy(memory_tokens=0)
    state = pol.init(4, 0, 2)
    _dispatch(pol, state, RequestView("x", _prompt(0, tuple(range(50_000, 50_000 + 16 * 40)))), 2, 0)  # 656 tokens
    _dispatch(pol, state, RequestView("y", _prompt(1, tuple(range(60_000, 60_000 + 16 * 5)))), 0, 0)  # 96 tokens
    req = RequestView("a", _prompt(2, SYSTEM))  # 144 tokens
    # within the prompt's length (fewer than SPREAD_TOKENS) of the cheapest (ranks 1 and 3, idle): ranks 1, 3 and
    # 0, in that order; rank 2 is not
    got = pol.claim_candidates(state, req, 0)
    assert sorted(got[:2]) == [1, 3] and got[2] == 0
    assert pol.select(req, None, state, 0, random.Random(0)).dp_rank in got
    # no candidates where the rule does not apply: a prompt a rank holds, the rule off, a closed gate
    assert pol.claim_candidates(state, RequestView("b", _prompt(3, tuple(range(50_000, 50_016)))), 0) == []
    off = AsyncdpPolicy(spread=False)
    assert off.claim_candidates(off.init(4, 0, 2), req, 0) == []
    state.phase_scale = 1.0  # most recent prompts were new: the phase weights place them
    assert pol.claim_candidates(state, req, 0) == []


def test_the_balancer_sends_the_candidates_as_global_live_ranks():
    lb = LoadBalancer([4, 5, 6, 7], client_index=0, client_count=2, policy="asyncdp")
    lb.mark_dead(5)
    ask = lb.claim("r0", _prompt(0, SYSTEM))
    assert ask is not None and sorted(ask.candidates) == [4, 6, 7] and ask.proposal in ask.candidates


def test_no_claims_with_one_router_one_rank_or_a_policy_without_an_index():
    assert LoadBalancer([0, 1], client_count=1, policy="asyncdp").claim("r", _prompt(0, SYSTEM)) is None
    assert LoadBalancer([3], client_index=0, client_count=2, policy="asyncdp").claim("r", _prompt(0, SYSTEM)) is None
    assert LoadBalancer([0, 1], client_index=0, client_count=2, policy="vllm").claim("r", _prompt(0, SYSTEM)) is None
    local = LoadBalancer([0, 1], client_index=0, client_count=2, policy="asyncdp@local")
    assert local.claim("r", _prompt(0, SYSTEM)) is None  # the preset that keeps each API server on its own


HISTORY = tuple(range(300_000, 300_000 + 16 * 40))  # 40 blocks of one user's conversation


def _router_that_knows_the_system_prompt(index: int, ranks=(0, 1, 2, 3)) -> LoadBalancer:
    lb = LoadBalancer([0, 1, 2, 3], client_index=index, client_count=2, policy="asyncdp")
    for r in ranks:  # it already sent a request with the system prompt to these ranks
        lb.select(f"warm{r}", _prompt(r, SYSTEM), r)
        lb.on_finish(f"warm{r}")
    return lb


def test_a_long_run_after_a_known_prefix_is_claimed_from_its_first_new_block():
    """A conversation's earlier turns went to another API server: this one knows the system prompt on every rank,
    not the history after it. The claim is of the history, keyed by its first block (whose chained hash stands for
    the whole prompt up to it), not of the system prompt every rank holds."""
    a = _router_that_knows_the_system_prompt(0)
    turn1 = (*SYSTEM, *HISTORY)
    ask = a.claim("t1", turn1)
    hashes = prompt_hashes(RequestView("t1", turn1), 16)
    assert ask is not None and tuple(ask.hashes) == hashes[8:]  # from the first block after the 8 system blocks
    d = PrefixDirectory(4)
    first = d.claim(ask.hashes, ask.proposal, len(turn1), ALL4, 0.0, client=0, deep=ask.deep)
    assert a.on_prefix_owner(ask.hashes, first.owner, first.matched, first.others) == first.owner
    assert a.select("t1", turn1, directed=first.owner) == first.owner
    # The next turn reaches the other API server, which never saw the history (nor sent the system prompt to the
    # owner): it asks, and learns the owner.
    b = _router_that_knows_the_system_prompt(1, [r for r in range(4) if r != first.owner])
    turn2 = (*turn1, *range(900_000, 900_000 + 16 * 3))
    ask2 = b.claim("t2", turn2)
    assert ask2 is not None and ask2.hashes[0] == ask.hashes[0]
    second = d.claim(ask2.hashes, ask2.proposal, len(turn2), ALL4, 0.1, client=1, deep=ask2.deep)
    assert (second.owner, second.matched) == (first.owner, 40)
    assert b.on_prefix_owner(ask2.hashes, second.owner, second.matched, second.others) == first.owner
    assert b.select("t2", turn2, directed=second.owner) == first.owner
    assert ask.deep and ask2.deep  # looked up or recorded, never placed by the directory
    # its index now holds the whole chain there, the system prompt before it included: the third turn needs no
    # claim, and goes there on its own credit
    turn3 = (*turn2, *range(950_000, 950_000 + 16 * 2))
    assert b.claim("t3", turn3) is None
    assert b.select("t3", turn3) == first.owner


def test_no_claim_for_a_short_new_run_one_router_or_asyncdp_shallow():
    a = _router_that_knows_the_system_prompt(0)
    short_tail = (*SYSTEM, *HISTORY[:16 * 31])  # 31 new blocks: fewer than DEEP_CLAIM_BLOCKS
    assert a.claim("s", short_tail) is None
    shallow = LoadBalancer([0, 1, 2, 3], client_index=0, client_count=2, policy="asyncdp@shallow")
    for r in range(4):
        shallow.select(f"warm{r}", _prompt(r, SYSTEM), r)
    assert shallow.claim("s", (*SYSTEM, *HISTORY)) is None
    pol = AsyncdpPolicy()
    alone = pol.init(4, 0, 1)
    for r in range(4):
        _dispatch(pol, alone, RequestView(f"w{r}", _prompt(r, SYSTEM)), r, 0)
    assert pol.claim_hashes(alone, RequestView("x", (*SYSTEM, *HISTORY))) == ()


def _dispatch(pol: AsyncdpPolicy, state, req: RequestView, rank: int, now_us: int) -> None:
    pol.on_dispatch(state, req, Decision(rank), now_us)


def _route(pol: AsyncdpPolicy, state, req: RequestView, now_us: int) -> int:
    d = pol.select(req, None, state, now_us, random.Random(0))
    _dispatch(pol, state, req, d.dp_rank, now_us)
    return d.dp_rank


def test_each_claimant_gets_the_other_claimants_recent_new_prefix_tokens_per_rank():
    d = PrefixDirectory(4, decay_s=0.5)
    assert d.claim([1], 0, 100, ALL4, now_s=0.0, client=7).others == [0.0, 0.0, 0.0, 0.0]
    assert d.claim([2], 2, 300, ALL4, now_s=0.0, client=8).others == [100.0, 0.0, 0.0, 0.0]  # not its own
    assert d.claim([3], 1, 50, ALL4, now_s=0.0, client=7).others == [0.0, 0.0, 300.0, 0.0]
    assert d.claim([2, 5], 3, 64, ALL4, now_s=0.0, client=9).others == [100.0, 50.0, 300.0, 0.0]  # a hit: no count
    later = d.claim([2, 5], 3, 64, ALL4, now_s=0.5, client=9).others
    assert later == pytest.approx([100 / 2.718281828, 50 / 2.718281828, 300 / 2.718281828, 0.0])
    assert d.claim([8], 1, 10, (1, 2), now_s=0.5, client=9).others == pytest.approx(later[1:3])  # its scope
    d.forget_client(8)  # the claimant left: its counts stand for nobody's view any more
    assert d.claim([9], 0, 10, ALL4, now_s=0.5, client=9).others[2] == pytest.approx(0.0)


def test_the_other_routers_new_prefixes_count_in_each_ranks_cost_until_the_next_snapshot():
    # This router placed three new prompts of its own on rank 1 (the directory's choice); the other routers' new
    # prefixes went to ranks 0, 2 and 3. Without that, rank 1 looks busiest and a later request of a prefix rank 1
    # holds would leave it; with it, the ranks are even and the hit keeps it there (W1's burst at R = 4).
    pol = AsyncdpPolicy(memory_tokens=0)
    state = pol.init(4, 0, 4)
    first = RequestView("a", _prompt(0, SYSTEM))
    pol.on_prefix_owner(state, 1, prompt_hashes(first, 16), 0, [0.0] * 4)
    _dispatch(pol, state, first, 1, 0)
    for i in range(2):
        _dispatch(pol, state, RequestView(f"o{i}", _prompt(50 + i, tuple(range(70_000 + 1000 * i,
                                                                                70_000 + 1000 * i + 128)))), 1, 0)
    alone = state.base[1] - state.base[0]
    assert alone > 2 * 128  # more than the credit of the 128-token system prompt
    pol.on_prefix_owner(state, None, prompt_hashes(RequestView("x", _prompt(9, (1,) * 16)), 16), 0,
                        [3 * 144.0, 0.0, 3 * 144.0, 3 * 144.0])
    assert state.base[1] - state.base[0] == pytest.approx(alone - 3 * 144.0)
    assert _route(pol, state, RequestView("b", _prompt(1, SYSTEM)), 1_000) == 1
    pol.on_snapshot(state, Snapshot(tuple(RankLoad(0, 0, 0.0) for _ in range(4)), delivered_at_us=2_000))
    assert state.shared == [0.0] * 4 and state.base[1] - state.base[0] > 2 * 128
    assert _route(pol, state, RequestView("c", _prompt(2, SYSTEM)), 3_000) != 1


def test_a_directory_answer_for_another_number_of_ranks_is_refused_by_the_policy_state():
    pol = AsyncdpPolicy()
    state = pol.init(4, 0, 2)
    with pytest.raises(ValueError):
        state.set_shared([0.0] * 3)


def test_claims_that_are_never_answered_leave_a_bounded_number_of_heads():
    from asyncdp.dp.deep_claims import MAX_HEADS

    a = _router_that_knows_the_system_prompt(0)
    for i in range(MAX_HEADS + 10):
        ask = a.claim(f"t{i}", (*SYSTEM, *range(400_000 + 1000 * i, 400_000 + 1000 * i + 16 * 40)))
        assert ask is not None and ask.deep
    assert 0 < len(a.state.deep.heads) <= MAX_HEADS


def test_a_rank_that_reset_its_cache_loses_its_entries_and_stays_eligible():
    """``forget_rank`` (a ``PrefixCacheReset``): the rank's prefixes are new again, placed on the proposal (it may be
    that rank), with nothing predicted cached; the other ranks' entries stay."""
    d = PrefixDirectory(4)
    d.claim([11, 12, 13], 1, 48, (0, 3), now_s=0.0)
    d.claim([21, 22], 2, 32, (0, 3), now_s=0.0)
    d.forget_rank(1)
    assert list(d.entries) == [(0, 3, 21)] and d.owned == [0, 0, 1, 0]
    again = d.claim([11, 12, 99], 1, 48, (0, 3), now_s=10.0, client=1)
    assert (again.owner, again.matched, again.placed) == (1, 0, 48)
    assert d.claim([21, 22, 99], 0, 48, (0, 3), now_s=10.0, client=1).matched == 2
