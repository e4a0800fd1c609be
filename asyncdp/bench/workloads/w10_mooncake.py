"""W10: Mooncake-style agent sessions (kvcache-ai/Mooncake FAST'25 trace format), spec §4 W10.

Every record carries Mooncake ``hash_ids``: one id per 512-token block, and its segments are those blocks
(segment ``m/<id>``, the last one truncated to ``input_length``), materialised exactly as
:func:`asyncdp.bench.trace.read_trace` materialises a user's trace, so a generated W10 and its exported trace
replay the same tokens.

Generator [ours; calibrated as the spec asks]. Sessions start as a Poisson process at ``rate_rps /
mean turns``. Each draws a root prompt from a pool of ``agents`` prompts (4-16 blocks each, by
:func:`root_blocks`) by Zipf(1.2) over the popularity ranks. The
first turn is the root plus U{ΔB_min..ΔB_max} fresh blocks; each later turn, with probability ``p_continue``,
extends the previous context by U{ΔB_min..ΔB_max} fresh blocks (the previous turn's last, partly used block
becomes whole), and otherwise restarts from the root plus fresh blocks; a context that would pass
``max_blocks`` restarts too. A turn's ``input_length`` leaves U[0, 511] tokens of its last block unused. Turns per
session are log-normal with median 29 and σ 0.8 [ours]; think time is Exp(mean 2 s) after the previous answer.
Ids come from a trie keyed on (parent id, content), numbered in creation order, so a session's id chain grows
monotonically and equal ids at a position mean an equal prefix.

Presets, tuned on the ideal hit rate (one rank, infinite cache, blocks of 16) over seeds 1-3 at full scale:

- ``toolagent``: outputs U[2, 32]; ΔB ∈ {4..12}, ``p_continue`` 0.3, 32 agents, contexts of at most 128
  blocks → 59.9 / 60.3 / 59.0 % for seeds 1 / 2 / 3 (spec: 59 ± 2 %); mean input 9.7 k tokens.
- ``conversation``: outputs U[200, 400] (about 300); ΔB ∈ {12..32}, ``p_continue`` 0.25, 32 agents, 128
  blocks → 40.7 / 40.7 / 41.4 % (spec: 40 ± 2 %); mean input 18.7 k tokens.

(Short sessions restart often: with the spec's median of 29 turns, a higher ``p_continue`` or a smaller ΔB
makes the context grow and the reuse exceed 80 %.)

Full: 23 608 requests at 6.7 req/s (about 59 min), replayed at 0.8× speed as in Dynamo's A/B test. Quick: 500
requests over about 2 min (4.2 req/s), speed 1. ``replay``: ``sessions`` (default; closed loop per session:
each later turn waits for the previous answer plus its think time) or ``schedule`` (fixed timestamps, as a
Mooncake trace has: session start plus the think times, with zero service time assumed).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping
from typing import Any

from asyncdp.bench.arrivals import Trace
from asyncdp.bench.records import DEFAULT_MAX_MODEL_LEN, Workload
from asyncdp.bench.trace import MOONCAKE_BLOCK, block_segments
from asyncdp.bench.workloads.common import Builder, Options, check_scale, lognormal_int, stream

PRESETS = {  # outputs (lo, hi), ΔB (lo, hi), p_continue
    "toolagent": ((2, 32), (4, 12), 0.3),
    "conversation": ((200, 400), (12, 32), 0.25),
}
TURNS_MEDIAN, TURNS_SIGMA = 29, 0.8
MAX_BLOCKS = DEFAULT_MAX_MODEL_LEN // MOONCAKE_BLOCK  # a longer context is more than the simulated engine holds
MAX_AGENTS = 100_000
_SCALES = {"quick": (500, 500 / 120, 1.0, 4), "full": (23_608, 6.7, 0.8, 8)}


def root_blocks(popularity_rank: int) -> int:
    """Blocks of the root prompt of the agent at ``popularity_rank``: 4 to 16, spread over the ranks [ours].

    Fixed rather than drawn, so the most popular roots (Zipf 1.2 gives rank 0 about a quarter of the sessions)
    have the same length for every seed and the ideal reuse varies little from seed to seed.
    """
    return 4 + (popularity_rank * 5) % 13


class _Trie:
    def __init__(self) -> None:
        self._ids: dict[tuple[int, tuple[Any, ...]], int] = {}

    def child(self, parent: int, content: tuple[Any, ...]) -> int:
        key = (parent, content)
        node = self._ids.get(key)
        if node is None:
            node = self._ids[key] = len(self._ids)
        return node


def generate(scale: str, seed: int, options: Mapping[str, Any] | None = None) -> Workload:
    check_scale("w10", scale, tuple(_SCALES))
    opts = Options("w10", options, scale)
    n0, rate0, speed0, dp0 = _SCALES[scale]
    preset = opts.choice("preset", "toolagent", tuple(PRESETS))
    (out_lo, out_hi), (db_lo, db_hi), p0 = PRESETS[preset]
    n = opts.get("num_requests", n0)
    rate = opts.get("rate_rps", rate0, positive=True)
    speed = opts.get("speed", speed0, positive=True)
    p_continue = opts.get("p_continue", p0, most=1.0)
    max_blocks = opts.get("max_blocks", MAX_BLOCKS, most=MAX_BLOCKS)
    db_lo = opts.get("delta_blocks_min", db_lo, most=max_blocks)
    db_hi = opts.get("delta_blocks_max", db_hi, least=db_lo, most=max_blocks)
    n_agents = opts.get("agents", 32, least=1, most=MAX_AGENTS)
    replay = opts.choice("replay", "sessions", ("sessions", "schedule"))
    dp = opts.get("dp", dp0, least=1)
    opts.expect_requests(n, f"num_requests={n}")
    opts.check()

    rng = stream(seed, "w10")
    trie = _Trie()
    roots: list[list[int]] = []
    for a in range(n_agents):
        parent, chain = -1, []
        for j in range(root_blocks(a)):
            parent = trie.child(parent, ("agent", a, j))
            chain.append(parent)
        roots.append(chain)
    cum = list(itertools.accumulate((k + 1) ** -1.2 for k in range(n_agents)))
    fresh = 0

    def extend(chain: list[int]) -> list[int]:
        nonlocal fresh
        out = list(chain)
        for _ in range(rng.randint(db_lo, db_hi)):
            fresh += 1
            out.append(trie.child(out[-1] if out else -1, ("fresh", fresh)))
        return out

    mean_turns = TURNS_MEDIAN * math.exp(TURNS_SIGMA**2 / 2)
    session_rng = stream(seed, "w10/arrivals")
    turns: list[tuple[float, int, int, list[int], int, int, float]] = []  # t, session, turn, ids, in, out, think
    start_ms, session = 0.0, 0
    while len(turns) < n:
        start_ms += session_rng.expovariate(rate / mean_turns) * 1000.0
        root = roots[min(bisect.bisect_left(cum, rng.random() * cum[-1]), n_agents - 1)]
        context = extend(root)
        t_ms, think_ms = start_ms, 0.0
        for turn in range(min(n - len(turns), lognormal_int(rng, TURNS_MEDIAN, TURNS_SIGMA, 1, 1000))):
            if turn:
                think_ms = rng.expovariate(0.5) * 1000.0
                t_ms += think_ms
                grown = len(context) + db_hi <= max_blocks
                context = extend(context) if grown and rng.random() < p_continue else extend(root)
            input_length = len(context) * MOONCAKE_BLOCK - rng.randint(0, MOONCAKE_BLOCK - 1)
            turns.append((t_ms, session, turn, context, input_length, rng.randint(out_lo, out_hi), think_ms))
        session += 1
    # Records in (estimated) time order, so a trace export's timestamps never go backwards; a session's
    # previous turn is always an earlier record.
    turns.sort(key=lambda row: (row[0], row[1], row[2]))
    b = Builder()
    last_of: dict[int, int] = {}
    for t_ms, s, turn, context, input_length, output, think_ms in turns:
        closed = replay == "sessions" and turn > 0
        last_of[s] = b.add(segments=block_segments(context, input_length), output_length=output, group=f"s{s}",
                           client=s, turn=turn, hash_ids=context,
                           t_arrival_ms=None if closed else round(t_ms * 1000.0) / 1000.0,
                           after_req=last_of[s] if closed else None, think_ms=think_ms if closed else 0.0)
    return b.build(name="w10", scale=scale, seed=seed, options=opts, arrival=Trace(speed=speed), dp_size=dp,
                   notes=f"{preset}: {session} sessions")
