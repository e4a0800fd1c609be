"""Several API servers under asyncdp's policy: the other routers' work no snapshot shows yet (``AsyncdpState.unseen``,
poured over the cheapest ranks by ``CostOrder.level``), and no prefix claims while the phase weights hold in full.

Between two snapshots every router decides from the same picture of the others' work; each knows its own requests
exactly but not the ones the other R - 1 routers sent since. Priced at nothing, that work lands, in every router's
view, on the snapshot's cheapest rank, and all of them send there (routing-bench H7)."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from asyncdp.dp.asyncdp_policy import REFRESH_US, UNSEEN_REQUEST_TOKENS, AsyncdpPolicy, AsyncdpState
from asyncdp.dp.balance import make_policy
from asyncdp.dp.owner_index import prompt_hashes
from asyncdp.dp.policy import RankLoad, RequestView, Snapshot
from asyncdp.dp.ties import pick_among, tie_scan
from asyncdp.dp.unseen import SEND_RATE_TAU_US, UNSEEN_MAX_AGE_US, CostOrder
from asyncdp.errors import ConfigError

INF = float("inf")
PERIOD_US = 100_000  # the coordinator's publish interval


TEMPLATE = tuple(range(32))  # two blocks every prompt of W6 begins with


def request(n: int, tokens: int = 200, router: int = 0, template: bool = False,
            hint: int | None = None) -> RequestView:
    base = 1_000_000 * (router + 1) + 1000 * n
    head = TEMPLATE if template else ()
    return RequestView(f"q{router}-{n}", (*head, *range(base, base + tokens - len(head))), routing_key=f"u{router}-{n}",
                       rank_hint=hint)


def snapshot(running: list[int], at_us: int) -> Snapshot:
    return Snapshot(tuple(RankLoad(0, r, 0.0) for r in running), delivered_at_us=at_us)


def send(p: AsyncdpPolicy, s: AsyncdpState, req: RequestView, now_us: int) -> int:
    d = p.select(req, None, s, now_us, random.Random(0))
    p.on_dispatch(s, req, d, now_us)
    return d.dp_rank


def steady(p: AsyncdpPolicy, s: AsyncdpState, router: int, periods: int) -> int:
    """One 200-token request a period, each finished before the next snapshot (which shows every rank idle);
    returns the time of the last snapshot."""
    n = s.n
    for k in range(periods):
        t = k * PERIOD_US
        p.on_snapshot(s, snapshot([0] * n, t))
        req = request(k, router=router)
        rank = send(p, s, req, t + PERIOD_US // 2)
        p.on_finish(s, req.req_id, rank, t + PERIOD_US // 2 + 1)
    last = periods * PERIOD_US
    return last


def water_level(values: list[float], amount: float) -> float:
    return CostOrder(values, values).level(amount)[0]


def test_the_water_level_pours_an_amount_over_the_lowest_values():
    assert water_level([0.0, 10.0, 30.0], 15.0) == 12.5  # 12.5 + 2.5
    assert water_level([0.0, 10.0, 30.0], 0.0) == 0.0
    assert water_level([30.0, 0.0, 10.0], 100.0) == pytest.approx(140.0 / 3)  # over all three, in any order
    assert water_level([0.0, 0.0, 0.0, 0.0], 40.0) == 10.0
    assert water_level([5.0, INF], 7.0) == 12.0  # a dead rank takes nothing
    assert water_level([INF, INF], 1.0) == INF


def test_a_band_of_tied_ranks_is_picked_from_with_equal_odds():
    # ranks 2-5 tie at the minimum; the scan from key mod 8 gives rank 2 every start from 6 through 2 (5 of 8), the
    # pick about a quarter of the keys each
    costs = [9.0, 9.0, 1.0, 1.0, 1.0, 1.0, 9.0, 9.0]
    assert Counter(tie_scan(costs, 1.0, 2, key) for key in range(8)) == Counter({2: 5, 3: 1, 4: 1, 5: 1})
    rng = random.Random(7)
    keys = [rng.getrandbits(64) for _ in range(4000)]  # 64-bit keys, as tie_key makes them
    picks = Counter(pick_among([2, 3, 4, 5], key) for key in keys)
    assert set(picks) == {2, 3, 4, 5} and all(900 <= c <= 1100 for c in picks.values())
    assert all(pick_among([2, 3, 4, 5], k) == pick_among([2, 3, 4, 5], k) for k in keys[:10])  # stable for a key


def test_a_band_the_unseen_work_levelled_is_picked_from_in_proportion_to_the_pour():
    # level 10 over costs 0, 5 and 10: rank 0 took 10 of the pour, rank 1 5, rank 2 none
    rng = random.Random(3)
    keys = [rng.getrandbits(64) for _ in range(3000)]
    picks = Counter(pick_among([0, 1, 2], key, [0.0, 5.0, 10.0], 10.0) for key in keys)
    assert set(picks) == {0, 1} and 1850 <= picks[0] <= 2150  # two thirds
    assert Counter(pick_among([0, 1, 2], key) for key in range(3000)) == Counter({0: 1000, 1: 1000, 2: 1000})
    assert pick_among([4, 6], 5, [0.0] * 8, 0.0) == 6  # nothing poured: equal odds, the key mod count-th
    assert pick_among([1, 2], 5) == 2


def test_the_send_rate_averages_what_this_router_sent_between_snapshots():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(8, 0, 4)
    assert s.unseen(0) == 0.0  # no snapshot yet
    last = steady(p, s, 0, 60)  # 6 s of one request a period
    # each request is 200 uncached tokens and one decode weight (16): 216 tokens a period, folded in with the
    # weight 1 - exp(-period/tau) per period, from 0
    per_us = 216 / PERIOD_US
    alpha = 1 - math.exp(-PERIOD_US / SEND_RATE_TAU_US)
    p.on_snapshot(s, snapshot([0] * 8, last))  # the 60th period's request folds in too
    assert s.send_rate == pytest.approx(per_us * (1 - (1 - alpha) ** 60))
    # the other three routers' work since that snapshot: 3 x the rate x its age, the age counted up to 1 s
    assert s.unseen(last + 50_000) == pytest.approx(3 * s.send_rate * 50_000)
    assert s.unseen(last + 5 * UNSEEN_MAX_AGE_US) == pytest.approx(3 * s.send_rate * UNSEEN_MAX_AGE_US)
    # a quiet period (a heartbeat 5 s later with nothing sent) brings the rate down
    before = s.send_rate
    p.on_snapshot(s, snapshot([0] * 8, last + 5_000_000))
    assert s.send_rate == pytest.approx(before * math.exp(-5_000_000 / SEND_RATE_TAU_US))


def test_a_long_prompt_counts_in_the_send_rate_as_a_typical_one_at_most():
    # the pour spreads the others' work like water; a 20 000-token prompt lands on one rank, so it counts
    # UNSEEN_REQUEST_TOKENS, not 20 000 (W8 at R = 4: its 55 000-token prompts raised the level over every rank)
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(8, 0, 4)
    p.on_snapshot(s, snapshot([0] * 8, 0))
    send(p, s, request(1, tokens=20_000), 10)
    assert s.sent_tok == UNSEEN_REQUEST_TOKENS
    send(p, s, request(2, tokens=100), 20)
    assert s.sent_tok == UNSEEN_REQUEST_TOKENS + 100 + 16  # 100 uncached tokens and a decode weight


def test_one_router_sees_no_unseen_work():
    p = AsyncdpPolicy(memory_tokens=0)
    s = p.init(8)
    last = steady(p, s, 0, 20)
    assert s.send_rate > 0
    assert s.unseen(last + 50_000) == 0.0


def burst(unseen_fill: float, template: bool = False, trial: int = 0, sends: int = 2,
          fill_new: bool = True) -> Counter[int]:
    """Four routers, 8 ranks, each router with 20 periods of steady traffic behind it, then one snapshot that
    shows ranks 0-7 with 0-7 running requests (the cheapest, rank 0, by 16 tokens), and 50 ms later each router
    sends two 200-token requests: where the eight requests go. (No memory term, phase weights or spread by prefix
    count: the costs are the loads alone.) ``template``: every prompt begins with two blocks every rank holds (W6),
    so the choice is among holders, each with the same credit. ``fill_new``: the estimate is poured for new prompts
    too (``asyncdp@fill``; the default pours it only for prompts a rank holds)."""
    p = AsyncdpPolicy(memory_tokens=0, phase_spread=0, spread=False, unseen_fill=unseen_fill, fill_new=fill_new)
    where: Counter[int] = Counter()
    for router in range(4):
        s = p.init(8, router, 4, {"kv_blocks_per_rank": 10_000})
        if template:
            for r in range(8):
                req = request(200 + r, router=router, template=True, hint=r)
                p.on_finish(s, req.req_id, send(p, s, req, 0), 0)
            assert s.index.owners[prompt_hashes(request(0, template=True), 16)[0]] == (1 << 8) - 1  # all 8
        last = steady(p, s, router, 20)
        p.on_snapshot(s, snapshot(list(range(8)), last))
        for k in range(sends):
            req = request(100 + 10 * trial + k, router=router, template=template)
            where[send(p, s, req, last + 50_000)] += 1
    return where


@pytest.mark.parametrize("template", [False, True], ids=["new-prompts", "held-template"])
def test_four_routers_spread_the_requests_they_send_between_two_snapshots(template: bool):
    # Without the estimate, each router sends its first request to the snapshot's cheapest rank and its second to
    # the next one (its own first request is exact): all four do the same, 4 requests on each of ranks 0 and 1.
    for trial in range(10):
        assert burst(0.0, template, trial) == Counter({0: 4, 1: 4})
    # With it, each router pours the others' estimated work (3 x 216 tokens a period, half a period old, 63 % of it
    # learnt in 20 periods) over the cheapest ranks: ranks 0-4 rise to one level (rank 5 joins once the router's
    # own first request is on one of them) and each request's own key picks among them with odds in proportion to
    # the share of the pour each took, most for the cheapest. Over ten bursts (other requests, other keys):
    bursts = [burst(1.0, template, trial) for trial in range(10)]
    assert all(sum(b.values()) == 8 for b in bursts)
    totals = sum(bursts, Counter())
    assert set(totals) == set(range(6))  # the level stops below ranks 6 and 7
    assert [totals[r] for r in range(6)] == sorted(totals.values(), reverse=True)  # the cheaper, the more
    assert sum(len(b) for b in bursts) >= 30  # at least 3 ranks a burst on average (2 without)
    assert sum(max(b.values()) >= 4 for b in bursts) <= 6  # 4 on one rank in every burst without


def test_a_prompt_every_rank_holds_alike_goes_where_a_new_one_would():
    # Equal credit on every rank: the choice is by load alone, and among the ranks the unseen work levelled the same
    # key picks the same rank on both paths (the holders' loop and the cheapest by load). (Each router's first
    # request: after it, the template's credit makes the two states differ.)
    for trial in range(10):
        assert burst(1.0, True, trial, sends=1) == burst(1.0, False, trial, sends=1)


def test_by_default_the_estimate_is_poured_for_held_prompts_and_new_ones_are_placed_without_it():
    # W6's prompts share a template every rank holds: the others' unseen work spreads them (as in the test above).
    # A prompt no rank holds is a new prefix, placed where the snapshot and this router's own work say, as without
    # the estimate: where the pour put new prefixes, among the ranks it levelled, W2's edge of capacity and W7 paid
    # (docs/benchmarks.md, "asyncdp@fill on W2 and W3"; the same W6 gain, 1.27-1.29 x R = 1's against 1.54-1.55 x).
    for trial in range(10):
        assert burst(1.0, False, trial, fill_new=False) == Counter({0: 4, 1: 4})
    held = [burst(1.0, True, trial, fill_new=False) for trial in range(10)]
    assert held == [burst(1.0, True, trial) for trial in range(10)]  # the pour, as asyncdp@fill pours it
    assert sum(len(b) for b in held) >= 30


def phased_burst(routers: int, trial: int) -> tuple[Counter[int], int]:
    """``routers`` routers, 4 equally loaded ranks, every recent prompt new (W9: the phase weights in full), and 50 ms
    after a snapshot each router sends one new prompt: where they go, and the rank the phases favour."""
    p = AsyncdpPolicy(memory_tokens=0, spread=False)
    where: Counter[int] = Counter()
    favoured = -1
    for router in range(routers):
        s, last = phased_router(p, router, routers, 4, running=4)
        favoured = min(range(4), key=s.phases.__getitem__)
        where[send(p, s, request(100 + 10 * trial, router=router), last + 50_000)] += 1
    return where, favoured


def phased_router(p: AsyncdpPolicy, router: int, routers: int, n: int, running: int) -> tuple[AsyncdpState, int]:
    """Router ``router`` of ``routers`` over ``n`` ranks after a steady spell, every recent prompt new (the phase
    weights in full, as for closed-loop clients: every recent dispatch a resend), and a snapshot showing ``running``
    requests on every rank; with that snapshot's time."""
    s = p.init(n, router, routers, {"kv_blocks_per_rank": 10_000})
    last = steady(p, s, router, 20)
    s.new_share, s.phase_scale, s.resend_share = 1.0, 1.0, 1.0
    s.phases = [s.phase(i) for i in range(n)]
    p.on_snapshot(s, snapshot([running] * n, last))
    return s, last


