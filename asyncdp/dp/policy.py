"""The pure routing-policy interface of routing-bench §2.0.

A policy is a stateless object; its per-router state lives in a separate ``State`` made by ``init``. ``select``
is a pure decision: it reads the request, the latest snapshot, the state and the rng it is given, and returns a
:class:`Decision`. Every mutation caused by that decision happens in ``on_dispatch``; the other hooks
(``on_first_token``, ``on_tokens`` for a policy with ``needs_tokens``, ``on_finish``, ``on_snapshot``,
``on_rank_dead``, ``on_cache_reset``, ``on_kv_event``, and ``on_timer`` every ``timer_period_us``) update the state
as telemetry arrives; the peers' policies (:mod:`asyncdp.dp.peers`) use them all. The DP client's
:class:`~asyncdp.dp.balance.LoadBalancer` delivers first tokens, token counts, finishes, snapshots, dead ranks and
prefix-cache resets; KV events and timers come from the routing simulator (no production component emits KV events
yet).
A policy's counts (``inflight``, ``load``, ...) are its own model of the ranks, updated when its rules say (some
peers count load from the first token, not from dispatch); the true in-flight count of a client is the
balancer's. Ranks are *indices* ``0..dp_size-1`` here. A state may carry ``excluded`` (indices of dead ranks); every policy skips them, and
``select`` raises :class:`~asyncdp.errors.UnavailableError` when nothing is left.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncdp.errors import UnavailableError
from asyncdp.sampling_params import salt_root

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


# ---------------------------------------------------------------- request, snapshot, decision


@dataclass(frozen=True, slots=True)
class RequestView:
    """What a policy may see of a request (routing-bench C4). The true output length is hidden."""

    req_id: str
    tokens: Sequence[int]
    max_tokens: int = 16
    routing_key: str | None = None
    rank_hint: int | None = None  # an index among the ranks, already validated
    t_arrival_us: int = 0
    cache_salt: str | None = None  # SamplingParams.cache_salt: the engine shares no cached block across salts

    @property
    def root_hash(self) -> int:
        """The parent of the prompt's first block hash: 0 unsalted, else :func:`salt_root`. Every policy that predicts
        prefix-cache hits from block hashes chains them from here, so a salted prompt matches no block of another
        salt (or of no salt), as in the engine's cache."""
        return 0 if self.cache_salt is None else salt_root(self.cache_salt)

    @property
    def prompt_len(self) -> int:
        return len(self.tokens)

    @property
    def text(self) -> str:
        """4 base-64 digits per token id (big-endian 24 bits), for character-based policies."""
        return "".join(
            _B64[(t >> 18) & 63] + _B64[(t >> 12) & 63] + _B64[(t >> 6) & 63] + _B64[t & 63] for t in self.tokens
        )


@dataclass(frozen=True, slots=True)
class RankLoad:
    """One rank's entry in a snapshot (routing-bench §1.1); the coordinator fills the first three,
    ``prefill_tokens`` and ``cache_fill``."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    waiting_uncached_tokens: int = 0
    pending_prefill_tokens: int = 0
    running_tokens: int = 0
    gen_tput_tok_s: float = 0.0
    num_cached_blocks: int = 0
    sampled_at_us: int = 0
    # [ours] prompt tokens still to compute: each waiting request's part the prefix cache did not cover when it was
    # enqueued, each running one's rest of its prefill (asyncdp.engine.scheduler)
    prefill_tokens: int = 0
    # [ours] the share of the rank's KV blocks holding cached content (BlockManager.cache_fill)
    cache_fill: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Loads of every rank the router manages, in index order."""

    loads: tuple[RankLoad, ...]
    seq: int = 0
    delivered_at_us: int = 0
    has_prefill_tokens: bool = False  # whether the ranks reported RankLoad.prefill_tokens

    @classmethod
    def from_counts(cls, counts: Sequence[Sequence[float]], *, seq: int = 0, delivered_at_us: int = 0,
                    prefill_tokens: Sequence[int] | None = None, cache_fill: Sequence[float] | None = None) -> Snapshot:
        """From wire counts ``[[waiting, running, kv_cache_usage], ...]`` (``StatsSnapshot.counts``) and, where the
        coordinator sent them, the ranks' prompt tokens still to compute and prefix cache fill
        (``StatsSnapshot.prefill_tokens``, ``cache_fill``)."""
        for name, values in (("prefill token counts", prefill_tokens), ("cache fills", cache_fill)):
            if values is not None and len(values) != len(counts):
                raise ValueError(f"{len(values)} {name} for {len(counts)} ranks")
        fills = cache_fill if cache_fill is not None else [0.0] * len(counts)
        if prefill_tokens is None:
            return cls(tuple(RankLoad(int(c[0]), int(c[1]), float(c[2]), cache_fill=float(f))
                             for c, f in zip(counts, fills, strict=True)), seq, delivered_at_us)
        return cls(tuple(RankLoad(int(c[0]), int(c[1]), float(c[2]), prefill_tokens=int(p), cache_fill=float(f))
                         for c, p, f in zip(counts, prefill_tokens, fills, strict=True)), seq, delivered_at_us, True)


