"""The link messages (spec §5.2): what engines, clients and the coordinator say to each other, and the handshake.

Frozen msgspec structs tagged by ``type`` (the class name); :data:`asyncdp.messages.Message` is their union, with
the node link's messages (:mod:`.node_link`), which the codec of :mod:`asyncdp.messages` decodes.
``PROTOCOL_VERSION`` is carried in ``Hello`` and ``NodeHello`` and checked by the head at handshake (E5). Field
names follow the DP vocabulary of the specification: ``dp_rank``, ``wave``, ``client_index``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from asyncdp.errors import AsyncDPError, PauseError, PrefixCacheBusyError
from asyncdp.sampling_params import SamplingParams

PROTOCOL_VERSION = 15  # 2: PrefixClaim and PrefixOwner on the coordinator link; 3: PrefixPlaced;
# 4: UtilityResult.error_kind; 5: RequestOutput.error_field and finish_reason "error"; 6: the ranks' cache_fill
# (SchedulerStats, RankStats, StatsSnapshot), StructuredOutputs.param, RankDraining, and the leaving flag at the end
# of the MoE sync all-reduce (asyncdp.dp.lockstep: ranks of different builds would sum vectors of different lengths);
# 7: NodeStopping on the node link; 8: the mean step time and the stopping flag in the MoE sync all-reduce (ranks of
# different builds would sum vectors of different lengths); 9: NodeStopped on the node link (a head of 8 would drop
# the link on a frame it cannot decode); 10: DPGroupInfo.launch_nonce, which the sealed rendezvous keys are derived
# from (ranks of different builds would derive different keys and fail the rendezvous on each other's values);
# 11: SamplingParams.cache_salt in AddRequest (a rank of 10 would drop the salt and share its prompts' cached blocks)
# 12: SamplingParams.priority in AddRequest (a rank of 11 would drop it and serve the request first come, first served)
# 13: scheduling_policy in the configuration summary (NodeHello, Hello, Ready): a launch of 12 would be refused for
# a scheduling_policy=<missing> instead of by its protocol version
# 14: SamplingParams.structured.start_markers in AddRequest (a rank of 13 would drop them and leave gpt-oss's
# answer after a final header with a content type, and qwen3's after a <tool_call> while thinking, unconstrained)
# 15: PrefixCacheReset, and UtilityResult.error_kind PREFIX_CACHE_BUSY (POST /reset_prefix_cache: a rank of 14 would
# refuse the utility call, and a client or coordinator of 14 would drop the notice and keep the dropped prefixes)


class _Msg(msgspec.Struct, frozen=True, tag=True, kw_only=True, array_like=False):
    pass


# ---------------------------------------------------------------- shared payloads (untagged)


class ClientAddr(msgspec.Struct, frozen=True, kw_only=True):
    client_index: int
    addr: str  # "unix:/path" or "tcp:host:port"


class CoordinatorAddrs(msgspec.Struct, frozen=True, kw_only=True):
    engine_addr: str
    client_addr: str


LAUNCH_NONCE_BYTES = 16


class DPGroupInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A MoE DP group's rendezvous (spec §5.5), as the head sends it to every rank in ``HandshakeInit``."""

    master_addr: str
    master_port: int
    dp_size: int
    backend: str  # "gloo" | "nccl"
    # [ours] LAUNCH_NONCE_BYTES random bytes the head draws when it hosts the store, once per launch: with a
    # deployment secret the sealed rendezvous keys are derived from them too, so a value sealed in another launch
    # of the deployment (same secret, same store address and port) opens in no other (asyncdp.model.rendezvous)
    launch_nonce: bytes


