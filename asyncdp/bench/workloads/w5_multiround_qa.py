"""W5: multi-round QA (production-stack ``multi-round-qa``), spec §4 W5.

U users × M rounds. Every prompt is a shared system segment (S tokens), the user's history segment (H tokens),
then the conversation so far: each round adds a 20-token question and, after it, the answer (A tokens, the
answer segment of that round's record). Each user sends every ``gap = U/Q`` s, but never before the previous
answer arrived (``t_arrival_ms`` and ``after_req`` both set); users join one every ``gap·(M−1)/U`` s, so about
U are active at once. The routing key is the ``x-user-id`` header value ``user<u>``; ``turn`` is the round.

Full [ours]: U=64, M=10, S=1 000, H=8 000, A=100, Q=2 req/s. Quick: U=16, M=4, S=256, H=1 024, A=32 (Q=2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncdp.bench.arrivals import Trace
from asyncdp.bench.records import Workload, answer_segment_id
from asyncdp.bench.workloads.common import Builder, Options, check_scale

QUESTION_LEN = 20


def generate(scale: str, seed: int, options: Mapping[str, Any] | None = None) -> Workload:
    check_scale("w5", scale, ("quick", "full"))
    opts = Options("w5", options, scale)
    full = scale == "full"
    users = opts.get("users", 64 if full else 16, least=1)
    rounds = opts.get("rounds", 10 if full else 4)
    s_len = opts.get("system_len", 1000 if full else 256)
    h_len = opts.get("history_len", 8000 if full else 1024)
    a_len = opts.get("answer_len", 100 if full else 32, least=1)
    qps = opts.get("qps", 2.0, positive=True)
    dp = opts.get("dp", 8 if full else 4, least=1)
    opts.expect_requests(users * rounds, f"users={users} x rounds={rounds}")
    opts.check()

    gap_ms = users / qps * 1000.0
    join_ms = gap_ms * (rounds - 1) / users
    sends = sorted((u * join_ms + m * gap_ms, m, u) for u in range(users) for m in range(rounds))
    b = Builder()
    conversation: list[list[tuple[str, int]]] = [[("w5/system", s_len), (f"w5/history/{u}", h_len)]
                                                 for u in range(users)]
    previous: list[int | None] = [None] * users
    for t, m, u in sends:
        before = previous[u]
        if before is not None:
            conversation[u].append((answer_segment_id(before), a_len))
        conversation[u].append((f"w5/q/{u}/{m}", QUESTION_LEN))
        previous[u] = b.add(segments=conversation[u], output_length=a_len, group=f"u{u}", client=u, turn=m,
                            t_arrival_ms=round(t * 1000.0) / 1000.0, after_req=before, routing_key=f"user{u}")
    return b.build(name="w5", scale=scale, seed=seed, options=opts, arrival=Trace(speed=1.0), dp_size=dp)
