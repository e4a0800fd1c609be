"""W9: bursty closed loop (guidellm concurrency mode; llm-d/llm-d-router#298), spec §4 W9.

c clients, each resending as soon as its previous request completes, with ISL = OSL and no shared tokens:
identical lengths make completions arrive together, so the resends come in bursts. Full: c=800, ISL=OSL=1 000,
dp 8, 300 s of virtual time (``duration_s``: nothing is sent after it); dp32: c=3 200 at dp 32; quick: c=64,
ISL=OSL=128, 60 s. Each client's chain is ``requests_per_client`` long, by default enough for the run if every
request took its OSL decode steps at 3 ms each (the cheapest step of the spec's profiles) [ours]; a simulator
that exhausts a chain before ``duration_s`` must say so. Records are ordered round by round.

``preset=onoff``: open loop instead, every 30 s a burst of ``burst_size`` requests (400; quick 100 [ours])
arriving uniformly within 100 ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from asyncdp.bench.arrivals import Arrival, Closed, Trace
from asyncdp.bench.records import DEADLINE_S, Workload
from asyncdp.bench.workloads.common import Builder, Options, check_scale, stream

_SCALES = {"quick": (64, 128, 60.0, 4), "full": (800, 1000, 300.0, 8), "dp32": (3200, 1000, 300.0, 32)}
MIN_STEP_S = 0.003
BURST_EVERY_S = 30.0
BURST_WINDOW_MS = 100.0


def generate(scale: str, seed: int, options: Mapping[str, Any] | None = None) -> Workload:
    check_scale("w9", scale)
    opts = Options("w9", options, scale)
    c0, len0, dur0, dp0 = _SCALES[scale]
    preset = opts.choice("preset", "default", ("default", "onoff"))
    onoff = preset == "onoff"
    length = opts.get("length", len0, least=1)
    duration_s = opts.get("duration_s", dur0, positive=True, most=DEADLINE_S)
    dp = opts.get("dp", dp0, least=1)
    if onoff:
        burst = opts.get("burst_size", 100 if scale == "quick" else 400)
        for name in ("clients", "requests_per_client"):
            opts.skip(name, "it shapes the closed loop, and preset onoff is open loop (burst_size requests every "
                      "30 s)")
        opts.expect_requests(math.ceil(duration_s / BURST_EVERY_S) * burst, f"burst_size={burst} every "
                             f"{BURST_EVERY_S:g} s for duration_s={duration_s:g}")
    else:
        clients = opts.get("clients", c0)
        per_client = opts.get("requests_per_client", math.ceil(duration_s / (length * MIN_STEP_S)))
        opts.skip("burst_size", "it sizes the bursts of preset onoff (w9@onoff)")
        opts.expect_requests(clients * per_client, f"clients={clients} x requests_per_client={per_client}" +
                             ("" if opts.given("requests_per_client") else f" (from duration_s={duration_s:g})"))
    opts.check()
    b = Builder()
    arrival: Arrival
    if onoff:
        rng = stream(seed, "w9/arrivals")
        times = []
        for k in range(math.ceil(duration_s / BURST_EVERY_S)):
            start = k * BURST_EVERY_S * 1000.0
            times.extend(sorted(round((start + rng.random() * BURST_WINDOW_MS) * 1000.0) / 1000.0
                                for _ in range(burst)))
        for i, t in enumerate(times):
            b.add(segments=[(f"w9/p/{i}", length)], output_length=length, group="burst", t_arrival_ms=t, client=i)
        arrival = Trace(speed=1.0)
    else:
        previous: list[int | None] = [None] * clients
        for k in range(per_client):
            for c in range(clients):
                previous[c] = b.add(segments=[(f"w9/p/{c}/{k}", length)], output_length=length, group="closed",
                                    client=c, turn=k, after_req=previous[c])
        arrival = Closed(concurrency=clients, think_s=0.0)
    return b.build(name="w9", scale=scale, seed=seed, options=opts, arrival=arrival, dp_size=dp,
                   duration_s=duration_s)
