"""Conformance vectors for asyncdp's policy with hot prefixes (asyncdp/dp/asyncdp_policy.py, asyncdp_state.py):
deliberate replicas of a prefix hotter than its holders can serve (``mark_spill``, ``replica_depth``), and new
conversations after a hot prefix placed by key (``hot_new``), hand-computed.

Unless stated the cost is ``pending + 16·decoding + others + kv_penalty + prompt_len - 2·credit`` per rank; the
memory term is off (``memory_tokens=0``)."""

from __future__ import annotations

import pytest

from asyncdp.dp.asyncdp_policy import REPLICA_HEADROOM, AsyncdpPolicy, AsyncdpState, prompt_hashes
from asyncdp.dp.balance import make_policy
from asyncdp.dp.owner_index import chain_hashes, common_run
from asyncdp.dp.policy import RequestView
from asyncdp.dp.prefix_rates import PrefixRates
from tests.dp.asyncdp_requests import PREFIX, prompt, route


def hot_prefix_state(p: AsyncdpPolicy, uses: int, blocks: int = 28_000) -> AsyncdpState:
    """dp 4: ``uses`` finished requests with PREFIX on rank 0, then three of them decoding there."""
    s = p.init(4, params={"kv_blocks_per_rank": blocks})
    for k in range(uses):
        req = prompt(100 + k)
        route(p, s, req, hint=0)
        p.on_finish(s, req.req_id, 0, 1)
    for k in range(3):
        req = prompt(10 + k)
        route(p, s, req, hint=0)
        p.on_first_token(s, req.req_id, 0, 2)
    return s


def test_a_prefix_hotter_than_its_holder_can_serve_gets_a_second_holder():
    p = AsyncdpPolicy(memory_tokens=0)
    s = hot_prefix_state(p, 80)
    assert s.rates.share(prompt_hashes(prompt(1), 16)[0]) > 1 / (4 * 1.5)  # more than its holder's fair part
    assert s.load[0] < s.cap  # not past the hot-spot bound: only the replica rule moves it
    # without it rank 0 would win: 48 + 80 - 2·64 = 0 against 80 on an idle rank
    second = route(p, s, prompt(50), now_us=3)
    assert second != 0
    assert s.index.match(second, prompt_hashes(prompt(51), 16)) == 4  # the new holder has the prefix
    p.on_first_token(s, prompt(50).req_id, second, 4)  # the replica: one decoding request, rank 0 three
    assert route(p, s, prompt(51), now_us=5) == second  # two holders now: the lighter one, with its hit


def test_a_run_that_extends_a_hot_prefix_stays_with_its_holder():
    """W5's shape: every request starts with the same system prompt (hot by demand, held by several ranks) and
    goes on with its user's history, held by one rank. A replica mark on the system prompt must not move the user
    off the history: the moved request would pay the whole history's prefill and add no holder of the hot part."""
    p = AsyncdpPolicy(memory_tokens=0)
    s = hot_prefix_state(p, 200)  # hot enough to want more than two holders
    other = prompt(60)  # another user's turn: the system prompt on rank 1 too
    route(p, s, other, hint=1)
    p.on_finish(s, other.req_id, 1, 2)
    history = (*PREFIX, *range(70_000, 70_000 + 10 * 16))  # this user's 10 blocks of history, on rank 0
    route(p, s, RequestView("turn1", history), hint=0)
    p.on_finish(s, "turn1", 0, 2)
    first = prompt_hashes(prompt(1), 16)[0]
    assert first in s.spill  # the system prompt is marked: its busiest holder is past the mean
    turn2 = RequestView("turn2", (*history, *range(90_000, 90_016)))
    # rank 0: 48 + 240 - 2·224 = -160; an idle rank without the history: 240
    assert route(p, s, turn2, now_us=3) == 0