def test_several_routers_draw_a_new_prompt_among_the_near_cheapest_while_the_phases_hold():
    # The phases give every router the same preference among equally loaded ranks, and each sees only its own sends
    # until the next snapshot: sixteen routers sending one new prompt each would all send it to the rank the phases
    # favour (W9 with 16 API servers over 4 ranks read 0.1064 s against 0.0893 s without the weights; 0.0344 s with
    # the draw). The request's key draws among the ranks within its length of the cheapest instead.
    for trial in range(5):
        where, _ = phased_burst(16, trial)
        assert sum(where.values()) == 16 and len(where) == 4 and max(where.values()) <= 8
    # one router sees its own sends: the rank the phases favour, as before
    for trial in range(5):
        where, favoured = phased_burst(1, trial)
        assert where == Counter({favoured: 1})


def blind_burst(routers: int, per_router: int, n: int = 8, mirror: bool = True) -> tuple[list[int], list[AsyncdpState]]:
    """``routers`` routers over ``n`` ranks, the phase weights in full, the directory's last answer counting the
    others' new prompts equally on every rank (60 000 tokens each), then each router sends ``per_router`` new
    1 000-token prompts before the next snapshot, each a closed-loop client's resend after a completion (W9): the
    prompts per rank, and the routers' states."""
    p = AsyncdpPolicy(memory_tokens=0, spread=False, mirror=mirror)
    counts, states = [0] * n, []
    for router in range(routers):
        s, last = phased_router(p, router, routers, n, running=0)
        p.on_prefix_owner(s, None, (), 0, [60_000.0] * n)
        for k in range(per_router):
            p.on_finish(s, "another client's", 0, last + 50_000)
            counts[send(p, s, request(100 + k, tokens=1000, router=router), last + 50_000)] += 1
        states.append(s)
    return counts, states


