"""The routing policies' registry (routing-bench §2) and the DP client's LoadBalancer.

Theory of operation. Policies follow the pure interface of :mod:`asyncdp.dp.policy`: ``select`` decides,
``on_dispatch`` / ``on_finish`` / ``on_snapshot`` mutate the policy's own state. Policies see rank *indices*.

:class:`LoadBalancer` is the small stateful façade one DP client uses (spec §7.1-7.6). It owns the managed
global ranks, the ``owner`` map and per-rank in-flight counts (the one owner of request -> rank: the DP client
keeps only output streams), resolves rank hints (E1/E2/E3 of §4.2, :mod:`asyncdp.dp.hints`), excludes
dead ranks, slices coordinator snapshots to its managed range, and counts decisions by reason. It performs no
I/O: the client sends the request and feeds finishes and snapshots back in.

Policies registered here: ``vllm`` (exact, vLLM's current internal balancer) and ``vllm_legacy`` (before the
in-flight floor, KV term and rotation), both in :mod:`.vllm_policy`; ``asyncdp`` (:mod:`.asyncdp_policy`); the
baselines ``round_robin``, ``random``, ``power_of_two`` (:mod:`.baselines`); and the peers' (:mod:`.peers`).
``make_policy("name@preset")`` builds one.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from asyncdp.dp.asyncdp_policy import AsyncdpPolicy
from asyncdp.dp.baselines import PowerOfTwoPolicy, RandomPolicy, RoundRobinPolicy
from asyncdp.dp.hints import parse_rank, resolve_rank_hint
from asyncdp.dp.peers import PEER_POLICIES
from asyncdp.dp.policy import (
    Decision,
    Policy,
    RankLoad,
    RequestView,
    Snapshot,
)
from asyncdp.dp.vllm_policy import VllmLegacyPolicy, VllmPolicy, VllmState, spec_loop_pick
from asyncdp.errors import ConfigError, InvalidRequestError, UnavailableError

__all__ = [
    "POLICIES", "PRESETS", "ClaimAsk", "Decision", "LoadBalancer", "Policy", "RankLoad", "RequestView", "Snapshot",
    "VllmLegacyPolicy", "VllmPolicy", "VllmState", "make_policy", "parse_rank", "spec_loop_pick",
]


# ---------------------------------------------------------------- registry

POLICIES: dict[str, type[Policy]] = {
    "asyncdp": AsyncdpPolicy,
    "vllm": VllmPolicy,
    "vllm_legacy": VllmLegacyPolicy,
    "round_robin": RoundRobinPolicy,
    "random": RandomPolicy,
    "power_of_two": PowerOfTwoPolicy,
}

PRESETS: dict[str, dict[str, Any]] = {
    "vllm_legacy@no_initial_counts": {"no_initial_counts": True},
    "round_robin@staggered": {"staggered": True},
    "asyncdp@local": {"directory": False},  # each API server on its own: no prefix directory
    "asyncdp@no_phase": {"phase_spread": 0.0},  # new prompts compare loads unweighted (AsyncdpState.phase)
    "asyncdp@fill": {"fill_new": True},  # several API servers: the others' unseen work is poured for new prompts too
    "asyncdp@no_fill": {"unseen_fill": 0.0},  # several API servers: the others' unseen work is not estimated
    "asyncdp@claim_all": {"claim_in_phase": True},  # claim new prompts while the phase weights hold too
    "asyncdp@no_mirror": {"mirror": False},  # several API servers: a router counts only its own new prompts (mirror_new)
    "asyncdp@shallow": {"deep_claims": False},  # claim only prompts whose first block no rank holds
    "asyncdp@counts": {"prefill_tokens": False},  # the others' waiting work from the counts alone (no token report)
    "asyncdp@flat_decode": {"decode_ref_tokens": 0.0},  # every decoding request weighs the same (decode_weight)
    "asyncdp@ctx_decode": {},  # the default: the name its decode weight had while it was opt-in
    "asyncdp@stall": {"stall_tokens_per_s": 16384.0},  # hits leave a rank whose requests wait past 1 s (stall)
    "asyncdp@no_replica": {"replica_headroom": 0.0},  # no deliberate replicas of hot prefixes (mark_spill)
    "asyncdp@headroom1.5": {"replica_headroom": 1.5},  # fewer replicas: the default's before it became 2
    "asyncdp@bound_all": {"hot_share": 0.0},  # the hot-spot bound holds for every prefix, however cold (mark_hot)
    "asyncdp@no_spread": {"spread": False},  # a new prompt: the cheapest rank by load, as before spread (spread)
    "asyncdp@spread": {"spread_tokens": float("inf"), "spread_gated": False},  # spread within one prefill, ungated
    "asyncdp@spread512": {"spread_gated": False},  # spread within 512 tokens even where a prefix is hot (spread)
    "asyncdp@hot_held": {"hot_new": False},  # a hot prefix's holders draw the mostly new prompts after it too
    "power_of_two@queue": {"metric": "queue"},
    "power_of_two@load": {"metric": "load"},
    "power_of_two@kv": {"metric": "kv"},
}


def make_policy(name: str) -> Policy:
    """Build a policy from ``name`` or ``name@preset``; unknown names raise ConfigError listing the valid ones."""
    base = name.partition("@")[0]
    if base in POLICIES and ("@" not in name or name in PRESETS):
        return POLICIES[base](**PRESETS.get(name, {}))
    if name in PEER_POLICIES:
        return PEER_POLICIES[name]()
    raise ConfigError(f"unknown load-balancing policy {name!r}; valid policies: {', '.join(policy_names())}.")


def policy_names() -> list[str]:
    """Every name :func:`make_policy` accepts, presets included."""
    return [*POLICIES, *PRESETS, *PEER_POLICIES]


# ---------------------------------------------------------------- the client façade


class ClaimAsk(NamedTuple):
    """What :meth:`LoadBalancer.claim` asks the coordinator's prefix directory (global ranks)."""

    hashes: Sequence[int]
    proposal: int
    candidates: list[int]
    deep: bool = False  # a run after a prefix this router placed (Policy.claim_is_deep)


