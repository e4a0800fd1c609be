"""W6: ShareGPT-like traffic with little sharing, spec §4 W6 (and the short requests of W8).

Input lengths are log-normal, median 256 tokens and σ 1.0, clipped to [8, 8 192]; outputs log-normal, median
192 and σ 0.8, clipped to [4, 2 048] (both fits [ours]). Every prompt begins with the same 32-token template (2
blocks of 16), a trap for low-threshold affinity rules: the prompt is the template and a unique body of
``max(1, L - 32)`` tokens, so prompts drawn shorter than 33 tokens are 33 long [ours]. Arrival: the relative
ladder (or ``arrival=burst|poisson``). Full: 10 000 requests at dp 8; dp32: 50 000 at dp 32; quick: 500 at dp 4.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from asyncdp.bench.records import Workload
from asyncdp.bench.workloads.common import (
    Builder,
    Options,
    arrival_options,
    check_scale,
    lognormal_int,
    open_loop,
    stream,
)

TEMPLATE_LEN = 32
_SCALES = {"quick": (500, 4), "full": (10_000, 8), "dp32": (50_000, 32)}


def short_request(rng: random.Random, index: int, prefix: str = "w6") -> tuple[list[tuple[str, int]], int]:
    """One ShareGPT-like request: its segments (template, body) and its output length."""
    length = lognormal_int(rng, 256, 1.0, 8, 8192)
    output = lognormal_int(rng, 192, 0.8, 4, 2048)
    return [(f"{prefix}/template", TEMPLATE_LEN), (f"{prefix}/body/{index}", max(1, length - TEMPLATE_LEN))], output


def generate(scale: str, seed: int, options: Mapping[str, Any] | None = None) -> Workload:
    check_scale("w6", scale)
    opts = Options("w6", options, scale)
    n0, dp0 = _SCALES[scale]
    n = opts.get("num_requests", n0)
    dp = opts.get("dp", dp0, least=1)
    mode, rate = arrival_options(opts, "ladder", 16.0)
    opts.expect_requests(n, f"num_requests={n}")
    opts.check()
    rng = stream(seed, "w6")
    times, arrival = open_loop(n, mode, rate, stream(seed, "w6/arrivals"))
    b = Builder()
    for i, t in enumerate(times):
        segments, output = short_request(rng, i)
        b.add(segments=segments, output_length=output, group="short", t_arrival_ms=t, client=i)
    return b.build(name="w6", scale=scale, seed=seed, options=opts, arrival=arrival, dp_size=dp)
