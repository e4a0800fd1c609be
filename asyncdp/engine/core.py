"""The synchronous engine core of one rank: requests in, one ``step()`` at a time, output deltas out.

``step()`` is a plain function (run on the rank's execution thread): apply queued aborts, schedule a batch,
execute it, append the sampled tokens, detokenize, check stop conditions, free finished requests, and return
``StepOutputs`` (``RequestOutput`` deltas in scheduling order, finished ids, timings).

Aborts. ``abort_requests(ids)`` only queues the ids (a deque append, safe from any thread, also while a step runs);
the aborted requests appear as finished outputs (``finish_reason="abort"``) in the result of the next ``step()``,
which applies them before scheduling and again right after the forward, so a request aborted during a step gets no
further tokens. ``pause("abort")`` aborts at once; its outputs also come with the next ``step()``. A step that has
only aborts to report runs no forward (``StepOutputs.executed`` is False). Everything else (``add_request``,
``pause``, ``resume``) must be called from the thread that calls ``step()``, between steps.

Stop conditions, checked after each sampled token: a stop token id or EOS (unless ``ignore_eos``) and stop
strings only once ``min_tokens`` outputs exist; ``max_tokens`` and ``max_model_len`` always ("length"). The
text of a terminating stop/EOS token is not included (as vLLM); its id is.

Prompt logprobs (``SamplingParams.prompt_logprobs``): the executor returns, per prefill chunk, the logprobs of the
prompt tokens that chunk predicts; the core files them on the ``Request`` by position and sends the whole list
once, in the request's first output (the one with its first token), then drops it. Such a request takes no
prefix-cache hit until then (the scheduler skips the lookup: cached positions have no logits); a preemption
before the first output recomputes and overwrites the same positions, one after it computes none.

Structured outputs (``SamplingParams.structured``): ``add_request`` gives the request a grammar matcher
(``asyncdp.engine.structured.GrammarMatchers``), or with ``compile_grammar=False`` queues it unscheduled, counted
as waiting, until ``grammar_compiled`` (a rank compiles it in a worker thread meanwhile); while a live request has
one, each step attaches the constrained rows' allowed-token bitmask to the batch, and every sampled token advances
its matcher. A completed grammar finishes the request with ``stop``. A matcher that failed (a grammar limit hit
mid-generation: its mask then allows only EOS) finishes it with ``finish_reason="error"`` and
``error_type="invalid_request"`` naming the grammar field, checked before EOS, so the text cut short never reads
as a ``stop``. Only an executor with ``applies_token_masks`` takes such requests. A grammar with ``start_after``
(a reasoning model's ``</think>``) or ``start_markers`` (gpt-oss's final-channel header) applies from the token
after the first of them is generated (``GrammarMatchers``).

A failed forward (the executor raised, or an interrupt came in it) leaves ``step()`` once the scheduler has
unpublished the blocks it never wrote and requeued its requests for recompute (``Scheduler.unschedule``);
the aborts the step applied are reported by the next one.

An interrupted call. An exception anywhere else in ``step()``, ``add_request()`` or ``pause()`` (Ctrl-C in the
offline ``LLM`` landing in the scheduler, the block manager or the token bookkeeping) may leave them half-updated:
a request in no queue, a block taken from the free list but owned by nobody, a block published to the prefix cache
that no forward wrote. Such a call leaves ``_broken`` set, and the next of those calls first starts over: every
request it held is reported aborted (by the next ``step()``), every block is freed and the prefix cache is emptied.
The outputs the interrupted step had made are lost; the offline ``LLM``, the one caller that carries on after an
interrupt, aborts every request it was waiting for anyway.

KV blocks: block 0 is never given to a request; an executor may use it as scratch for dummy batches.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.block_manager import BlockManager
from asyncdp.engine.detokenizer import IncrementalDetokenizer, make_decode_fn
from asyncdp.engine.executor import Executor, ModelBatch, ScheduledChunk, StepResult
from asyncdp.engine.request import Request, RequestStatus
from asyncdp.engine.scheduler import PauseMode, Scheduler
from asyncdp.engine.structured import GrammarMatchers
from asyncdp.errors import ConfigError, InvalidRequestError, PromptTooLongError
from asyncdp.messages import RequestOutput, SchedulerStats, TokenLogprobs
from asyncdp.sampling_params import SamplingParams, StructuredOutputs, check_priority, with_token_filters
from asyncdp.sampling_params.structured import grammar_failed


@dataclass(slots=True)
class StepOutputs:
    outputs: list[RequestOutput] = field(default_factory=list)
    finished_request_ids: list[str] = field(default_factory=list)
    executed: bool = False  # a real forward ran
    num_scheduled_tokens: int = 0
    forward_time_s: float = 0.0  # reported by the executor
    step_time_s: float = 0.0  # the whole step() call
    extra: dict[str, float] = field(default_factory=dict)  # the executor's StepResult.extra (sim_step_s)


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        tokenizer: Any,
        *,
        eos_token_ids: Iterable[int],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.executor = executor
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self._clock = clock
        num_blocks = executor.num_kv_blocks
        capacity_tokens = (num_blocks - 1) * config.block_size
        max_model_len = executor.max_model_len
        if config.max_model_len is not None and config.max_model_len > capacity_tokens:
            raise ConfigError(
                f"--max-model-len {config.max_model_len} does not fit in the KV cache "
                f"({num_blocks} blocks of {config.block_size} tokens, one reserved): lower --max-model-len or "
                f"raise --num-kv-blocks / the KV cache memory.")
        self.max_model_len = min(max_model_len, capacity_tokens)
        self.block_manager = BlockManager(num_blocks, config.block_size, reserve_scratch_block=True,
                                          enable_prefix_caching=config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens, policy=config.scheduling_policy)
        self._decode = make_decode_fn(tokenizer) if tokenizer is not None else None
        self._vocab_size: int | None = getattr(executor, "vocab_size", None)
        self._grammars: GrammarMatchers | None = None  # created by the first structured-output request
        self._pending_aborts: deque[str] = deque()
        self._pending_outputs: list[RequestOutput] = []  # finished by pause("abort"), reported by next step()
        self._broken = False  # a call that changes the scheduler's state broke off midway: see "An interrupted call"
        self.num_steps = 0

    # ------------------------------------------------------------------ requests

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        arrival_time: float | None = None,
        client_index: int = 0,
        validated: bool = False,
        compile_grammar: bool = True,
    ) -> None:
        """``validated``: the caller ran ``params.validate()`` already (the API server, for a rank's requests).
        ``compile_grammar=False``: the request waits unscheduled for :meth:`grammar_compiled` (a rank compiles it)."""
        if not validated:
            params.validate()
        n = len(prompt_token_ids)
        if n == 0:
            raise InvalidRequestError("The prompt must contain at least one token.", field="prompt")  # not too long
        if n >= self.max_model_len:
            raise PromptTooLongError(f"The prompt has {n} tokens; with at least one generated token it exceeds "
                                     f"max_model_len ({self.max_model_len}).", field="prompt")
        if request_id in self.scheduler.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use.", field="request_id")
        check_priority(self.scheduler.policy, params.priority)  # (vLLM's 400 under fcfs)
        if params.stop and self._decode is None:
            raise InvalidRequestError("stop strings need a tokenizer; this engine has none.", field="stop")
        vocab = self._vocab_size
        if vocab is not None and (min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab):
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab}).", field="prompt")
        params = with_token_filters(params, self.tokenizer, vocab)  # bad_words tokenized, ids in the vocabulary
        room = self.max_model_len - n
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        if params.min_tokens > max_tokens:  # never a silent stop at max_model_len short of min_tokens
            raise InvalidRequestError(f"min_tokens ({params.min_tokens}) cannot exceed the {max_tokens} tokens the "
                                      f"prompt leaves in max_model_len ({self.max_model_len}).", field="min_tokens")
        req = Request(request_id, list(prompt_token_ids), params,
                      arrival_time=self._clock() if arrival_time is None else arrival_time,
                      client_index=client_index, max_tokens=max_tokens, queued_time=self._clock())
        if self._decode is not None:
            req.detokenizer = IncrementalDetokenizer(self._decode, prompt_token_ids, params)
        pending = False  # (a grammar compiled already is copied at once; refused at once where none can apply)
        if params.structured is not None:
            pending = not self.grammar_matchers(params.structured).add(request_id, params.structured,
                                                                       compile_grammar=compile_grammar)
        self._start_change()
        self.scheduler.add(req, grammar_pending=pending)
        self._broken = False

    def grammar_compiled(self, request_id: str) -> bool | None:
        """A request added with ``compile_grammar=False`` has its grammar compiled (``GrammarMatchers.prepare``):
        True, it is queued for a step; False, its template was evicted meanwhile (compile it again); None, it no
        longer waits (aborted). A grammar that failed to compile: abort the request (its owner answers it)."""
        req = self.scheduler.grammar_waiting.get(request_id)
        if req is None or req.sampling_params.structured is None:
            return None
        return self.grammar_matchers().add(request_id, req.sampling_params.structured,
                                           compile_grammar=False) and self.scheduler.grammar_ready(request_id)

    def grammar_matchers(self, structured: StructuredOutputs | None = None) -> GrammarMatchers:
        """The matchers, made on first use (InvalidRequestError where no grammar can apply). A rank builds their
        tokenizer in a background thread once ready (``warm``), and compiles each grammar in a worker thread first."""
        if self._grammars is None:
            self._grammars = GrammarMatchers.for_engine(self.executor, self.tokenizer, self._vocab_size,
                                                        self.eos_token_ids, structured)
        return self._grammars

    def _drop_grammars(self, requests: Iterable[Request]) -> None:
        grammars = self._grammars
        if grammars is not None and grammars.matchers:
            for req in requests:
                grammars.discard(req.request_id)

    def _start_change(self) -> None:
        """Enter a change of the scheduler's state; the caller clears ``_broken`` once it is complete."""
        if self._broken:
            aborted = self.scheduler.reset()
            if self._grammars is not None:
                self._grammars.clear()
            self._pending_outputs.extend(req.abort_output() for req in aborted)
        self._broken = True

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Queue aborts (thread-safe). They are reported as finished outputs by the next ``step()``."""
        self._pending_aborts.extend(request_ids)

    def has_unfinished(self) -> bool:
        """Unfinished requests (in any pause state) or queued aborts still to report."""
        return self.scheduler.has_unfinished() or bool(self._pending_aborts) or bool(self._pending_outputs)

    def has_steppable_work(self) -> bool:
        """Whether ``step()`` would run a forward or report something now (pause state respected)."""
        return self.scheduler.has_steppable_work() or bool(self._pending_aborts) or bool(self._pending_outputs)

    def num_unfinished_for_sync(self) -> int:
        return self.scheduler.num_unfinished_for_sync()

    # ------------------------------------------------------------------ pause

    def pause(self, mode: PauseMode = "abort") -> None:
        """Enter a pause state now (§8.6); with ``abort`` every request finishes at once and the
        ``finish_reason="abort"`` outputs are returned by the next ``step()``."""
        if mode != "abort":  # only a state to set (the scheduler checks the mode)
            self.scheduler.pause(mode)
            return
        self._start_change()
        aborted = self.scheduler.pause(mode)
        self._drop_grammars(aborted)
        self._pending_outputs.extend(req.abort_output() for req in aborted)
        self._broken = False

    def resume(self) -> None:
        self.scheduler.resume()

    def is_paused(self) -> bool:
        return self.scheduler.pause_state != "unpaused"

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM's, between steps: forget every cached block (the prefix-cache counters keep counting); refused (False,
        nothing changed) while a request holds blocks, unless ``reset_running_requests`` preempts the running first."""
        self._start_change()
        done = self.scheduler.reset_prefix_cache(reset_running_requests)
        self._broken = False
        return done

    # ------------------------------------------------------------------ stepping

    def _apply_aborts(self, out: StepOutputs) -> None:
        pending = self._pending_aborts  # (other threads may append while this pops what it saw)
        aborted = self.scheduler.abort([pending.popleft() for _ in range(len(pending))])
        self._drop_grammars(aborted)
        for req in aborted:
            out.finished_request_ids.append(req.request_id)
            out.outputs.append(req.abort_output())

    def step(self, *, throttle_new_prefills: bool = False) -> StepOutputs:
        """Report what finished outside a forward, schedule, execute, and turn the sampled tokens into outputs."""
        t0 = time.perf_counter()
        self._start_change()
        out = self.take_pending()
        batch = self.scheduler.schedule(throttle_new_prefills=throttle_new_prefills, now=self._clock())
        if not batch.empty:
            self._execute(batch, out)
        self._broken = False
        out.step_time_s = time.perf_counter() - t0
        return out

    def take_pending(self) -> StepOutputs:
        """What :meth:`step` reports before it schedules (all there is to report where no forward can run:
        a MoE rank whose group ended): the requests ``pause("abort")`` finished and the queued aborts."""
        out = StepOutputs()
        if self._pending_outputs:
            out.outputs, self._pending_outputs = self._pending_outputs, []
            out.finished_request_ids.extend(o.request_id for o in out.outputs)
        if self._pending_aborts:
            self._apply_aborts(out)
        return out

    def _execute(self, batch: ModelBatch, out: StepOutputs) -> None:
        grammars = self._grammars
        try:
            if grammars is not None and grammars.matchers:
                batch.token_masks = grammars.token_masks(batch.chunks)
            else:
                grammars = None
            result = self.executor.execute(batch)
        except BaseException:  # nothing of the batch was computed: see "A failed forward" above
            self.scheduler.unschedule(batch)
            self._pending_outputs[:0] = out.outputs  # the aborts it applied: the next step reports them
            self._broken = False  # a consistent state: its requests are recomputed, nothing is dropped
            raise
        self.num_steps += 1
        out.executed = True
        out.num_scheduled_tokens = batch.num_prefill_tokens + batch.num_decode_seqs
        out.forward_time_s = result.forward_time_s
        out.extra = result.extra
        if self._pending_aborts:  # aborted while the forward ran: they get no more tokens
            self._apply_aborts(out)
        if result.prompt_logprobs is not None:
            self._file_prompt_logprobs(batch.chunks, result.prompt_logprobs)
        finished = self._append_tokens(batch, result, grammars, out.outputs)
        if finished:
            self._drop_grammars(finished)
            self.scheduler.retire(finished)
            out.finished_request_ids.extend(r.request_id for r in finished)

    def _append_tokens(self, batch: ModelBatch, result: StepResult, grammars: GrammarMatchers | None,
                       outputs: list[RequestOutput]) -> list[Request]:
        """Append each sampled token, check the stop conditions, add one output delta per request; the finished."""
        now = self._clock()
        logprobs = result.logprobs
        finished: list[Request] = []
        for idx, req, token in self.scheduler.update(batch, result):
            n_out = len(req.output_token_ids)
            if n_out == 1:
                req.first_token_time = now
            status = self._stop_status(req, token, n_out, grammars)
            if status is not None:
                req.status = status
                finished.append(req)
            detok = req.detokenizer
            lp = logprobs[idx] if logprobs is not None else None
            prompt_lps, req.prompt_logprobs = req.prompt_logprobs, None
            error = req.error if status is RequestStatus.FINISHED_ERROR else None
            outputs.append(RequestOutput(
                request_id=req.request_id, new_token_ids=[token],
                new_text=detok.take_delta(status is not None) if detok is not None else "",
                finished=status is not None, finish_reason=status.finish_reason if status is not None else None,
                stop_reason=req.stop_reason if status is not None else None,
                logprobs=[lp] if lp is not None else None, prompt_logprobs=prompt_lps,
                num_prompt_tokens=req.num_prompt_tokens, num_cached_tokens=req.num_cached_tokens,
                first_token_time=req.first_token_time, queue_time_s=req.queue_time_s if n_out == 1 else None,
                error_type=None if error is None else "invalid_request", error=None if error is None else str(error),
                error_field=None if error is None else error.field))
        return finished

    def _stop_status(self, req: Request, token: int, n_out: int,
                     grammars: GrammarMatchers | None) -> RequestStatus | None:
        """Whether ``token`` (the ``n_out``-th output) ends the request: a failed grammar first (its mask let
        only EOS through), then in vLLM's order a stop token or EOS, a stop string, a completed grammar, and the
        length limits. Flushes the detokenizer when it does."""
        params = req.sampling_params
        detok = req.detokenizer
        eos = self.eos_token_ids
        grammar_ends = False
        if grammars is not None and grammars.advance(req.request_id, token):
            error = grammars.error(req.request_id)
            if error and params.structured is not None:
                req.error = grammar_failed(params.structured.kind()[0], error, params.structured.param)
                return RequestStatus.FINISHED_ERROR
            grammar_ends = True
        if n_out >= params.min_tokens and (
                (token in eos and not params.ignore_eos) or token in params.stop_token_ids):
            req.stop_reason = None if token in eos and token not in params.stop_token_ids else token
            if detok is not None:
                if params.include_stop_str_in_output:  # the stop token's own text too, as vLLM's detokenizer does
                    detok.update(token, check_stop=False)
                detok.flush()
            return RequestStatus.FINISHED_STOPPED
        if detok is not None:
            stop = detok.update(token, check_stop=n_out >= params.min_tokens)
            if stop is not None:
                req.stop_reason = stop
                return RequestStatus.FINISHED_STOPPED
        status = None
        if grammar_ends:
            status = RequestStatus.FINISHED_STOPPED  # the grammar is complete: nothing else may follow
        elif n_out >= req.max_tokens or len(req.all_token_ids) >= self.max_model_len:
            status = RequestStatus.FINISHED_LENGTH
        if status is not None and detok is not None:
            detok.flush()
        return status

    def _file_prompt_logprobs(self, chunks: list[ScheduledChunk],
                              per_chunk: list[list[TokenLogprobs] | None]) -> None:
        """Store each chunk's prompt logprobs at their positions (entry i: prompt token i given tokens < i)."""
        requests = self.scheduler.requests
        for chunk, entries in zip(chunks, per_chunk, strict=True):
            if not entries:
                continue
            req = requests.get(chunk.request_id)
            if req is None or req.prompt_logprobs is None:  # aborted meanwhile, or already delivered
                continue
            first = chunk.start_pos + 1
            req.prompt_logprobs[first:first + len(entries)] = entries

    def execute_dummy(self) -> None:
        """A padding forward (MoE lockstep) with no request state."""
        self.executor.execute_dummy()

    def stats(self, *, wave: int = 0) -> SchedulerStats:
        bm = self.block_manager
        return SchedulerStats(
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=bm.usage, prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits, num_preemptions=self.scheduler.num_preemptions,
            prefill_tokens=self.scheduler.prefill_tokens, cache_fill=bm.cache_fill, step=self.num_steps, wave=wave)

    def shutdown(self) -> None:
        self.executor.shutdown()

