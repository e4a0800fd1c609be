"""W2: llm-d shared prefix (inference-perf's ``shared_prefix``; llm-d "KV-Cache Wins You Can See"), spec §4 W2.

G groups × U users: each group has one context segment (C tokens), each (group, user) pair one question (Q
tokens); the output is O tokens. Each arrival draws one of the G·U prompts uniformly, with replacement.

Full: G=150, U=5, 6 000/1 200/1 000 tokens, dp 8 with 19 208 blocks of 16 per rank: the working set
150·(6 000 + 5·1 200) = 1.8 M tokens is 73 % of cluster KV (``working_set=0.37``: 75 groups). Arrivals: a
warm-up stage of 15 QPS for 50 s (outside the measure window), then Poisson stages of 30 s [ours: the peer's
durations were not shown] at 3, 10, 15, ... 60 QPS (``stages=20,22,25`` runs the warm-up and those stages only,
to study part of the sweep at a fraction of its cost). Quick: dp 4, 20 × 5 groups, 600/120/100 tokens, 512 blocks
per rank (73 % again), and a 3-rung relative ladder (0.5, 0.85, 1.2 × R_sat [ours]) of 200 requests a rung.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from asyncdp.bench.arrivals import Arrival, Ladder, RelativeLadder, ladder_times_ms, relative_ladder_times
from asyncdp.bench.records import Workload
from asyncdp.bench.workloads.common import Builder, Options, check_scale, stream

STAGES_QPS = (3, 10, 15, 20, 22, 25, 30, 35, 40, 43, 46, 49, 52, 55, 57, 60)
WARMUP = (15.0, 50.0)
QUICK_RUNGS = (0.5, 0.85, 1.2)


def generate(scale: str, seed: int, options: Mapping[str, Any] | None = None) -> Workload:
    check_scale("w2", scale, ("quick", "full"))
    opts = Options("w2", options, scale)
    full = scale == "full"
    default_groups = 150 if full else 20
    if opts.given("groups"):
        opts.skip("working_set", f"it only picks the default of groups ({default_groups} for 0.73, "
                  f"{default_groups // 2} for 0.37), and groups is given")
        groups = opts.get("groups", default_groups, least=1)
    else:
        working_set = opts.choice("working_set", "0.73", ("0.73", "0.37"))
        groups = opts.get("groups", default_groups // (2 if working_set == "0.37" else 1), least=1)
    users = opts.get("users", 5, least=1)
    c_len = opts.get("context_len", 6000 if full else 600)
    q_len = opts.get("question_len", 1200 if full else 120)
    o_len = opts.get("output_len", 1000 if full else 100, least=1)
    if full:
        stage_s = opts.get("stage_s", 30.0, positive=True)
        stages = opts.get("stages", [float(q) for q in STAGES_QPS], _qps_list)
        opts.skip("requests_per_rung", "it sizes the quick scale's ladder (full runs QPS stages, set by stages "
                  "and stage_s)")
        opts.expect_requests(WARMUP[0] * WARMUP[1] + sum(stages) * stage_s, f"stages x stage_s={stage_s:g}")
    else:
        per_rung = opts.get("requests_per_rung", 200)
        for name in ("stages", "stage_s"):
            opts.skip(name, "it sets the full scale's QPS stages (quick runs a ladder of 3 rungs relative to "
                      "R_sat, of requests_per_rung requests each)")
        opts.expect_requests(per_rung * len(QUICK_RUNGS), f"requests_per_rung={per_rung}")
    opts.check()

    arrivals_rng = stream(seed, "w2/arrivals")
    arrival: Arrival
    if full:
        arrival = Ladder(rungs=(WARMUP, *((float(q), stage_s) for q in stages)))
        times = ladder_times_ms(arrival.rungs, arrivals_rng)
        warmup_ms = WARMUP[1] * 1000.0
    else:
        arrival = RelativeLadder(fractions=QUICK_RUNGS, requests_per_rung=(per_rung,) * len(QUICK_RUNGS))
        times = relative_ladder_times(arrival, arrivals_rng)
        warmup_ms = 0.0
    rng = stream(seed, "w2")
    b = Builder()
    for t, rung in times:
        g, u = rng.randrange(groups), rng.randrange(users)
        b.add(segments=[(f"w2/ctx/{g}", c_len), (f"w2/q/{g}/{u}", q_len)], output_length=o_len,
              group=f"g{g}", t_arrival_ms=t, client=u, turn=rung)
    return b.build(name="w2", scale=scale, seed=seed, options=opts, arrival=arrival, dp_size=8 if full else 4,
                   kv_blocks_per_rank=19_208 if full else 512, warmup_ms=warmup_ms,
                   notes="turn = ladder rung index (0 = warm-up at full scale)")


def _qps_list(value: Any) -> list[float]:
    """``stages``: a comma-separated list of finite positive rates in QPS (or a sequence of them); a list, as the
    workload file stores it."""
    items = value.split(",") if isinstance(value, str) else list(value)
    qps = [float(x) for x in items]
    if not qps or any(not 0 < q < math.inf for q in qps):
        raise ValueError(value)
    return qps