class LoadBalancer:
    """One DP client's routing state over its managed global ranks (spec §7).

    ``select`` returns a global rank and records the request as in flight there until ``on_finish``.
    """

    def __init__(self, engines: Sequence[int], client_index: int = 0, client_count: int = 1,
                 policy: str | Policy = "vllm", *, seed: int | None = 0) -> None:
        ranks = list(engines)
        if not ranks or sorted(set(ranks)) != ranks or ranks[0] < 0:
            raise ConfigError(f"managed ranks must be distinct, ascending and >= 0 (got {ranks}).")
        if not 0 <= client_index < client_count:
            raise ConfigError(f"client_index must be in [0, {client_count}) (got {client_index}).")
        self._engines = ranks
        self._index = {g: i for i, g in enumerate(ranks)}
        self._policy = make_policy(policy) if isinstance(policy, str) else policy
        self._client_index, self._client_count = client_index, client_count
        self._state = self._policy.init(len(ranks), client_index, client_count, None)
        self._rng = random.Random(seed)
        self._snap: Snapshot | None = None
        self._owner: dict[str, int] = {}  # request_id -> local index
        self._inflight = [0] * len(ranks)
        self._dead: set[int] = set()
        self._draining: set[int] = set()  # stopping in order: out of selection, their requests still finishing
        self.decisions = {"score": 0, "hint": 0}

    # ------------------------------------------------------------ views

    @property
    def engines(self) -> list[int]:
        return list(self._engines)

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def state(self) -> Any:
        """The policy's own state (``VllmState`` for ``vllm``: ``waiting``, ``running``, ``kv``, ``start``)."""
        return self._state

    @property
    def inflight(self) -> list[int]:
        """This client's unfinished requests per managed rank, in local-index order."""
        return list(self._inflight)

    def inflight_of(self, rank: int) -> int:
        """This client's unfinished requests on global ``rank`` (O(1): called on every dispatch and finish)."""
        return self._inflight[self._index[rank]]

    @property
    def dead_ranks(self) -> list[int]:
        return sorted(self._engines[i] for i in self._dead)

    @property
    def num_inflight(self) -> int:
        return len(self._owner)

    def owner(self, request_id: str) -> int | None:
        i = self._owner.get(request_id)
        return None if i is None else self._engines[i]

    def group_by_owner(self, request_ids: Iterable[str]) -> dict[int, list[str]]:
        """Abort routing (§7.3): ids per owning live rank; unknown ids and dead owners are dropped."""
        groups: dict[int, list[str]] = {}
        for rid in request_ids:
            i = self._owner.get(rid)
            if i is not None and i not in self._dead:
                groups.setdefault(self._engines[i], []).append(rid)
        return groups

    def statistics(self) -> dict[str, Any]:
        return {"engines": self.engines, "inflight": self.inflight, "dead_ranks": self.dead_ranks,
                "decisions": dict(self.decisions), "policy": self._policy.name}

    # ------------------------------------------------------------ decisions

    def resolve_hint(self, rank_hint: object = None, global_rank_hint: object = None) -> int | None:
        """The local index a hint names, or None without a hint. Raises E1, E2, E3 (spec §4.2)."""
        return resolve_rank_hint(self._engines, rank_hint, global_rank_hint)

    def claim(self, request_id: str, prompt_token_ids: Sequence[int], *, max_tokens: int = 16,
              now_us: int = 0, routing_key: str | None = None, cache_salt: str | None = None) -> ClaimAsk | None:
        """For an unhinted request: a :class:`ClaimAsk` when the policy wants the coordinator's prefix directory
        asked where this prompt goes (:meth:`Policy.claim_hashes`), with the global rank it would pick itself
        (a pure ``select``, nothing recorded) and the global ranks it would accept
        (:meth:`Policy.claim_candidates`); None otherwise. Only with other routers and more than one rank."""
        if self._client_count < 2 or len(self._engines) < 2:
            return None
        req = RequestView(request_id, prompt_token_ids, max_tokens, routing_key, None, now_us, cache_salt)
        hashes = self._policy.claim_hashes(self._state, req)
        if not hashes:
            return None
        decision = self._policy.select(req, self._snap, self._state, now_us, self._rng)
        candidates = [self._engines[i] for i in self._policy.claim_candidates(self._state, req, now_us)
                      if i not in self._dead]
        return ClaimAsk(hashes, self._engines[decision.dp_rank], candidates,
                        self._policy.claim_is_deep(self._state, hashes))

    def on_prefix_owner(self, hashes: Sequence[int], owner: int, matched: int,
                        others: Sequence[float]) -> int | None:
        """The directory's answer to :meth:`claim` (``others`` per rank from this client's first managed rank to its
        last): tell the policy, and return ``owner`` as the rank the request goes to, or None when it is not a live
        rank of this client (route on the policy)."""
        first = self._engines[0]
        if len(others) != self._engines[-1] - first + 1:
            return None  # not an answer for this client's ranks
        i = self._index.get(owner)
        usable = i is not None and i not in self._dead
        self._policy.on_prefix_owner(self._state, i if usable else None, hashes, max(0, matched),
                                     [others[g - first] for g in self._engines])
        return owner if usable else None

    def on_prefix_placed(self, rank: int, prompt_tokens: int) -> None:
        """Another API server's claim placed a long new prefix on global ``rank`` (``PrefixPlaced``): tell the policy,
        when the rank is a live one of this client."""
        i = self._index.get(rank)
        if i is not None and i not in self._dead and prompt_tokens > 0:
            self._policy.on_prefix_placed(self._state, i, prompt_tokens)

    def select(self, request_id: str, prompt_token_ids: Sequence[int] = (), rank_hint: object = None, *,
               global_rank_hint: object = None, max_tokens: int = 16, now_us: int = 0,
               directed: int | None = None, routing_key: str | None = None, cache_salt: str | None = None) -> int:
        """Pick the global rank for a new request and record it as in flight there. ``directed``: a live global
        rank the prefix directory named for it (:meth:`on_prefix_owner`), which a hint still overrides.
        ``routing_key``: the request's session key, if it has one (the policies' ``RequestView.routing_key``).
        ``cache_salt``: its ``SamplingParams.cache_salt``, under which the policies hash its prompt."""
        if request_id in self._owner:
            raise InvalidRequestError(f"request id {request_id!r} is already in flight.", field="request_id")
        hint = self.resolve_hint(rank_hint, global_rank_hint)
        if hint is not None and hint in self._dead:
            raise UnavailableError(f"data-parallel rank {self._engines[hint]} is not available.")
        req = RequestView(request_id, prompt_token_ids, max_tokens, routing_key, hint, now_us, cache_salt)
        d = self._index.get(directed) if directed is not None and hint is None else None
        if d is not None and d not in self._dead:
            decision = Decision(d)
        else:
            decision = self._policy.select(req, self._snap, self._state, now_us, self._rng)
        self._policy.on_dispatch(self._state, req, decision, now_us)
        i = decision.dp_rank
        self._owner[request_id] = i
        self._inflight[i] += 1
        self.decisions["hint" if decision.hinted else "score"] += 1
        return self._engines[i]

    def on_first_token(self, request_id: str, now_us: int = 0) -> None:
        i = self._owner.get(request_id)
        if i is not None:
            self._policy.on_first_token(self._state, request_id, i, now_us)

    def on_tokens(self, request_id: str, n_new: int, now_us: int = 0) -> None:
        """``n_new`` output tokens of ``request_id`` arrived; only for a policy that ``needs_tokens``."""
        i = self._owner.get(request_id)
        if i is not None and self._policy.needs_tokens:
            self._policy.on_tokens(self._state, request_id, i, n_new, now_us)

    def on_finish(self, request_id: str, now_us: int = 0) -> int | None:
        """Forget a finished or aborted request; returns its global rank, or None for an unknown id."""
        i = self._owner.pop(request_id, None)
        if i is None:
            return None
        self._inflight[i] -= 1
        self._policy.on_finish(self._state, request_id, i, now_us)
        return self._engines[i]

    def on_snapshot(self, counts: Sequence[Sequence[float]] | None, *, seq: int = 0, now_us: int = 0,
                    prefill_tokens: Sequence[int] | None = None, cache_fill: Sequence[float] | None = None) -> None:
        """Coordinator counts for all N ranks (``StatsSnapshot.counts``), and their prompt tokens still to compute
        and prefix cache fill where the coordinator sent them (``StatsSnapshot.prefill_tokens``, ``cache_fill``);
        None (wave-only) changes nothing."""
        if counts is None:
            return
        if len(counts) <= self._engines[-1]:
            raise ValueError(f"snapshot covers {len(counts)} ranks; this client manages up to {self._engines[-1]}")
        if prefill_tokens is not None and len(prefill_tokens) != len(counts):
            prefill_tokens = None  # not from the same ranks: the counts alone
        if cache_fill is not None and len(cache_fill) != len(counts):
            cache_fill = None
        self._snap = Snapshot.from_counts(
            [counts[g] for g in self._engines], seq=seq, delivered_at_us=now_us,
            prefill_tokens=None if prefill_tokens is None else [prefill_tokens[g] for g in self._engines],
            cache_fill=None if cache_fill is None else [cache_fill[g] for g in self._engines])
        self._policy.on_snapshot(self._state, self._snap)

    def on_cache_reset(self, rank: int) -> None:
        """Global ``rank`` dropped its prefix cache (``PrefixCacheReset``): the policy forgets what it sent there."""
        i = self._index.get(rank)
        if i is not None:
            self._policy.on_cache_reset(self._state, i)

    def set_engine_params(self, params: dict[str, Any]) -> bool:
        """Give the policy what the engines reported (``kv_blocks_per_rank``, ``block_size_tokens``: the knobs of
        ``Policy.init``), so an approximate index is bounded by the real KV capacity (routing-bench H8). Only
        before the first decision: the policy is initialised again, the dead ranks and the last snapshot
        re-applied; later it would lose the in-flight accounting, so it is refused (False)."""
        if self._owner or any(self.decisions.values()):
            return False
        self._state = self._policy.init(len(self._engines), self._client_index, self._client_count, params)
        for i in sorted(self._dead | self._draining):
            self._policy.on_rank_dead(self._state, i)
        if self._snap is not None:
            self._policy.on_snapshot(self._state, self._snap)
        return True

    def forget_snapshot(self) -> None:
        """The coordinator is gone: route on this client's own in-flight counts, not on its last loads frozen."""
        if self._snap is None:
            return
        self._snap = Snapshot(tuple(RankLoad() for _ in self._engines))
        self._policy.on_snapshot(self._state, self._snap)

    def mark_dead(self, rank: int) -> list[str]:
        """Exclude a global rank from selection; returns the ids still in flight there (the client fails them)."""
        i = self._index[rank]
        if i not in self._dead and i not in self._draining:
            self._policy.on_rank_dead(self._state, i)
        self._dead.add(i)
        self._draining.discard(i)
        if self._draining and len(self._dead) + len(self._draining) == len(self._engines):
            # only draining ranks are left: the last of them takes requests again and refuses them itself, saying
            # why (mark_draining keeps the last live rank so), where "no rank is alive" would be wrong
            back = min(self._draining)
            self._draining.discard(back)
            self._policy.on_rank_back(self._state, back)
        return sorted(rid for rid, j in self._owner.items() if j == i)

    def mark_alive(self, rank: int) -> bool:
        """A dead (or draining) global rank serves again: its restarted node brought it back (spec §13, dense).
        It takes part in selection from now on. Returns False, changing nothing, for an unknown or live rank."""
        i = self._index.get(rank)
        if i is None or (i not in self._dead and i not in self._draining):
            return False
        self._dead.discard(i)
        self._draining.discard(i)
        self._policy.on_rank_back(self._state, i)
        return True

    def mark_draining(self, rank: int) -> bool:
        """A global rank stops in order (``RankDraining``): exclude it from selection while its requests finish
        (a hint naming it still reaches it, and its refusal). Returns False, changing nothing, for an unknown, dead
        or draining rank, and for the last live rank that is not draining, which then refuses requests itself:
        its refusal says why, where "no rank is alive" would not."""
        i = self._index.get(rank)
        if i is None or i in self._dead or i in self._draining or all(
                j in self._dead or j in self._draining for j in range(len(self._engines)) if j != i):
            return False
        self._draining.add(i)
        self._policy.on_rank_dead(self._state, i)
        return True

    def is_draining(self, rank: int) -> bool:
        return self._index.get(rank) in self._draining
