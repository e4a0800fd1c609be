"""The peers' routing policies as pure baselines (routing-bench §2.7-2.12), one module per peer.

``PEER_POLICIES`` maps each spec name, presets included as ``name@preset``, to a factory of a fresh
:class:`~asyncdp.dp.policy.Policy`. Shared pure structures: :mod:`.hashing` (the engine's chained block hash,
``units``), :mod:`.radix` (SGLang's approximate tree), :mod:`.block_index` (per-rank LRU of block hashes),
:mod:`.ring` (consistent hashing) and :mod:`.events` (the KV-event shape precise policies read).

Knobs a harness may pass in ``init(params)``: ``block_size_tokens`` (the engine's block size, default 16; for
KV-event hashes), ``kv_blocks_per_rank`` (``llmd_weighted`` with autoTune), ``staleness_threshold_ms``
(``llmd_weighted``, default 2000).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from asyncdp.dp.baselines import PowerOfTwoPolicy
from asyncdp.dp.peers.aibrix import AibrixPrefixPolicy
from asyncdp.dp.peers.dynamo import DynamoKvPolicy
from asyncdp.dp.peers.events import KvEvent, KvEventIndex
from asyncdp.dp.peers.llmd import LlmdWeightedPolicy
from asyncdp.dp.peers.optional import (
    ProdstackLoadAwarePolicy,
    ProdstackPrefixAwarePolicy,
    RayPrefixPolicy,
    SmgLeastLoadPolicy,
    SmgPrefixHashPolicy,
    VllmTokenPolicy,
)
from asyncdp.dp.peers.session import SessionHashPolicy
from asyncdp.dp.peers.sglang import SglangCacheAwarePolicy
from asyncdp.dp.policy import Policy

__all__ = [
    "PEER_POLICIES", "AibrixPrefixPolicy", "DynamoKvPolicy", "KvEvent", "KvEventIndex", "LlmdWeightedPolicy",
    "RayPowerOfTwoPolicy", "SessionHashPolicy", "SglangCacheAwarePolicy",
]


class RayPowerOfTwoPolicy(PowerOfTwoPolicy):
    """``power_of_two@ray``: compares ``waiting+running`` from the snapshot. Ray probes each replica's queue at
    decision time, so the harness must run it with fresh (``oracle``) telemetry to model the peer
    (``wants_oracle_telemetry``); with a stale snapshot it is ``power_of_two@load``."""

    name = "power_of_two@ray"
    wants_oracle_telemetry = True

    def __init__(self) -> None:
        super().__init__(metric="load")


def _rename(factory: Callable[[], Policy], name: str) -> Callable[[], Policy]:
    def make() -> Policy:
        p = factory()
        p.name = name
        return p
    return make



_FACTORIES: dict[str, Callable[[], Policy]] = {
    "sglang_cache_aware": SglangCacheAwarePolicy,
    "sglang_cache_aware@rust_defaults": partial(
        SglangCacheAwarePolicy, cache_threshold=0.5, balance_abs_threshold=32, balance_rel_threshold=1.1,
        eviction_interval_s=30.0, max_tree_size=10_000),
    "sglang_cache_aware@events": partial(SglangCacheAwarePolicy, events=True),
    "sglang_cache_aware@smallest_tree": partial(SglangCacheAwarePolicy, miss_policy="smallest_tree"),
    "sglang_cache_aware@guard_first_token": partial(SglangCacheAwarePolicy, load_guard_at="first_token"),
    "sglang_cache_aware@guard_never": partial(SglangCacheAwarePolicy, load_guard_at="never"),
    "sglang_cache_aware@tokens": partial(SglangCacheAwarePolicy, tree_unit="tokens"),
    "llmd_weighted": LlmdWeightedPolicy,
    "llmd_weighted@precise": partial(LlmdWeightedPolicy, precise_prefix=2.0, kv_util=1.0, queue=1.0, prefix=0.0),
    "llmd_weighted@load_only": partial(LlmdWeightedPolicy, queue=1.0, kv_util=1.0, prefix=0.0),
    "llmd_weighted@prefix_only": partial(LlmdWeightedPolicy, queue=0.0, kv_util=0.0, prefix=1.0),
    "llmd_weighted@block64": partial(LlmdWeightedPolicy, block_tokens=64),
    "llmd_weighted@autotune": partial(LlmdWeightedPolicy, block_tokens=64, auto_tune=True),
    "llmd_weighted@affinity": partial(LlmdWeightedPolicy, prefix_affinity_filter=True),
    "dynamo_kv": DynamoKvPolicy,
    "dynamo_kv@approx": partial(DynamoKvPolicy, approx=True),
    "dynamo_kv@2026": partial(DynamoKvPolicy, formula="2026"),
    "dynamo_kv@credit1.5": partial(DynamoKvPolicy, formula="2026", credit=1.5),
    "dynamo_kv@early2025": partial(DynamoKvPolicy, formula="early2025"),
    "dynamo_kv@literal2025": partial(DynamoKvPolicy, count_pending_prefill=False),
    "dynamo_kv@temperature0.5": partial(DynamoKvPolicy, temperature=0.5),
    "aibrix_prefix": AibrixPrefixPolicy,
    "aibrix_prefix@code_defaults": partial(AibrixPrefixPolicy, imbalance_abs_count=8, stddev_factor=1.0),
    "session_hash": SessionHashPolicy,
    "session_hash@random_fallback": partial(SessionHashPolicy, fallback="random"),
    "session_hash@sticky_least_loaded": partial(SessionHashPolicy, sticky_least_loaded=True),
    "power_of_two@ray": RayPowerOfTwoPolicy,
    "vllm_token": VllmTokenPolicy,
    "smg_least_load": SmgLeastLoadPolicy,
    "smg_prefix_hash": SmgPrefixHashPolicy,
    "prodstack_prefixaware": ProdstackPrefixAwarePolicy,
    "prodstack_loadaware": ProdstackLoadAwarePolicy,
    "ray_prefix": RayPrefixPolicy,
}

PEER_POLICIES: dict[str, Callable[[], Policy]] = {
    name: (f if "@" not in name else _rename(f, name)) for name, f in _FACTORIES.items()
}
