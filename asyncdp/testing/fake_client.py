"""``FakeEngineClient``: a deterministic, in-process ``EngineClient`` for tests of the HTTP layer.

Theory of operation. ``generate`` checks what the real DP client checks before the first yield (health,
admission, rank-hint ranges E2/E3, prompt length) and then yields one ``RequestOutput`` per generated token,
sleeping ``token_delay_s`` on the anyio clock before each (so trio's ``MockClock`` can drive it). The output is a
pure function of the prompt, the seed and the token index: lowercase letters with a space every sixth token, so
stop strings and logprobs are checkable; ``replies`` scripts it instead (below). As the engine's detokenizer does,
it holds back the text that could begin a stop string (its longest length - 1 characters) until it cannot. With
``prompt_logprobs`` the first output carries one entry per prompt token (None for the first).

A prefix cache is simulated as the engine's: a request's ``num_cached_tokens`` (on every output) is the longest
prefix of its prompt, in whole blocks of ``block_size`` tokens and leaving one token to compute, that an earlier
request's prompt under the same ``cache_salt`` (or none) began with (0 with ``prompt_logprobs``, which computes
every position); ``cached_tokens`` records it per request id. ``call_utility("reset_prefix_cache")`` forgets every
prompt, or refuses with ``PrefixCacheBusyError`` while a request is generating (unless ``reset_running_requests``).

Admission follows the real client: ``admit(k)`` reserves ``k`` slots all or nothing (``max_queued_requests``
bounds reserved plus running), ``generate(..., admission=)`` takes one of them, a plain ``generate`` admits
itself, and every way out of a request gives its slot back (``num_in_flight`` counts what is held). Leaving the
iteration early records the request id in ``aborted``, as a real client would send ``AbortRequests``, and every
request ends in ``metrics`` (``vllm:*`` counters) with its reason. A request id already in flight is a
``RuntimeError``, as the real client keys its requests by id: the HTTP layer must never reuse one. Switches (``healthy``, ``shutting_down``,
``queue_full``, ``fail_after_tokens`` with ``fail_after_tokens_with``, ``fail_with``) reproduce the failure
modes of spec §12.4. It is public API: users' tests may use it.

``replies(prompt, seed)``, when given, scripts the answers: called with the prompt's text (decoded) and the
sequence's seed (``seed + i`` for the i-th of ``n``), it returns the text to generate, or None for the letters.
A reply is generated one token per character (its code point as the token id) and ends as the model's end of
sequence would: ``finish_reason`` "stop", or "length" when ``max_tokens`` cuts it first. Without ``replies`` the
output is the letters, as always.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from asyncdp.api.engine_client import Admission, RankHint, SequenceGroup
from asyncdp.api.metrics import Metrics
from asyncdp.dp.hints import resolve_rank_hint
from asyncdp.errors import (
    EngineDeadError,
    InvalidRequestError,
    PrefixCacheBusyError,
    PromptTooLongError,
    QueueFullError,
    ShuttingDownError,
    UnavailableError,
)
from asyncdp.messages import Logprob, RequestOutput, TokenLogprobs
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing.fake_admission import FakeAdmission
from asyncdp.testing.tokenizer import byte_tokenizer

_LETTERS = b"abcdefghijklmnopqrstuvwxyz"


class FakeEngineClient:
    """Serves ``num_ranks`` pretend ranks (global ranks ``start_rank..``) of model ``model_name``."""

    def __init__(
        self,
        *,
        model_name: str = "fake-model",
        max_model_len: int = 256,
        token_delay_s: float = 0.0,
        num_ranks: int = 1,
        start_rank: int = 0,
        metrics: Metrics | None = None,
        max_queued_requests: int | None = None,
        block_size: int = 16,
        tokenizer: Any = None,
        replies: Callable[[str, int | None], str | None] | None = None,
    ) -> None:
        self._model_name = model_name
        self._max_model_len = max_model_len
        # ``tokenizer``: a checkpoint's, to render its chat template (the generated ids stay letters' byte values)
        self._tokenizer = byte_tokenizer() if tokenizer is None else tokenizer
        self.token_delay_s = token_delay_s
        self.replies = replies
        self.num_ranks = num_ranks
        self.start_rank = start_rank
        self.metrics = metrics if metrics is not None else Metrics(model_name=model_name)
        # Failure switches.
        self.healthy = True
        self.shutting_down = False
        self.queue_full = False
        self.fail_after_tokens: int | None = None  # raise after this many tokens: EngineDeadError, or:
        self.fail_after_tokens_with: Exception | None = None  # e.g. ShuttingDownError (server abandons it)
        self.fail_with: Exception | None = None  # raised before the first yield (e.g. to provoke a 500)
        # What happened, for assertions.
        self.submitted: list[tuple[str, list[int], SamplingParams, RankHint | None]] = []
        self.routing_keys: dict[str, str | None] = {}  # request id -> the routing key generate() was given
        self.cached_tokens: dict[str, int] = {}  # request id -> its prefix-cache hit
        self.block_size = block_size
        # every whole-block prefix of the prompts seen, after the salt they came with (None: unsalted)
        self._cached_prefixes: set[tuple[str | int | None, ...]] = set()
        self.finished: list[str] = []
        self.aborted: list[str] = []
        self.paused = False
        self.utility_calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self._num_active = 0
        self.max_queued_requests = max_queued_requests
        self._num_reserved = 0  # admitted through admit() and not yet taken by a generate()
        self._num_holding = 0  # generate() calls holding a slot
        self._in_flight_ids: set[str] = set()
        self._changed: anyio.Event | None = None

    # ------------------------------------------------------------------ EngineClient
    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def is_healthy(self) -> bool:
        return self.health_problem() is None

    def health_problem(self) -> str | None:
        if self.shutting_down:
            return "The server is shutting down."
        return None if self.healthy else "No engine can serve requests."

    def server_info(self) -> dict[str, Any]:
        ranks = [
            {"dp_rank": self.start_rank + i, "local_index": i, "local": True,
             "state": "paused" if self.paused else ("ready" if self.healthy else "dead"), "last_seen_s": 0.0}
            for i in range(self.num_ranks)
        ]
        return {
            "asyncdp_version": "0.1.0", "model": self._model_name, "is_moe": False,
            "enable_expert_parallel": False, "mode": "single" if self.num_ranks == 1 else "internal",
            "dp_size": self.num_ranks, "dp_size_local": self.num_ranks, "dp_start_rank": self.start_rank,
            "managed_ranks": ranks, "api_process_count": 1, "api_process_rank": 0, "lb_policy": "vllm",
            "wave": None, "coordinator": None, "processes": [],
            "parallel_config": {"data_parallel_size": self.num_ranks, "_api_process_count": 1,
                                "_api_process_rank": 0},
        }

    def load(self) -> dict[str, Any]:
        """A ``GET /load`` document with the fake's ranks, idle (the format of asyncdp.apiserver.load_view)."""
        ranks = [{"dp_rank": self.start_rank + i, "local_index": i, "up": self.healthy, "waiting": 0, "running": 0,
                  "kv_cache_usage": 0.0, "prefix_cache_queries": 0, "prefix_cache_hits": 0, "inflight": 0,
                  "wave": 0, "wave_running": False, "age_s": None} for i in range(self.num_ranks)]
        return {"seq": 0, "age_s": None, "mode": "single" if self.num_ranks == 1 else "internal",
                "dp_size": self.num_ranks, "api_process_rank": 0, "api_process_count": 1, "wave": None,
                "coordinator": None, "ranks": ranks}

    async def call_utility(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.utility_calls.append((method, args, kwargs))
        if self.shutting_down:
            raise ShuttingDownError("server shutting down")
        if method == "pause":
            self.paused = True
            return None
        if method == "resume":
            self.paused = False
            return None
        if method == "is_paused":
            return self.paused
        if method == "reset_prefix_cache":  # vLLM's: refused while requests hold KV blocks, unless they are preempted
            if self._num_active and not kwargs.get("reset_running_requests"):
                raise PrefixCacheBusyError(f"{self._num_active} requests in flight hold KV blocks")
            self._cached_prefixes.clear()
            return True
        raise InvalidRequestError(f"unknown utility method {method!r}")

    def admit(self, num_sequences: int) -> FakeAdmission:
        self._check_serving()
        if num_sequences < 1:
            raise ValueError(f"admit() needs at least one sequence, got {num_sequences}")
        if self.max_queued_requests is not None and num_sequences > self.max_queued_requests:
            raise InvalidRequestError(f"the request asks for {num_sequences} sequences, more than "
                                      f"--max-queued-requests {self.max_queued_requests} admits", field="n")
        if self.max_queued_requests is not None and self.num_in_flight + num_sequences > self.max_queued_requests:
            raise QueueFullError(
                f"{num_sequences} sequences do not fit: {self.num_in_flight} in flight, --max-queued-requests "
                f"{self.max_queued_requests}; retry later")
        self._num_reserved += num_sequences
        self._notify()
        return FakeAdmission(self, num_sequences)

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        rank_hint: RankHint | None = None,
        admission: Admission | None = None,
        routing_key: str | None = None,
        group: SequenceGroup | None = None,
    ) -> AsyncIterator[RequestOutput]:
        # Checks run at the first __anext__, before the first yield, as in the real client.
        self.routing_keys[request_id] = routing_key
        return self._generate(request_id, list(prompt_token_ids), params, rank_hint, admission)

    # ------------------------------------------------------------------ test helpers
    @property
    def num_active(self) -> int:
        """Requests currently being generated."""
        return self._num_active

    @property
    def num_in_flight(self) -> int:
        """Admission slots in use: reserved by ``admit`` and not yet taken, plus those running requests hold."""
        return self._num_reserved + self._num_holding

    async def wait_until(self, predicate: Any) -> None:
        """Wait until ``predicate()`` is true; re-checked whenever a request starts, yields or ends."""
        while not predicate():
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    def expected_token_ids(self, prompt_token_ids: list[int], seed: int | None, count: int) -> list[int]:
        """The ids ``generate`` produces for this prompt (before stop strings), for assertions."""
        return [self._token_at(prompt_token_ids, seed, k) for k in range(count)]

    # ------------------------------------------------------------------ internals
    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    @staticmethod
    def _token_at(prompt: list[int], seed: int | None, k: int) -> int:
        if k % 6 == 5:
            return ord(" ")
        base = (sum(prompt) + len(prompt) + (seed or 0)) % 26
        return _LETTERS[(base + 3 * k) % 26]

    def _check_serving(self) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        if self.shutting_down:
            raise ShuttingDownError("the server is shutting down")
        if not self.healthy:
            raise UnavailableError("no engine can serve the request")
        if self.queue_full:
            raise QueueFullError("the admission queue is full; retry later")

    def _take_slot(self, admission: Admission | None) -> None:
        if admission is None:  # admitted on its own, as a one-sequence admit()
            self._check_serving()
            if self.max_queued_requests is not None and self.num_in_flight >= self.max_queued_requests:
                raise QueueFullError("too many requests in flight; retry later")
        elif self.fail_with is not None or self.shutting_down or not self.healthy:
            self._check_serving()  # admitted, but the server stopped serving since
        if admission is not None and (
                not isinstance(admission, FakeAdmission) or admission.owner is not self or not admission.take()):
            # The HTTP layer started more sequences than it admitted, or one after releasing: a bug there.
            raise RuntimeError("generate() called with an admission that has no slot left")
        self._num_holding += 1

    def _check_hint(self, hint: RankHint | None) -> int:
        if hint is None:
            return self.start_rank
        ranks = range(self.start_rank, self.start_rank + self.num_ranks)
        index = resolve_rank_hint(ranks, hint.local_index, hint.global_rank)
        return self.start_rank + (index or 0)

    def _prefix_cache_hit(self, request_id: str, prompt: list[int], params: SamplingParams) -> int:
        """The cached prefix of ``prompt`` (whole blocks, one token left to compute); then cache its blocks."""
        bs, salt = self.block_size, params.cache_salt
        hit = 0
        if params.prompt_logprobs is None:
            for k in range(1, (len(prompt) - 1) // bs + 1):
                if (salt, *prompt[:k * bs]) not in self._cached_prefixes:
                    break
                hit = k * bs
        self._cached_prefixes.update((salt, *prompt[:k * bs]) for k in range(1, len(prompt) // bs + 1))
        self.cached_tokens[request_id] = hit
        return hit

    def _prompt_logprobs(self, prompt: list[int], num_top: int) -> list[TokenLogprobs | None]:
        return [None] + [self._logprobs(t, k, num_top, base=-1.0) for k, t in enumerate(prompt[1:])]

    def _logprobs(self, token: int, k: int, num_top: int, base: float = -0.05) -> TokenLogprobs:
        # The sampled token is the most likely one; the alternatives are the letters after it.
        lp = base - 0.1 * (k % 4)
        alternatives = [Logprob(token_id=_LETTERS[(token + j) % 26], logprob=lp - 1.0 - j) for j in range(num_top)]
        top = ([Logprob(token_id=token, logprob=lp)] + alternatives)[:num_top]
        return TokenLogprobs(token_id=token, logprob=lp, top=tuple(top))

    async def _generate(
        self, request_id: str, prompt: list[int], params: SamplingParams, hint: RankHint | None,
        admission: Admission | None,
    ) -> AsyncIterator[RequestOutput]:
        self._take_slot(admission)
        try:
            engine = self._check_hint(hint)
            if len(prompt) + 1 > self._max_model_len:
                raise PromptTooLongError(
                    f"prompt has {len(prompt)} tokens; max_model_len is {self._max_model_len}.", field="prompt")
            reply = self.replies(self._tokenizer.decode(prompt), params.seed) if self.replies is not None else None
            if reply == "":
                raise ValueError("FakeEngineClient.replies returned an empty reply (a model writes at least a token)")
            if request_id in self._in_flight_ids:  # the real client would mix the two requests' outputs up
                raise RuntimeError(f"request id {request_id!r} is already in flight")
        except BaseException:
            self._num_holding -= 1
            raise
        self._in_flight_ids.add(request_id)
        self.submitted.append((request_id, prompt, params, hint))
        num_cached = self._prefix_cache_hit(request_id, prompt, params)
        limit = params.max_tokens if params.max_tokens is not None else self._max_model_len - len(prompt)
        limit = min(limit, self._max_model_len - len(prompt))
        if reply is not None:
            limit = min(limit, len(reply))
        now = anyio.current_time()
        start, first_token_s, last_s = now, None, now
        metrics = self.metrics
        text, sent = "", 0  # the text generated, and how much of it went out
        holdback = 0 if params.include_stop_str_in_output else max((len(s) for s in params.stop), default=1) - 1
        reason = "abort"
        completed = False
        self._num_active += 1
        self._notify()
        try:
            for k in range(limit):
                if self.fail_after_tokens is not None and k >= self.fail_after_tokens:
                    raise self.fail_after_tokens_with or EngineDeadError(f"engine {engine} died")
                await anyio.sleep(self.token_delay_s)
                token = self._token_at(prompt, params.seed, k) if reply is None else ord(reply[k])
                piece = chr(token)
                now = anyio.current_time()
                # as the DP client does: tokens and per-token latencies counted as they arrive
                if first_token_s is None:
                    first_token_s = now - start
                    metrics.record_first_token(str(engine), first_token_s)
                    metrics.add_tokens(str(engine), len(prompt), 1)
                else:
                    metrics.record_token_gaps(str(engine), now - last_s)
                    metrics.add_tokens(str(engine), 0, 1)
                last_s = now
                text += piece
                stop_hit = next((s for s in params.stop if text.endswith(s)), None)
                ended = reply is not None and k == len(reply) - 1  # the reply's end: the model's EOS
                finished = stop_hit is not None or ended or k == limit - 1
                reason = "stop" if stop_hit is not None or ended else "length"
                # as the engine's detokenizer does: the tail that could begin a stop string is held back
                if stop_hit is not None and not params.include_stop_str_in_output:
                    end = len(text) - len(stop_hit)
                else:
                    end = len(text) if finished else max(sent, len(text) - holdback)
                piece, sent = text[sent:end], max(sent, end)
                out = RequestOutput(
                    request_id=request_id, new_token_ids=[token], new_text=piece, finished=finished,
                    finish_reason=reason if finished else None, stop_reason=stop_hit,
                    logprobs=[self._logprobs(token, k, params.logprobs)] if params.logprobs is not None
                    else None,
                    prompt_logprobs=self._prompt_logprobs(prompt, params.prompt_logprobs)
                    if k == 0 and params.prompt_logprobs is not None else None,
                    num_prompt_tokens=len(prompt), num_cached_tokens=num_cached,
                )
                completed = finished
                self._notify()
                yield out
                if finished:
                    break
        finally:
            self._in_flight_ids.discard(request_id)
            self._num_active -= 1
            self._num_holding -= 1
            if completed:
                self.finished.append(request_id)
            else:
                self.aborted.append(request_id)
                reason = "abort"
            if completed:  # a caller that left early is no success (as in vLLM)
                metrics.record_request_finished(
                    str(engine), reason, last_s - start, prompt_tokens=len(prompt), generation_tokens=len(text),
                    decode_s=0.0 if first_token_s is None else last_s - start - first_token_s)
            self._notify()