def test_a_run_that_extends_a_hot_prefix_stays_with_its_holder_when_that_is_the_prefixs_only_holder():
    """The same when no other rank holds the system prompt yet (every user began on one rank, and each API server
    of several has only its own sends in its index): the prefix's whole run and the user's are then held by the
    same one rank, yet a replica there would copy the user's history, which no one else reads. Four API servers
    each made such a move on W5, at a whole prefill each (0.33-0.38 s of TTFT)."""
    p = AsyncdpPolicy(memory_tokens=0)
    s = hot_prefix_state(p, 200)
    history = (*PREFIX, *range(70_000, 70_000 + 10 * 16))  # this user's 10 blocks of history, on rank 0
    route(p, s, RequestView("turn1", history), hint=0)
    p.on_finish(s, "turn1", 0, 2)
    first = prompt_hashes(prompt(1), 16)[0]
    assert first in s.spill and s.index.owners[first] == 1  # marked, and rank 0 alone holds it
    assert s.replica_depth(first) == len(PREFIX) // 16  # what the recent prompts share: the system prompt
    turn2 = RequestView("turn2", (*history, *range(90_000, 90_016)))
    assert route(p, s, turn2, now_us=3) == 0
    assert route(p, s, prompt(50), now_us=4) != 0  # the prefix itself still gets its replica


def test_common_run_counts_the_leading_blocks_two_prompts_share():
    a = chain_hashes(tuple(range(64)), 16)
    b = chain_hashes((*range(32), *range(100, 132)), 16)
    assert (common_run(a, b), common_run(a, a), common_run(a, ()), common_run(a[:3], a)) == (2, 4, 0, 3)
    assert common_run(chain_hashes(tuple(range(1, 65)), 16), a) == 0


def test_a_replica_is_made_only_for_a_prompt_that_is_mostly_the_hot_prefix():
    """A prompt whose new content outweighs the hot prefix it starts with is priced as the miss it mostly is (by
    cost, with its hit), not sent off as a replica: a replica there pays the whole prompt to copy a small part."""
    p = AsyncdpPolicy(memory_tokens=0)
    s = hot_prefix_state(p, 80)
    assert prompt_hashes(prompt(1), 16)[0] in s.spill
    mostly_new = RequestView("new", (*PREFIX, *range(80_000, 80_000 + 10 * 16)))  # 4 hot blocks, 10 new
    # rank 0: 48 + 224 - 2·64 = 144; an idle rank: 224
    assert route(p, s, mostly_new, now_us=3) == 0


def conversation(user: int, blocks: int = 10) -> RequestView:
    """A new user's first turn (W5's shape): the hot system prompt PREFIX, then ``blocks`` of the user's own
    history, which no rank holds yet; keyed by the user, as an ``X-User-ID`` header would."""
    return RequestView(f"user{user}-0", (*PREFIX, *range(50_000 + user * 1000, 50_000 + user * 1000 + blocks * 16)),
                       routing_key=f"user{user}")


@pytest.mark.parametrize(("name", "spreads"), [("asyncdp", True), ("asyncdp@bound_all", True),
                                              ("asyncdp@hot_held", False)])
def test_new_conversations_after_a_hot_prefix_spread_by_key_instead_of_piling_onto_its_holder(
        name: str, spreads: bool) -> None:
    """A conversation's later turns follow its first, so where its first lands decides where all of them queue. On
    cost the first turn's hit (the system prompt) pulls every new user onto the prefix's holder while the ranks are
    about equally loaded: W5 ended 27, 27 and 10 users on three ranks of eight (mean TTFT 1.33 x ``session_hash``'s
    at 16 req/s). A keyed, mostly new prompt after a hot prefix is placed as a new prompt: its key picks among the
    ranks within ``spread_tokens`` of the cheapest. ``asyncdp@hot_held`` keeps the old rule."""
    p = make_policy(name)  # (asyncdp@bound_all marks no prefix hot: every prefix is, for its bound and this rule)
    assert isinstance(p, AsyncdpPolicy) and p.hot_new is spreads
    p.memory_tokens = 0
    s = hot_prefix_state(p, 80)  # rank 0 holds PREFIX, hot, with 48 tokens of decoding load; ranks 1-3 idle
    ranks = []
    for user in range(8):
        turn = conversation(user)
        ranks.append(route(p, s, turn, now_us=3 + user))
        p.on_finish(s, turn.req_id, ranks[-1], 3 + user)  # each answered before the next user comes
    # on cost rank 0 wins every time: 48 + 224 - 2·64 = 144 against 224 on an idle rank
    assert len(set(ranks)) >= 3 if spreads else ranks == [0] * 8
    again = RequestView("user5-0b", conversation(5).tokens, routing_key="user5")
    if spreads:  # the key decides among the ranks near the cheapest: the same key, the same rank
        assert route(p, s, again, now_us=20) == ranks[5]