def test_a_router_counts_the_others_new_prompts_as_mirroring_its_own_until_the_next_snapshot():
    # New prompts are not claimed while the phases hold in full, so in a burst no router sees the others' new prompts
    # until the next snapshot, and they all see the same loads and phases. Counting only its own, each of 16 routers
    # sent its 17 prompts where the phases favour: 111, 77, 55 and 28 of the 272 on four of the eight ranks, none on
    # the rest (W9 at full scale with 16 API servers: 184 of the first 800 prompts on one rank, 68 on the least
    # favoured). Each counts R - 1 more where it sends one, weighed by the rank's phase.
    counts, states = blind_burst(16, 17)
    mean = sum(counts) / len(counts)
    assert sum(counts) == 272 and max(counts) <= 1.5 * mean and min(counts) >= 0.5 * mean
    herded, _ = blind_burst(16, 17, mirror=False)  # asyncdp@no_mirror: as before
    assert max(herded) > 3 * mean and herded.count(0) >= 3
    assert getattr(make_policy("asyncdp@no_mirror"), "mirror", None) is False
    s = states[0]
    assert sum(s.mirror) == 15 * 17 * 1000  # every one of its prompts, fifteen times
    # the next snapshot shows the others' work: the mirror goes
    p = AsyncdpPolicy(memory_tokens=0, spread=False)
    p.on_snapshot(s, snapshot([0] * 8, s.clock_us + 50_000))
    assert s.mirror == [0.0] * 8
    # one router sees all it sends: nothing mirrored, its burst follows the phases as before
    counts, states = blind_burst(1, 272)
    assert states[0].mirror == [0.0] * 8
    assert counts == sorted(counts, reverse=True) and counts[0] > 1.5 * counts[-1]


