"""W8: token-skew stress, spec §4 W8.

Short requests as in W6; a fraction ``long_fraction`` (0.02; exactly that share, at seeded places) are long prompts of 55 000 tokens (quick: 16 000)
with 1 output token, the token-balancing case of vllm-project/vllm#40795. Arrivals: Poisson at 0.7·R_sat (a
one-rung relative ladder). ``group`` is ``short`` or ``long``, for the short requests' p99 TTFT.

``preset=pure_long``: every prompt long, its length drawn from U[1 k, 55 k] (quick: U[1 k, 16 k]), outputs as
W6 [ours]. ``preset=32k_in_1_out``: every request 32 000 tokens in (quick: 16 000), 1 out
(smg-project/smg#1714). Full: 5 000 requests (200 for 32k_in_1_out) [ours]; quick: 500 (100) at dp 4.
``max_model_len`` is 65 536 (≥ 56 k).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncdp.bench.arrivals import RelativeLadder, relative_ladder_times
from asyncdp.bench.records import Workload
from asyncdp.bench.workloads.common import Builder, Options, check_scale, stream
from asyncdp.bench.workloads.w6_sharegpt import short_request

LONG_FRACTION = 0.02
PURE_LONG_MIN = 1000  # @pure_long draws its lengths from U[1 000, long_len]


def generate(scale: str, seed: int, options: Mapping[str, Any] | None = None) -> Workload:
    check_scale("w8", scale, ("quick", "full"))
    opts = Options("w8", options, scale)
    full = scale == "full"
    preset = opts.choice("preset", "default", ("default", "pure_long", "32k_in_1_out"))
    one_shape = preset == "32k_in_1_out"
    n = opts.get("num_requests", (200 if one_shape else 5000) if full else (100 if one_shape else 500))
    pure = preset == "pure_long"
    long_len = opts.get("long_len", (32_000 if one_shape else 55_000) if full else 16_000,
                        least=PURE_LONG_MIN if pure else 1)
    fraction = LONG_FRACTION
    if preset == "default":
        fraction = opts.get("long_fraction", LONG_FRACTION, most=1.0)
    else:
        opts.skip("long_fraction", f"it is the share of long prompts, and preset {preset} makes them all long")
    dp = opts.get("dp", 8 if full else 4, least=1)
    rung = opts.get("rate_fraction", 0.7, positive=True)
    opts.expect_requests(n, f"num_requests={n}")
    opts.check()

    rng = stream(seed, "w8")
    arrival = RelativeLadder(fractions=(rung,), requests_per_rung=(n,), reference=rung)
    times = relative_ladder_times(arrival, stream(seed, "w8/arrivals"))
    long_at = set(rng.sample(range(n), round(fraction * n)))
    b = Builder()
    for i, (t, _) in enumerate(times):
        if pure:
            segments, output = short_request(rng, i, "w8")
            segments, group = [(f"w8/long/{i}", rng.randint(PURE_LONG_MIN, long_len))], "long"
        elif one_shape or i in long_at:
            segments, output, group = [(f"w8/long/{i}", long_len)], 1, "long"
        else:
            segments, output = short_request(rng, i, "w8")
            group = "short"
        b.add(segments=segments, output_length=output, group=group, t_arrival_ms=t, client=i)
    return b.build(name="w8", scale=scale, seed=seed, options=opts, arrival=arrival, dp_size=dp,
                   max_model_len=65_536)