def test_a_keyed_new_conversation_avoids_a_rank_busier_than_the_spread_window():
    p = AsyncdpPolicy(memory_tokens=0)
    s = hot_prefix_state(p, 80)
    busy = RequestView("busy", tuple(range(900_000, 900_000 + 40 * 16)))  # 640 tokens waiting on rank 1
    route(p, s, busy, hint=1)
    assert s.base[1] - min(s.base) > 512
    ranks = set()
    for user in range(12):
        ranks.add(rank := route(p, s, conversation(user), now_us=3 + user))
        p.on_finish(s, conversation(user).req_id, rank, 3 + user)
    assert 1 not in ranks and len(ranks) >= 2  # the others share them; the busy one is no candidate


def test_a_keyed_prompt_stays_with_its_holder_where_the_prefix_is_cold_or_the_run_is_most_of_it():
    p = AsyncdpPolicy(memory_tokens=0)
    assert route(p, hot_prefix_state(p, 0), conversation(1), now_us=3) == 0  # the prefix is not hot: its hit decides
    s = hot_prefix_state(p, 80)
    history = (*PREFIX, *range(70_000, 70_000 + 10 * 16))  # a user's history on rank 0, after the hot prefix
    route(p, s, RequestView("turn1", history, routing_key="u"), hint=0)
    p.on_finish(s, "turn1", 0, 2)
    later = RequestView("turn2", (*history, *range(90_000, 90_016)), routing_key="u")
    assert route(p, s, later, now_us=3) == 0  # most of the prompt is held there: the later turn follows


def test_a_later_turn_stays_with_its_history_however_much_new_content_it_brings():
    """Only a first turn is a new conversation: the rule holds where no run deeper than the hot prefix is held
    (``replica_depth``). A second turn that adds more than its history (a long answer, a pasted document) would
    otherwise leave the history's rank as soon as that rank was a few tokens busier than the cheapest."""
    p = AsyncdpPolicy(memory_tokens=0)
    s = hot_prefix_state(p, 80)
    for user in range(16):
        first = conversation(user, blocks=4)
        r1 = route(p, s, first, now_us=3 + user)
        p.on_finish(s, first.req_id, r1, 3 + user)
        other = RequestView(f"o{user}", tuple(range(900_000 + user * 1000, 900_000 + user * 1000 + 40)))
        route(p, s, other, hint=r1)  # 40 tokens of other work on the history's rank meanwhile
        tail = range(700_000 + user * 1000, 700_000 + user * 1000 + 9 * 16)  # 9 new blocks against 8 held
        second = RequestView(f"user{user}-1", (*first.tokens, *tail), routing_key=f"user{user}")
        assert route(p, s, second, now_us=100 + user) == r1
        p.on_finish(s, second.req_id, r1, 100 + user)
        p.on_finish(s, other.req_id, r1, 100 + user)


def test_with_several_routers_a_new_conversation_survives_an_estimate_too_small_to_raise_any_cost():
    """The other routers' unseen work is estimated from this router's own send rate, which decays while it sends
    nothing: a tiny estimate raises no rank's cost (no rank under the level), and the pour's draw has nothing to
    draw from. The rule then picks as with no estimate, instead of an IndexError (an HTTP 500)."""
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(4, router_index=0, num_routers=2, params={"kv_blocks_per_rank": 28_000})
    for k in range(83):  # PREFIX hot on rank 0, and three of its requests decoding there (48 tokens)
        req = prompt(100 + k)
        route(p, s, req, hint=0)
        if k < 80:
            p.on_finish(s, req.req_id, 0, 1)
        else:
            p.on_first_token(s, req.req_id, 0, 2)
    for r in range(4):  # every rank busy: costs near 20 000, where 1e-19 tokens add nothing
        route(p, s, RequestView(f"big{r}", tuple(range(2_000_000 + r * 100_000, 2_020_000 + r * 100_000))), hint=r)
    assert s.base[0] == s.base[1] + 48
    s.snap_at_us, s.send_rate = 0, 1e-25
    assert 0 < s.unseen(500_000) < 1e-15
    assert route(p, s, conversation(1), now_us=500_000) in (1, 2, 3)  # not rank 0: 48 tokens busier


