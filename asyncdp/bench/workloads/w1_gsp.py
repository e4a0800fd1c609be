"""W1: generated shared prefix (SGLang ``bench_serving --dataset-name generated-shared-prefix``), spec §4 W1.

G groups × P prompts. A prompt is the group's system segment (S tokens), a 1-token separator shared by every
prompt, and the (group, prompt) question (Q tokens); the output is O tokens. With ``range_ratio`` < 1, S is
drawn per group and Q and O per prompt from U[ratio·L, L]. Requests are shuffled unless ``ordered``.

``zipf_alpha`` (fork-only upstream [unconfirmed]): G·P requests, each drawing its group by Zipf(α) over a seeded
permutation and getting a fresh question. ``send_routing_key``: key ``w1-<seed>_<group>``. ``arrival``: burst
(default, as in SGLang's v0.4 result), poisson at ``rate_rps``, or the relative ladder.

Ideal hit rate, full scale: 15 of each group's 16 prompts hit the 2 048-token system segment: 15·2048 /
(16·2177) = 88.2 %.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncdp.bench.records import Workload
from asyncdp.bench.workloads.common import (
    Builder,
    Options,
    arrival_options,
    as_bool,
    check_scale,
    open_loop,
    optional_float,
    stream,
    uniform_length,
    zipf_picker,
)

_SCALES = {  # G, P, S, Q, O, dp
    "quick": (16, 8, 1024, 64, 32, 4),
    "full": (64, 16, 2048, 128, 256, 8),
    "dp32": (256, 16, 2048, 128, 256, 32),
}


def generate(scale: str, seed: int, options: Mapping[str, Any] | None = None) -> Workload:
    check_scale("w1", scale)
    opts = Options("w1", options, scale)
    g0, p0, s0, q0, o0, dp0 = _SCALES[scale]
    groups = opts.get("groups", g0)
    prompts = opts.get("prompts_per_group", p0)
    s_len, q_len = opts.get("system_len", s0), opts.get("question_len", q0)
    o_len = opts.get("output_len", o0, least=1)
    ratio = opts.get("range_ratio", 1.0)
    ordered = opts.get("ordered", False, as_bool)
    alpha = opts.get("zipf_alpha", None, optional_float)
    keyed = opts.get("send_routing_key", False, as_bool)
    mode, rate = arrival_options(opts, "burst", 16.0)
    dp = opts.get("dp", dp0, least=1)
    opts.expect_requests(groups * prompts, f"groups={groups} x prompts_per_group={prompts}")
    opts.check()

    rng = stream(seed, "w1")
    sys_len = [uniform_length(rng, s_len, ratio) for _ in range(groups)]
    if alpha is None or not groups:  # (no group to draw from: no request)
        pairs = [(g, p) for g in range(groups) for p in range(prompts)]
    else:
        pick = zipf_picker(groups, alpha, rng)
        pairs = [(pick(rng), i) for i in range(groups * prompts)]
    shapes = [(g, p, uniform_length(rng, q_len, ratio), uniform_length(rng, o_len, ratio)) for g, p in pairs]
    if not ordered:
        rng.shuffle(shapes)
    times, arrival = open_loop(len(shapes), mode, rate, stream(seed, "w1/arrivals"))
    b = Builder()
    for (g, p, q, o), t in zip(shapes, times, strict=True):
        b.add(segments=[(f"w1/sys/{g}", sys_len[g]), ("w1/sep", 1), (f"w1/q/{g}/{p}", q)], output_length=o,
              group=f"g{g}", t_arrival_ms=t, client=p, routing_key=f"w1-{seed}_{g}" if keyed else None)
    return b.build(name="w1", scale=scale, seed=seed, options=opts, arrival=arrival, dp_size=dp)
