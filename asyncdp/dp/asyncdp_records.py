"""The records asyncdp's state (:mod:`.asyncdp_state`) is built from: the policy's cost weights, and one request a
router sent until it finishes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CostWeights:
    """The policy's knobs that price a rank (docs/discussion/routing-policy.md)."""

    decode_tokens: float
    kv_penalty_tokens: float
    memory_tokens: float
    hot_ratio: float
    hot_slack: float
    replica_headroom: float = 0.0  # 0: no deliberate replicas
    phase_spread: float = 0.0  # 0: a new prompt's load compares unweighted (AsyncdpState.phase)
    phase_period_us: int = 5_000_000
    hot_share: float = 0.0  # 0: the hot-spot bound holds for every prefix (AsyncdpState.mark_hot)
    stall_tokens_per_s: float = 0.0  # 0: no stall term (:mod:`.stalls`)
    stall_grace_us: int = 1_000_000


@dataclass(slots=True)
class Routed:
    """One request this router sent, until it finishes."""

    rank: int
    prefill: int  # tokens counted in pending[rank] until the first token
    decoding: bool = False
    weight: float = 0.0  # its weight in dec_tokens while it decodes (AsyncdpPolicy.decode_weight)
    sent_us: int = 0  # when it was dispatched (the stall term's age)
    gone: bool = False  # finished (or its id reused) before its first token
