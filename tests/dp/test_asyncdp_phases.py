"""Conformance vectors for asyncdp's policy with prompts no rank holds (asyncdp/dp/asyncdp_policy.py,
``AsyncdpState.phase``): where most recent prompts shared nothing (closed-loop clients out of step), a new prompt
weighs the ranks' loads by phase weights that rotate over the ranks, hand-computed."""

from __future__ import annotations

import pytest

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy, AsyncdpState
from asyncdp.dp.balance import make_policy
from asyncdp.dp.policy import RequestView
from asyncdp.errors import ConfigError
from tests.dp.asyncdp_requests import PREFIX, prompt, route

PERIOD_US = 5_000_000  # PHASE_PERIOD_S


def new_prompt(k: int, length: int = 100) -> RequestView:
    """A prompt that shares no block with any other (W9's kind)."""
    return RequestView(f"n{k}", tuple(range(1_000_000 + 1000 * k, 1_000_000 + 1000 * k + length)))


def unshared(p: AsyncdpPolicy, n: int, epoch: int = 1) -> AsyncdpState:
    """A state whose recent prompts all shared nothing and were all resends of completions (closed-loop clients),
    at the start of ``epoch`` (the phases are set then)."""
    s = p.init(n)
    s.new_share = 1.0
    s.resend_share = 1.0
    s.note_new(True, 0)
    p.on_finish(s, "nobody", 0, epoch * PERIOD_US)  # any hook advances the clock
    return s


def test_new_prompts_weigh_equal_loads_by_the_ranks_phases():
    # epoch 1 at dp 4, spread 0.1: rank i takes the ((i + 1) mod 4)-th of -0.1, -0.033, +0.033, +0.1
    p = AsyncdpPolicy(memory_tokens=0)
    s = unshared(p, 4)
    assert s.phases == pytest.approx([-0.1 / 3, 0.1 / 3, 0.1, -0.1])
    counts = [0] * 4
    for k in range(40):  # a burst of 40 new 100-token prompts, each a closed-loop client's resend, none finished
        p.on_finish(s, "another client's", 0, PERIOD_US)  # the completion it follows (not one of these 40)
        counts[route(p, s, new_prompt(k), now_us=PERIOD_US)] += 1
    # each goes where 100·count·(1 + phase) is least: the counts fall as the phase rises (not 10 each)
    assert counts == [10, 10, 9, 11]
    flat = AsyncdpPolicy(memory_tokens=0, phase_spread=0.0)
    s = unshared(flat, 4)
    assert s.phases == [0.0] * 4
    counts = [0] * 4
    for k in range(40):
        counts[route(flat, s, new_prompt(k), now_us=PERIOD_US)] += 1
    assert counts == [10, 10, 10, 10]
    assert make_policy("asyncdp@no_phase").phase_spread == 0.0


def test_the_phases_rotate_by_one_rank_every_period_so_none_is_favoured_for_long():
    p = AsyncdpPolicy(memory_tokens=0)
    s = unshared(p, 4, epoch=0)
    for rank in range(4):  # one 100-token request pending on every rank: equal loads
        route(p, s, new_prompt(100 + rank), hint=rank)
    firsts = []
    for epoch in range(1, 5):
        now = epoch * PERIOD_US + 1
        p.on_finish(s, "nobody", 0, now)
        firsts.append(route(p, s, new_prompt(epoch), now_us=now))
        p.on_finish(s, f"n{epoch}", firsts[-1], now)
    # the rank with the lowest weight, -0.1, is the one with (i + epoch) mod 4 == 0
    assert firsts == [3, 2, 1, 0]


def test_the_phases_follow_how_many_recent_prompts_shared_nothing():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(4)
    assert s.phases == [0.0] * 4  # no history: new prompts may be the first of groups (W1): balance
    for k in range(600):  # one group's prompts: after its first, every one is held
        route(p, s, prompt(k), now_us=1)
        p.on_finish(s, prompt(k).req_id, 0, 1)
    p.on_finish(s, "nobody", 0, PERIOD_US)  # epoch 1
    assert s.new_share < 0.01 and s.phases == [0.0] * 4
    scales = [0.0]
    for k in range(600):  # then prompts that share nothing: the share of new ones passes 0.5, then 0.9
        route(p, s, new_prompt(k), now_us=PERIOD_US)
        p.on_finish(s, f"n{k}", 0, PERIOD_US)
        if s.phase_scale != scales[-1]:
            scales.append(s.phase_scale)
    assert s.new_share > 0.9
    # in steps of 1/8 from nothing to the full spread: the costs were recomputed a few times, not 600
    assert scales == [x / 8 for x in range(9)]
    assert s.phases == pytest.approx([-0.1 / 3, 0.1 / 3, 0.1, -0.1])