def test_the_mirror_is_dropped_when_no_snapshot_came_for_a_second():
    _, states = blind_burst(4, 5)
    s = states[0]
    assert sum(s.mirror) > 0
    s.tick(s.clock_us + UNSEEN_MAX_AGE_US // 2)
    assert sum(s.mirror) > 0  # a snapshot half a second old still stands
    s.tick(s.snap_at_us + UNSEEN_MAX_AGE_US + REFRESH_US)
    assert s.mirror == [0.0] * 8 and s.mbase == s.mcosts(s.base, s.hbase)


def test_unseen_fill_must_not_be_negative():
    with pytest.raises(ConfigError, match="unseen_fill"):
        AsyncdpPolicy(unseen_fill=-1.0)
    fill, default, off = make_policy("asyncdp@fill"), make_policy("asyncdp"), make_policy("asyncdp@no_fill")
    assert (getattr(fill, "unseen_fill", None), getattr(fill, "fill_new", None)) == (1.0, True)
    assert (getattr(default, "unseen_fill", None), getattr(default, "fill_new", None)) == (1.0, False)
    assert getattr(off, "unseen_fill", None) == 0.0


def test_new_prompts_are_not_claimed_while_the_phase_weights_hold_in_full():
    # Closed-loop clients with prompts that never recur (W9): the phase weights keep ranks a few per cent apart so
    # the clients fall out of step. With several API servers each new prompt used to be claimed, and the
    # directory's placement by the others' recent new-prefix tokens undid the weights.
    for name, claims_in_phase in (("asyncdp", False), ("asyncdp@claim_all", True)):
        p = make_policy(name)
        assert isinstance(p, AsyncdpPolicy)
        s = p.init(4, 0, 4)
        first = request(0)
        assert p.claim_hashes(s, first)  # a new prompt, most recent prompts not (yet) new
        for k in range(1, 600):  # every prompt new, each a resend after a completion: the share of new prompts goes to 1
            p.on_finish(s, "another client's", 0, k)
            send(p, s, request(k), k)
        assert s.phase_scale == 1.0
        assert bool(p.claim_hashes(s, request(1000))) is claims_in_phase


def test_a_decayed_copy_of_the_costs_is_what_the_hooks_keep_at_that_weight():
    # When no hook ran for a while, select prices the ranks on decayed copies of the costs (H5); they must be what the
    # hooks recompute at the same weight, miss costs included: the phases, the mirror, the decodes weighed by their
    # context and a dead rank's infinity.
    p = AsyncdpPolicy(memory_tokens=0, spread=False)
    s, last = phased_router(p, 0, 4, 8, running=3)
    long = request(1, tokens=8192)
    p.on_first_token(s, long.req_id, send(p, s, long, last + 1000), last + 2000)
    for k in range(5):
        send(p, s, request(100 + k, tokens=1000), last + 3000)
    p.on_rank_dead(s, 7)
    assert any(s.mirror) and any(s.extra) and any(s.phases) and all(s.remote[:7])
    at = s.refresh_due_us + 1
    decayed = s.decayed_costs(at)
    assert decayed is not None and decayed[0] != s.base
    s.tick(at)
    assert decayed == (s.base, s.hbase, s.mbase) and s.mbase[7] == math.inf