@dataclass(frozen=True, slots=True)
class Decision:
    dp_rank: int  # index among the router's ranks
    hinted: bool = False
    info: dict[str, Any] | None = None  # scores etc., for logs; None on the hot path


# ---------------------------------------------------------------- interface


class Policy:
    """Base class: no-op hooks. Subclasses set ``name`` and implement ``init`` and ``select``."""

    name = "?"
    needs_tokens = False  # whether on_tokens must be called
    timer_period_us: int | None = None  # how often on_timer must be called (None: never)

    def init(self, dp_size: int, router_index: int = 0, num_routers: int = 1,
             params: dict[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def select(self, req: RequestView, snap: Snapshot | None, state: Any, now_us: int,
               rng: random.Random) -> Decision:
        raise NotImplementedError

    def on_dispatch(self, state: Any, req: RequestView, decision: Decision, now_us: int) -> None:
        pass

    def claim_is_deep(self, state: Any, hashes: Sequence[int]) -> bool:
        """Whether the claim of ``hashes`` (from :meth:`claim_hashes`) is of a run after a prefix this router placed:
        the directory looks it up, or records the proposal as its owner without placing it."""
        return False

    def on_first_token(self, state: Any, req_id: str, dp_rank: int, now_us: int) -> None:
        pass

    def on_tokens(self, state: Any, req_id: str, dp_rank: int, n_new: int, now_us: int) -> None:
        pass

    def on_finish(self, state: Any, req_id: str, dp_rank: int, now_us: int) -> None:
        pass

    def on_snapshot(self, state: Any, snap: Snapshot) -> None:
        pass

    def on_rank_dead(self, state: Any, dp_rank: int) -> None:
        """Exclude a rank from every later decision (its engine died)."""
        state.excluded.add(dp_rank)

    def on_rank_back(self, state: Any, dp_rank: int) -> None:
        """A rank excluded by :meth:`on_rank_dead` serves again (a restarted node brought it back, spec §13): it
        takes part in decisions from now on, with no load of this router (its requests failed when it died)."""
        state.excluded.discard(dp_rank)

    def on_cache_reset(self, state: Any, dp_rank: int) -> None:
        """The rank dropped its prefix cache (``POST /reset_prefix_cache``): forget what this router's index says
        it holds, as after its death, but keep it in the decisions. No-op for a policy without such an index."""

    def on_kv_event(self, state: Any, ev: Any) -> None:
        pass

    def on_timer(self, state: Any, now_us: int) -> None:
        pass

    def claim_hashes(self, state: Any, req: RequestView) -> Sequence[int]:
        """The prompt's block hashes when this router should ask the coordinator's prefix directory where the
        prompt goes (:mod:`asyncdp.dp.prefix_directory`: it has never placed the prompt's first block, and other
        routers may be placing it right now); empty for no claim, which is every policy but prefix-aware ones."""
        return ()

    def claim_candidates(self, state: Any, req: RequestView, now_us: int) -> Sequence[int]:
        """With a claim (:meth:`claim_hashes`): the ranks this router would accept for the prompt as a new prefix,
        cheapest first, among which the directory picks the one that owns the fewest prefixes it placed for every
        router; empty (the default) to leave the pick to the proposal."""
        return ()

    def on_prefix_owner(self, state: Any, dp_rank: int | None, hashes: Sequence[int], matched: int,
                        others: Sequence[float]) -> None:
        """The directory put the prompt of ``hashes`` (what :meth:`claim_hashes` gave) on rank ``dp_rank`` (None:
        not one of this router's live ranks), which is predicted to hold its first ``matched`` blocks already
        (another router sent them there); ``others`` is, per rank, the other routers' recent new-prefix prompt
        tokens as the directory counted them."""

    def on_prefix_placed(self, state: Any, dp_rank: int, prompt_tokens: int) -> None:
        """Another router's claim just placed a new prefix of ``prompt_tokens`` on rank ``dp_rank`` (a long one:
        :data:`~asyncdp.dp.prefix_directory.LONG_PLACEMENT_TOKENS`), which no snapshot shows yet."""


class ChoosingPolicy(Policy):
    """A policy that picks among the live ranks: ``select`` answers a hinted request itself and hands every other
    one, with the live ranks (never empty: :class:`UnavailableError` first), to ``choose``, which returns the
    rank. The peers' policies share this preamble; the hot-path ones (``vllm``, ``asyncdp``) keep their own."""

    def select(self, req: RequestView, snap: Snapshot | None, state: Any, now_us: int,
               rng: random.Random) -> Decision:
        if req.rank_hint is not None:
            return Decision(req.rank_hint, hinted=True)
        return Decision(self.choose(req, snap, state, alive_indices(state), now_us, rng))

    def choose(self, req: RequestView, snap: Snapshot | None, state: Any, alive: list[int], now_us: int,
               rng: random.Random) -> int:
        raise NotImplementedError


def hinted_decision(req: RequestView) -> Decision | None:
    """A hinted request bypasses the policy (routing-bench §2.0)."""
    if req.rank_hint is None:
        return None
    return Decision(req.rank_hint, hinted=True)


def alive_indices(state: Any) -> list[int]:
    alive = [i for i in range(state.n) if i not in state.excluded]
    if not alive:
        raise UnavailableError("no data-parallel rank is alive")
    return alive