def test_each_of_several_routers_sees_its_share_of_the_new_prompts_as_soon_as_one_router_would():
    # one router of four sends a quarter of the cluster's prompts: 150 of its own are the cluster's 600, after which
    # a single router's share of new prompts passes 0.9 (the test above)
    scales = {}
    for routers, count in ((1, 150), (4, 150), (1, 600)):
        p = AsyncdpPolicy(memory_tokens=0)
        s = p.init(4, 0, routers)
        for k in range(count):
            route(p, s, new_prompt(k), now_us=1)
            p.on_finish(s, f"n{k}", 0, 1)
        scales[routers, count] = s.phase_scale
    assert scales[4, 150] == scales[1, 600] == 1.0
    assert scales[1, 150] < 0.5
    # with very many routers the average still spans 16 of the router's own dispatches: a share, never past 0..1
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(4, 0, 1000)
    shares = []
    for k in range(40):
        route(p, s, new_prompt(k) if k % 2 else prompt(k), now_us=1)
        p.on_finish(s, new_prompt(k).req_id if k % 2 else prompt(k).req_id, 0, 1)
        shares.append(s.new_share)
    assert all(0.0 <= x <= 1.0 for x in shares) and 0.3 < shares[-1] < 0.7


def test_a_prompt_some_rank_holds_compares_loads_without_phases():
    p = AsyncdpPolicy(memory_tokens=0)
    s = unshared(p, 4, epoch=0)
    s.phases = [-0.1, -0.1 / 3, 0.1 / 3, 0.1]  # as set at an epoch's start where nothing is shared
    s.update_all(resum=False)
    for rank in (0, 3):  # the prefix on ranks 0 (phase -0.1) and 3 (+0.1), then 3 gets 1 token less load
        route(p, s, prompt(rank, prefix=PREFIX), hint=rank)
    route(p, s, new_prompt(7, length=99), hint=0)
    route(p, s, new_prompt(8, length=98), hint=3)
    for rank in (1, 2):
        route(p, s, new_prompt(20 + rank, length=400), hint=rank)
    # pending: rank 0 80 + 99, rank 3 80 + 98 (ranks 1, 2: 400): the holders compare 179 and 178 plus the prompt
    # less the hit, unweighted; weighted (161.1 against 195.8) rank 0 would win
    assert route(p, s, prompt(9), now_us=2) == 3
    assert route(p, s, new_prompt(30), now_us=2) == 0  # a new prompt does weigh: 179·0.9 + ... below 178·1.1


def test_the_phase_spread_is_checked():
    with pytest.raises(ConfigError, match="phase_spread"):
        AsyncdpPolicy(phase_spread=1.0)
    with pytest.raises(ConfigError, match="phase_spread"):
        AsyncdpPolicy(phase_period_s=0)


def test_an_open_loop_burst_after_a_quiet_spell_is_split_evenly():
    # The weights are for closed-loop clients, whose resends follow their completions. A burst that follows no
    # completion (open-loop clients, 400 requests from idle in W9@onoff) split by the weights gives the ranks 45 to 55
    # each, and lasts as long as its busiest rank; it is split evenly instead.
    p = AsyncdpPolicy(memory_tokens=0)
    for quiet_s, expected in ((0.0, [10, 10, 9, 11]), (2.0, [10, 10, 10, 10])):
        s = unshared(p, 4)  # the weights in full: closed-loop clients so far
        at = PERIOD_US + int(quiet_s * 1_000_000)  # the last completion was at PERIOD_US
        counts = [0] * 4
        for k in range(40):
            if not quiet_s:
                p.on_finish(s, "another client's", 0, at)  # a resend after each completion, as above
            counts[route(p, s, new_prompt(k), now_us=at)] += 1
        assert counts == expected, quiet_s
    s = unshared(p, 4)
    for k in range(200):  # open-loop arrivals: the share of resends, and the weights with it, go to 0
        route(p, s, new_prompt(k), now_us=PERIOD_US + 2_000_000 + k)
    assert s.resend_share < 0.01 and s.phase_scale == 0.0 and s.phases == [0.0] * 4
    for k in range(200):  # closed-loop clients again: each dispatch follows a completion
        p.on_finish(s, "another client's", 0, PERIOD_US + 3_000_000 + k)
        route(p, s, new_prompt(1000 + k), now_us=PERIOD_US + 3_000_000 + k)
    assert s.resend_share > 0.99 and s.phase_scale == 1.0
