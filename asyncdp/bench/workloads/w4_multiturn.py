"""W4: multi-turn chat (SGLang ``bench_multiturn``), spec §4 W4.

C clients × N rounds. Round 1 is the client's first prompt of R tokens; each later round is the previous
prompt, the previous answer (O tokens: the answer segment of the previous round's record, which the simulated
executor emits) and a new sub-question of R tokens. Round k+1 becomes ready ``think_s`` (default 0) after round
k's answer (``after_req``, ``think_ms``); a :class:`~asyncdp.bench.arrivals.Dispatch` gate issues ready requests
at ``rate_rps`` (``process`` poisson or uniform), at most ``max_parallel`` outstanding, taking them from the
ready queue in random order (or ``fifo``). The routing key is the client id; ``turn`` is the round (0-based).

Full: C=256, N=5, R=512, O=64, max_parallel 128, swept over rates 16, 14, ... 2, 1 on a fresh cluster per rate
(``sweep_rates_rps``; SGLang flushes its cache between rates). Ideal hit rate 68.5 % (the spec's "about 69 %":
each round hits the previous prompt and answer, less the answer's last token, whose KV is never computed).
Quick: C=32, N=4, R=256, O=32, max_parallel 16, rates 8, 4, 2, 1 [ours].
``preset=pressure``: KV per rank cut so the working set (every client's last prompt and answer) is 150 % of the
cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from asyncdp.bench.arrivals import Dispatch
from asyncdp.bench.records import BLOCK_SIZE, DEADLINE_S, Workload, answer_segment_id
from asyncdp.bench.workloads.common import Builder, Options, check_scale

FULL_RATES = (16.0, 14.0, 12.0, 10.0, 8.0, 6.0, 4.0, 2.0, 1.0)
QUICK_RATES = (8.0, 4.0, 2.0, 1.0)


def generate(scale: str, seed: int, options: Mapping[str, Any] | None = None) -> Workload:
    check_scale("w4", scale, ("quick", "full"))
    opts = Options("w4", options, scale)
    full = scale == "full"
    preset = opts.choice("preset", "default", ("default", "pressure"))
    clients = opts.get("clients", 256 if full else 32)
    rounds = opts.get("rounds", 5 if full else 4)
    r_len = opts.get("request_len", 512 if full else 256)
    o_len = opts.get("output_len", 64 if full else 32, least=1)
    max_parallel = opts.get("max_parallel", 128 if full else 16, least=1)
    think_s = opts.get("think_s", 0.0, most=DEADLINE_S)
    order = opts.choice("order", "random", ("random", "fifo"))
    process = opts.choice("process", "poisson", ("poisson", "uniform"))
    dp = opts.get("dp", 8 if full else 4, least=1)
    opts.expect_requests(clients * rounds, f"clients={clients} x rounds={rounds}")
    opts.check()
    rates = FULL_RATES if full else QUICK_RATES

    b = Builder()
    history: list[list[tuple[str, int]]] = [[] for _ in range(clients)]
    previous: list[int | None] = [None] * clients
    for k in range(rounds):
        for c in range(clients):
            before = previous[c]
            if before is not None:
                history[c].append((answer_segment_id(before), o_len))
            history[c].append((f"w4/q/{c}/{k}", r_len))
            previous[c] = b.add(segments=history[c], output_length=o_len, group=f"c{c}", client=c, turn=k,
                                after_req=before, think_ms=think_s * 1000.0 if before is not None else 0.0,
                                routing_key=f"client{c}")
    kv_blocks = None
    if preset == "pressure":
        working_set_blocks = clients * math.ceil(rounds * (r_len + o_len) / BLOCK_SIZE)
        kv_blocks = math.ceil(working_set_blocks / 1.5 / dp)
    arrival = Dispatch(rate_rps=rates[0], max_parallel=max_parallel, order=order, process=process)
    return b.build(name="w4", scale=scale, seed=seed, options=opts, arrival=arrival, dp_size=dp,
                   kv_blocks_per_rank=kv_blocks, sweep_rates_rps=rates, notes="turn = round; report hit per round")
