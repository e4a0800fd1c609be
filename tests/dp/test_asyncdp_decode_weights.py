"""Conformance vectors for the weight of a decoding request in asyncdp's policy (asyncdp/dp/asyncdp_policy.py,
``decode_ref_tokens``): it grows with its prompt, so a long-context decode outweighs several short ones, while
a hit weighs its holder's decodes flat, and no residue is left once the requests finish, hand-computed.

Prompts are 16-token blocks (the policy's block size); the memory term is off (``memory_tokens=0``)."""

from __future__ import annotations

import pytest

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy
from asyncdp.dp.balance import make_policy
from asyncdp.dp.policy import RequestView
from asyncdp.errors import ConfigError
from tests.dp.asyncdp_requests import decode_on, prompt, route


def long_prompt(tail: int, length: int) -> RequestView:
    """A prompt of ``length`` tokens that shares nothing with the others (its first token is ``tail``)."""
    return RequestView(f"long{tail}", (tail, *range(50_000 + tail * 100_000, 50_000 + tail * 100_000 + length - 1)))


def test_a_decoding_request_weighs_more_the_longer_its_prompt():
    p = AsyncdpPolicy()  # the default
    assert [p.decode_weight(n) for n in (1, 4096, 6144, 8192, 16_384, 65_536)] == [16, 16, 24, 32, 64, 64]
    ctx = make_policy("asyncdp@ctx_decode")  # the preset that introduced it, kept as an alias of the default
    assert isinstance(ctx, AsyncdpPolicy) and ctx.decode_ref_tokens == p.decode_ref_tokens
    flat = make_policy("asyncdp@flat_decode")  # every decoding request weighs the same
    assert isinstance(flat, AsyncdpPolicy) and flat.decode_weight(65_536) == 16
    with pytest.raises(ConfigError, match="decode_ref_tokens"):
        AsyncdpPolicy(decode_ref_tokens=-1)


@pytest.mark.parametrize(("ref", "expected"), [(4096.0, 1), (0.0, 0)])
def test_a_long_context_decode_outweighs_several_short_ones(ref, expected):
    # rank 0: one decoding request with a 16 384-token prompt (4·16 = 64 tokens of load; 16 when every decoding
    # request weighs the same); rank 1: three with 80-token prompts (48). A new prompt goes to the lighter one.
    p = AsyncdpPolicy(memory_tokens=0, decode_ref_tokens=ref)
    s = p.init(2)
    decode_on(p, s, long_prompt(1, 16_384), 0)
    for k in range(3):
        decode_on(p, s, prompt(10 + k), 1)
    assert s.base == [16.0, 48.0]  # the cost a hit is weighed against stays flat (next test)
    assert s.hbase == ([64.0, 48.0] if ref else [16.0, 48.0])  # what new prompts and a prefix's holders compare
    assert route(p, s, long_prompt(2, 80), now_us=2) == expected


def test_a_hit_weighs_its_holders_decodes_flat_against_the_cheapest_other_rank():
    # rank 0 holds a 16 384-token prefix and decodes 10 requests with it: 10·1 000 = 10 000 tokens of load flat,
    # 40 000 scaled by their context; the hit saves 2·16 384 = 32 768. Weighed flat the hit stays on its holder;
    # weighed scaled it would leave for the idle rank 1 and pay the whole prompt again. Past capacity every rank
    # is loaded like this, and hits leaving their holders spiral into misses (W2 at full scale, docs).
    p = AsyncdpPolicy(memory_tokens=0, decode_tokens=1000, decode_ref_tokens=4096)
    s = p.init(2)
    doc = long_prompt(1, 16_384).tokens
    for k in range(10):
        decode_on(p, s, RequestView(f"d{k}", (*doc, *range(k * 16, k * 16 + 16))), 0)
    assert s.base[0] == 10_000 and s.hbase[0] == 40_000
    assert route(p, s, RequestView("q", (*doc, *range(900, 916))), now_us=2) == 0


def test_the_decode_weights_leave_no_residue_when_the_requests_finish():
    p = AsyncdpPolicy(memory_tokens=0, decode_ref_tokens=4096)
    s = p.init(2)
    reqs = [long_prompt(k, 4096 + 1000 * k) for k in range(1, 8)]  # weights 16·(5096/4096) ...: inexact floats
    for req in reqs:
        decode_on(p, s, req, 0)
    assert s.dec_tokens[0] == pytest.approx(sum(p.decode_weight(r.prompt_len) for r in reqs))
    for req in reqs:
        p.on_finish(s, req.req_id, 0, 2)
    assert s.dec_tokens == [0.0, 0.0] and s.decoding == [0, 0] and s.base == [0.0, 0.0]
