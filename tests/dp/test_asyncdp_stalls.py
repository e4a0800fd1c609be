"""Conformance vectors for asyncdp's stall term (asyncdp/dp/asyncdp_policy.py, ``stall_tokens_per_s``,
``stall_grace_s``): hits leave a rank whose requests wait past the grace for their first token, until that
token comes; a backlog on every rank is no stall; the term is off by default and on in the ``asyncdp@stall``
preset, hand-computed.

Prompts are 16-token blocks (the policy's block size); the memory term is off (``memory_tokens=0``)."""

from __future__ import annotations

import pytest

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy, AsyncdpState
from asyncdp.dp.balance import make_policy
from asyncdp.errors import ConfigError
from tests.dp.asyncdp_requests import prompt, route


def _stalling(rate: float = 16384.0) -> tuple[AsyncdpPolicy, AsyncdpState]:
    p = AsyncdpPolicy(memory_tokens=0, phase_spread=0, stall_tokens_per_s=rate, stall_grace_s=2.0)
    s = p.init(4)
    first = prompt(1)
    route(p, s, first, hint=0)  # the prefix is on rank 0
    p.on_first_token(s, first.req_id, 0, 1)
    return p, s


def test_hits_leave_a_rank_whose_requests_wait_past_the_grace_for_their_first_token():
    p, s = _stalling()
    stuck = prompt(2)
    assert route(p, s, stuck, now_us=10) == 0  # a hit: pending 16 tokens there
    assert route(p, s, prompt(3), now_us=2_000_000) == 0  # waited 2 s: within the grace
    assert s.stalls.terms == [0.0] * 4
    # 3.5 s: 1.5 s past the grace, 24 576 tokens at 16 384 a second; the hit saves 2·64
    p.on_first_token(s, "nobody", 0, 3_500_000)  # any hook refreshes the stall terms
    assert route(p, s, prompt(4), now_us=3_500_010) == 1
    assert s.stalls.terms[0] == pytest.approx(1.5 * 16384, rel=1e-3) and s.stalls.terms[1:] == [0.0] * 3


def test_a_stall_ends_with_the_first_token_of_the_request_that_waited():
    p, s = _stalling()
    stuck = prompt(2)
    route(p, s, stuck, now_us=10)
    p.on_first_token(s, "nobody", 0, 3_000_000)  # a hook at 3 s: rank 0 stalls
    assert s.stalls.terms[0] > 0
    p.on_first_token(s, stuck.req_id, 0, 3_100_000)
    assert s.stalls.terms == [0.0] * 4
    assert route(p, s, prompt(3), now_us=3_200_000) == 0


def test_a_backlog_on_every_rank_is_no_stall_of_any():
    """Overload: half the ranks or more have a request waiting past the grace. Moving hits off them would replicate
    their prefixes onto the few ranks left, evicting others, into a spiral of misses: no stall counts."""
    p, s = _stalling()
    route(p, s, prompt(2), now_us=10)  # rank 0
    route(p, s, prompt(3, prefix=tuple(range(5000, 5064))), now_us=2_000_000, hint=1)  # rank 1, 2 s younger
    p.on_first_token(s, "nobody", 0, 5_000_000)
    assert s.stalls.terms == [0.0] * 4
    assert route(p, s, prompt(4), now_us=5_000_010) == 0


def test_the_stall_term_is_off_by_default():
    p = AsyncdpPolicy()
    s = p.init(4)
    route(p, s, prompt(2), now_us=10)
    route(p, s, prompt(3), now_us=60_000_000)
    assert s.stalls.terms == [0.0] * 4 and not any(s.stalls.waiting)


def test_the_stall_preset_turns_the_term_on_and_bad_values_are_refused():
    p = make_policy("asyncdp@stall")
    assert isinstance(p, AsyncdpPolicy)
    assert p.stall_tokens_per_s == 16384.0 and p.stall_grace_us == 1_000_000
    with pytest.raises(ConfigError):
        AsyncdpPolicy(stall_tokens_per_s=-1.0)