def test_a_cold_prefix_is_not_replicated_however_its_holder_is_loaded():
    p = AsyncdpPolicy(memory_tokens=0)
    s = hot_prefix_state(p, 0)  # three requests in all: a small share of the stream
    assert route(p, s, prompt(50), now_us=3) == 0
    no_replicas = AsyncdpPolicy(memory_tokens=0, replica_headroom=0)
    assert route(no_replicas, hot_prefix_state(no_replicas, 80), prompt(50), now_us=3) == 0
    assert getattr(make_policy("asyncdp@no_replica"), "replica_headroom", None) == 0  # the same, by preset


def test_no_replica_evicts_another_prefix_from_a_full_index():
    p = AsyncdpPolicy(memory_tokens=0)
    s = hot_prefix_state(p, 80, blocks=40)
    for rank in (1, 2, 3):  # fill the other ranks' indexes with 36 of 40 blocks each
        filler = RequestView(f"fill{rank}", tuple(range(20_000 * (rank + 1), 20_000 * (rank + 1) + 36 * 16)))
        route(p, s, filler, hint=rank)
        p.on_finish(s, filler.req_id, rank, 2)
    assert [s.index.size(r) for r in (1, 2, 3)] == [36, 36, 36]
    assert route(p, s, prompt(50), now_us=3) == 0  # 5 more blocks would evict: the hot prefix stays on rank 0


def test_prefix_rates_estimate_the_recent_share_and_stay_bounded():
    rates = PrefixRates(window=16)
    for k in range(2000):
        rates.bump(1 if k % 2 else 10_000 + k)  # every other request starts with block 1; the rest never repeat
    assert rates.share(1) == pytest.approx(0.5, abs=0.05)
    assert rates.share(10_000 + 1998) == pytest.approx(1 / 16, rel=0.1)
    assert rates.share(12345) == 0.0
    assert len(rates.counts) <= 4 * 16 + 1


@pytest.mark.parametrize(("name", "marked"), [("asyncdp", True), ("asyncdp@headroom1.5", False)])
def test_at_dp_8_a_prefix_drawing_a_fourteenth_of_the_requests_gets_a_replica_under_the_default_headroom(
        name: str, marked: bool) -> None:
    """Headroom 2: a prefix wants another holder once it draws more than 1/16 of the requests at dp 8 (each holder
    should carry at most half a rank's share of them); under 1.5 only past 1/12. 1/14 lies between."""
    p = make_policy(name)
    assert isinstance(p, AsyncdpPolicy)
    s = p.init(8)
    for k in range(2000):
        s.rates.bump(1 if k % 14 == 0 else 10_000 + k)
    assert s.rates.share(1) == pytest.approx(1 / 14, rel=0.05)
    s.load[0], s.mean_load = 2.0, 0.0  # its rank past the mean by more than REPLICA_SLACK
    s.mark_spill(1, 0, (1, 2))
    assert (1 in s.spill) is marked


def test_replica_marks_of_prefixes_gone_cold_are_dropped():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(2)
    s.load[0], s.mean_load = 5.0, 0.0  # rank 0 well past the mean: every hot prefix dispatched there is marked
    for first in range(40):  # forty prefixes, each hot in its turn (200 requests), then never seen again
        for _ in range(200):
            s.rates.bump(first)
        s.mark_spill(first, 0, (first,))
        assert first in s.spill
    assert len(s.spill) <= 2 * 2 * REPLICA_HEADROOM + 8  # the old marks went with their share
    assert len(s.runs) <= 2 * 2 * REPLICA_HEADROOM + 8  # and so did their depths
    s.load[0] = 0.0
    s.mark_spill(39, 0, (39,))  # its holder is no longer loaded: unmarked
    assert 39 not in s.spill