class Logprob(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    token_id: int
    logprob: float


class TokenLogprobs(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Logprob of the sampled token plus the top-n alternatives (n = SamplingParams.logprobs)."""

    token_id: int
    logprob: float
    top: tuple[Logprob, ...] = ()


class RequestOutput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What one step produced for one request: a delta, not the cumulative result."""

    request_id: str
    new_token_ids: list[int] = []
    new_text: str = ""
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" (with ``error_type``)
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    logprobs: list[TokenLogprobs] | None = None
    # With SamplingParams.prompt_logprobs: one entry per prompt token (None for the first, which has no
    # context), sent once, on the request's first output.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    first_token_time: float | None = None
    # Seconds the request waited in the rank's queue before it was first scheduled (the rank's clock), sent once,
    # on its first output: ``vllm:request_queue_time_seconds``.
    queue_time_s: float | None = None
    # Set when the engine refused the request outright (never scheduled): "invalid_request" (bad input the
    # front end could not check) or "unavailable" (shutting down); or "abandoned": the rank's own drain deadline
    # aborted it (the rank is stopping, whoever asked); or "invalid_request" with ``finish_reason="error"``: the
    # request's own input failed mid-generation (its grammar hit a limit), so its text so far is no answer.
    # ``error`` says why, ``error_field`` names the parameter at fault when there is one; the client raises.
    error_type: str | None = None
    error: str | None = None
    error_field: str | None = None


class SchedulerStats(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A rank's scheduler state. Gauges (running, waiting, KV usage, step, wave, wave_running) are current values.

    Counters (prefix-cache query/hit tokens, preemptions, dummy steps, completed waves): ``EngineCore.stats()``
    returns them cumulative, but in ``EngineOutputs.scheduler_stats`` they are DELTAS since the rank last attached
    stats to a client message. A rank attaches each stats object to exactly one client, so the deltas partition
    the rank's totals: every API process adds what it receives to its counters, and the sum over API processes
    is exact (with cumulative values a client could not tell what its peers already counted).
    """

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0  # tokens looked up (counter: see the class docstring)
    prefix_cache_hits: int = 0  # tokens found (counter)
    num_preemptions: int = 0  # (counter)
    prefill_tokens: int = 0  # prompt tokens the rank still owes (gauge; Scheduler.prefill_tokens)
    cache_fill: float = 0.0  # the share of the KV blocks holding cached prompt content (gauge; [ours])
    step: int = 0
    wave: int = 0
    # MoE lockstep (dp > 1), exported as asyncdp:dp_* metrics (spec §12.3); counters as above.
    num_dummy_steps: int = 0
    waves_completed: int = 0
    wave_running: bool = False


# ---------------------------------------------------------------- handshake


class Hello(_Msg, frozen=True):
    protocol_version: int
    dp_rank: int
    local: bool
    headless: bool
    host: str
    pid: int
    launcher_pid: int = 0  # the engine's parent: tells the head which launch (node) a remote engine belongs to
    # Its launch's parallel configuration (its launcher's plan summary, as a NodeHello carries it): the front-end
    # checks it against its own before HandshakeInit, so that a rank configured otherwise is refused by field
    # before it joins the DP group (E6 at Ready comes after the group formed: too late for a MoE group, whose
    # collectives then mismatch). Empty: not checked here (the Ready check remains).
    config_summary: dict[str, Any] = {}


class HandshakeInit(_Msg, frozen=True):
    clients: list[ClientAddr]
    coordinator: CoordinatorAddrs | None
    dp_group: DPGroupInfo | None
    client_count: int


class HandshakeError(_Msg, frozen=True):
    reason: str


class Ready(_Msg, frozen=True):
    dp_rank: int
    local: bool
    headless: bool
    config_hash: str | None
    config_summary: dict[str, Any]


class EngineReady(_Msg, frozen=True):
    dp_rank: int
    max_model_len: int
    num_kv_blocks: int
    block_size: int
    coordinator_client_addr: str | None
    pid: int = 0


# ---------------------------------------------------------------- client <-> engine


class AddRequest(_Msg, frozen=True):
    request_id: str
    client_index: int
    wave: int
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    pinned: bool = False


class AbortRequests(_Msg, frozen=True):
    request_ids: list[str]


class UtilityCall(_Msg, frozen=True):
    client_index: int
    call_id: int
    method: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


PAUSE_ERROR = "pause"  # UtilityResult.error_kind of a pause/resume misuse (PauseError on both sides)
PREFIX_CACHE_BUSY = "prefix_cache_busy"  # of a reset_prefix_cache refused: KV blocks in use (PrefixCacheBusyError)
# UtilityResult.error_kind -> the error a client raises for it (a failure of any other kind: AsyncDPError)
ERROR_KINDS: dict[str, type[AsyncDPError]] = {PAUSE_ERROR: PauseError, PREFIX_CACHE_BUSY: PrefixCacheBusyError}


class UtilityResult(_Msg, frozen=True):
    call_id: int
    ok: bool
    value: Any = None
    error: str | None = None
    error_kind: str | None = None  # a key of ERROR_KINDS, or None for any other failure


class EngineOutputs(_Msg, frozen=True):
    dp_rank: int
    outputs: list[RequestOutput]
    finished_request_ids: list[str]
    scheduler_stats: SchedulerStats | None
    timestamp: float


class EngineDead(_Msg, frozen=True):
    dp_rank: int
    reason: str


class RankDraining(_Msg, frozen=True):
    """Engine -> every client: this rank stops in order (its node or process got a stop): its requests finish,
    within its drain bound, and new ones go to the other ranks [ours]."""

    dp_rank: int


class PrefixCacheReset(_Msg, frozen=True):
    """Engine -> every client and the coordinator: this rank dropped its prefix cache (``POST /reset_prefix_cache``),
    so no router may count on the prefixes it sent there [ours]. Sent before the caller's ``UtilityResult``."""

    dp_rank: int


# ---------------------------------------------------------------- coordinator


class Subscribe(_Msg, frozen=True):
    dp_rank: int | None = None  # engine
    client_id: int | None = None  # client (client_index)


class CoordinatorReady(_Msg, frozen=True):
    pass


class RankStats(_Msg, frozen=True):
    dp_rank: int
    num_waiting: int
    num_running: int
    kv_cache_usage: float
    step: int = 0
    wave: int = 0
    prefill_tokens: int = 0  # prompt tokens still to compute (Scheduler.prefill_tokens); routing-bench §1.1
    cache_fill: float = 0.0  # the share of the KV blocks holding cached content (BlockManager.cache_fill) [ours]


class WaveComplete(_Msg, frozen=True):
    wave: int
    dp_rank: int = 0


class StartWaveRequest(_Msg, frozen=True):
    dp_rank: int
    wave: int


class FirstRequest(_Msg, frozen=True):
    exclude_rank: int
    wave: int


class StartWave(_Msg, frozen=True):
    wave: int
    exclude_rank: int | None


class PrefixClaim(_Msg, frozen=True):
    """Client -> coordinator: where does this new prefix go? (:mod:`asyncdp.dp.prefix_directory`)"""

    seq: int  # the client's, echoed in the answer
    hashes: list[int]  # the prompt's chained block hashes, at most MAX_CLAIM_BLOCKS
    proposal: int  # the global rank the client's own policy picked
    prompt_tokens: int
    first_rank: int  # the client's managed ranks, first and last (inclusive)
    last_rank: int
    candidates: list[int] = []  # the global ranks the client would accept for a new prefix, cheapest first
    # a run after a prefix the client placed: look it up, or record the proposal as its owner (no placement)
    deep: bool = False


class PrefixOwner(_Msg, frozen=True):
    """Coordinator -> client: the answer to ``PrefixClaim`` ``seq``."""

    seq: int
    owner: int  # the global rank the request goes to
    matched: int  # leading blocks of the claim's hashes the owner is predicted to hold
    others: list[float]  # per rank first_rank..last_rank: the other clients' recent new-prefix prompt tokens


class PrefixPlaced(_Msg, frozen=True):
    """Coordinator -> every other client: a claim just placed a long new prefix (``prompt_tokens`` to prefill) on
    global rank ``rank``, which no snapshot shows yet (:mod:`asyncdp.dp.prefix_directory`, "Long placements")."""

    rank: int
    prompt_tokens: int


class StatsSnapshot(_Msg, frozen=True):
    counts: list[tuple[int, int, float]] | None
    wave: int
    running: bool
    seq: int
    # every rank's RankStats.prefill_tokens, in the order of counts; None where counts is None [ours]
    prefill_tokens: list[int] | None = None
    # every rank's RankStats.cache_fill, likewise [ours]
    cache_fill: list[float] | None = None


class Teardown(_Msg, frozen=True):
    reason: str
    dead_rank: int | None = None
    # True when the whole deployment is stopping in order (the launcher told the coordinator first): a rank
    # that has not seen its own shutdown signal yet leaves in order too, instead of reporting a failure.
    orderly: bool = False


class Heartbeat(_Msg, frozen=True):
    sender: str
    seq: int


class Goodbye(_Msg, frozen=True):
    dp_rank: int
