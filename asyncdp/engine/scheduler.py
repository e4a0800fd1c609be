"""Continuous-batching scheduler of one rank (vLLM v1 semantics, spec routing-bench §5 rules 1-7).

Owns the ``waiting`` queue (:mod:`asyncdp.engine.request_queue`; ``fcfs``: preempted requests re-enter at the
front; ``priority``: by ``(priority, arrival_time)``, a preempted request re-entering at its place in that order)
and the ``running`` list (in admission order). ``schedule()`` builds one ``ModelBatch``:

1. Running requests take the token budget first: a decode takes 1 token, a partial prefill
   ``min(remaining, budget)`` (chunked prefill, no per-request cap).
2. When a running request cannot get blocks, the most recently admitted running request is preempted
   (recompute): its blocks are freed, full blocks staying cached, and it goes back to ``waiting``. Under
   ``priority`` the victim is the running request of the lowest priority, latest arrival (vLLM's); one scheduled
   earlier in this step gives its chunk back (its budget, and its unwritten blocks leave the prefix cache).
3. Only if nothing was preempted, waiting requests are admitted in queue order while ``running < max_num_seqs``,
   budget remains and blocks can be allocated. The first admission records the prefix-cache hit.

``num_computed_tokens`` advances when a chunk is scheduled (so full blocks are published at scheduling time);
``update()`` appends the sampled tokens. A prefill that completes in a step samples the first token at its end.

``prefill_tokens`` (kept as the queues change, O(1) to read) is the prompt work the rank still owes: each waiting
request counts the tokens the prefix cache did not cover when it was enqueued (or preempted), each running one the
rest of its prefill. It is the load figure a router cannot infer from the request counts: one waiting request may
be a 50-token question or a 50 000-token document (the coordinator passes it on, spec routing-bench §1.1).

Waiting for a grammar: a structured-output request a rank admits before its grammar compiled
(``add(grammar_pending=True)``, vLLM's WAITING_FOR_FSM) is unfinished and counts as waiting (load reports), but sits
in no queue: it is neither steppable nor MoE wave work until ``grammar_ready`` appends it to ``waiting``.

Pause states (spec dp-deployment §8.6): ``unpaused``; ``paused-new`` (modes ``abort`` and ``wait``: the requests in
flight keep stepping, nothing new is admitted); ``paused-all`` (mode ``keep``: nothing is scheduled). In flight means
running or preempted: a preempted request (it may have streamed tokens already) is re-admitted while paused-new, so
a ``wait`` pause completes only once it finished too. The queue tells the preempted requests from the new ones at
no cost (``fcfs``: they are its front; ``priority``: a heap of their own).
Throttling (§8.5): ``schedule(throttle_new_prefills=True)`` admits no new prefill while a running request is
decoding, unless the last unthrottled step left waiting work behind for lack of token budget.

Not thread-safe: one thread (the one that calls ``EngineCore.step``) drives it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

from asyncdp.engine.block_manager import BlockManager
from asyncdp.engine.executor import ModelBatch, StepResult
from asyncdp.engine.request import Request, RequestStatus
from asyncdp.engine.request_queue import make_waiting_queue, priority_key

PauseMode = Literal["abort", "wait", "keep"]
PauseState = Literal["unpaused", "paused-new", "paused-all"]


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        policy: str = "fcfs",
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.waiting = make_waiting_queue(policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # every unfinished request, waiting or running
        self.grammar_waiting: dict[str, Request] = {}  # those of them whose grammar is still compiling
        self.pause_state: PauseState = "unpaused"
        self.num_preemptions = 0
        self.prefill_tokens = 0  # the sum of the unfinished requests' prefill_debt (see the module docstring)
        self._last_unthrottled_capacity_bound = False
        # Requests scheduled in the batch being executed, aligned with its chunks.
        self._scheduled: list[Request] = []

    # ------------------------------------------------------------------ queues

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.grammar_waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def preempted_waiting(self) -> Iterator[Request]:
        """The preempted requests in ``waiting`` (O(their number))."""
        return self.waiting.preempted()

    def in_flight(self) -> list[Request]:
        """The requests a ``paused-new`` scheduler still steps: running and preempted (O(their number))."""
        return [*self.running, *self.preempted_waiting()]

    def has_steppable_work(self) -> bool:
        """Whether ``schedule()`` could produce a non-empty batch in the current pause state."""
        if self.pause_state == "paused-all":
            return False
        if self.pause_state == "paused-new":
            return bool(self.running) or self.waiting.peek(preempted_only=True) is not None
        return len(self.requests) > len(self.grammar_waiting)

    def num_unfinished_for_sync(self) -> int:
        """Work that keeps a MoE wave running (§8.6): paused-all counts 0, paused-new the requests in flight
        (running or preempted; queued new requests never count)."""
        if self.pause_state == "paused-all":
            return 0
        if self.pause_state == "paused-new":
            return len(self.running) + sum(1 for _ in self.preempted_waiting())
        return len(self.requests) - len(self.grammar_waiting)

    def pending_prefill_tokens(self) -> int:
        """Tokens still to compute before sampling, over waiting requests and partial prefills (O(queue))."""
        total = sum(r.num_tokens - r.num_computed_tokens for r in self.waiting)
        for r in self.running:
            left = r.num_tokens - r.num_computed_tokens
            if left > 1 or (left == 1 and not r.output_token_ids):  # a decode step is not prefill work
                total += left
        return total

    def running_context_tokens(self) -> int:
        """Sum of the context lengths of running requests (O(running))."""
        return sum(r.num_tokens for r in self.running)

    def add(self, req: Request, *, grammar_pending: bool = False) -> None:
        self.requests[req.request_id] = req
        if grammar_pending:
            req.status = RequestStatus.WAITING_FOR_GRAMMAR
            self.grammar_waiting[req.request_id] = req
        else:
            self.waiting.append(req)
        self._owe_uncached(req)

    def grammar_ready(self, request_id: str) -> bool:
        """The grammar of a request added with ``grammar_pending`` compiled: it joins the back of ``waiting``
        (False: it is no longer waiting for it, aborted meanwhile)."""
        req = self.grammar_waiting.pop(request_id, None)
        if req is None:
            return False
        req.status = RequestStatus.WAITING
        self.waiting.append(req)
        return True

    def _owe_uncached(self, req: Request) -> None:
        """``req`` (re)enters ``waiting``: it owes the tokens the prefix cache does not cover now (the hashes it
        computes are kept on the request, for its admission)."""
        cached = 0 if req.prompt_logprobs is not None else len(self.block_manager.find_cached_prefix(req))
        debt = req.num_tokens - cached * self.block_manager.block_size
        self.prefill_tokens += debt - req.prefill_debt
        req.prefill_debt = debt

    def _settle(self, req: Request, debt: int) -> None:
        self.prefill_tokens += debt - req.prefill_debt
        req.prefill_debt = debt

    def finish(self, req: Request, status: RequestStatus) -> None:
        """Remove ``req`` from whichever queue holds it and free its blocks."""
        if req.is_finished:
            return
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.WAITING_FOR_GRAMMAR:
            del self.grammar_waiting[req.request_id]
        else:
            self.waiting.remove(req)
        req.status = status
        self._settle(req, 0)
        self.block_manager.free(req)
        del self.requests[req.request_id]

    def abort(self, request_ids: Iterable[str]) -> list[Request]:
        """Abort the named unfinished requests (unknown ids are ignored); returns those aborted."""
        out = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None:
                self.finish(req, RequestStatus.FINISHED_ABORTED)
                out.append(req)
        return out

    def reset(self) -> list[Request]:
        """Drop every request and every block, for a core whose last call broke off midway (see
        ``EngineCore``, "An interrupted call"): returns the requests it held, marked aborted."""
        dropped = list(self.requests.values())
        for req in dropped:
            req.status = RequestStatus.FINISHED_ABORTED
            req.block_ids = []
            req.num_registered_blocks = 0
            req.prefill_debt = 0
        self.requests.clear()
        self.grammar_waiting.clear()
        self.waiting.clear()
        self.running = []
        self._scheduled = []
        self.prefill_tokens = 0
        self._last_unthrottled_capacity_bound = False
        self.block_manager.clear()
        return dropped

    # ------------------------------------------------------------------ pause

    def pause(self, mode: PauseMode) -> list[Request]:
        """Enter a pause state; mode ``abort`` aborts every request and returns them."""
        if mode not in ("abort", "wait", "keep"):
            raise ValueError(f"pause mode must be one of abort, wait, keep (got {mode!r})")
        aborted: list[Request] = []
        if mode == "abort":
            aborted = self.abort(list(self.requests))
        self.pause_state = "paused-all" if mode == "keep" else "paused-new"
        return aborted

    def resume(self) -> None:
        self.pause_state = "unpaused"

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM's reset: refused (False) while a block is in use, unless ``reset_running_requests`` preempts."""
        while reset_running_requests and self.running:  # the last admitted first: waiting keeps their order
            self._preempt(self.running.pop())
        if done := self.block_manager.reset_prefix_cache():
            for req in self.requests.values():  # all waiting now: each owes its every token again
                self._settle(req, req.num_tokens)
        return done

    # ------------------------------------------------------------------ scheduling

    def _preempt(self, req: Request) -> None:
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._requeue(req)

    def _requeue(self, req: Request) -> None:
        """Back to ``waiting`` (FCFS: its front), to be recomputed; its blocks are freed (published ones stay)."""
        self.block_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        self.waiting.appendleft(req)
        self._owe_uncached(req)  # its full blocks stayed cached: mostly the partial last block

    def unschedule(self, batch: ModelBatch) -> None:
        """The forward of ``batch`` (this step's) failed: none of its KV was written. The blocks it was to
        write leave the prefix cache, which would otherwise hand out what they held before as a hit, and its
        requests go back to ``waiting`` in their order, to be recomputed (or aborted) from what is cached."""
        bs = self.block_manager.block_size
        for chunk, req in zip(batch.chunks, self._scheduled, strict=True):
            self.block_manager.forget_from(req, chunk.start_pos // bs)
        for req in reversed(self._scheduled):
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
                self._requeue(req)
        self._scheduled = []

    def schedule(self, *, throttle_new_prefills: bool = False, now: float = 0.0) -> ModelBatch:
        """This step's batch: the running requests first (preempting from the back when KV blocks run out), then
        new prefills from the waiting queue while budget, sequence slots and blocks last (none after a preemption
        or while throttled; while paused-new only preempted ones). ``now`` (the core's clock) ends the queue time of a request scheduled
        for the first time."""
        batch = ModelBatch([])
        self._scheduled = []
        if self.pause_state == "paused-all":
            return batch
        budget, preempted, has_decode = self._schedule_running(batch, self.max_num_batched_tokens)
        throttled = throttle_new_prefills and has_decode and not self._last_unthrottled_capacity_bound
        if not preempted and not throttled:
            budget = self._admit_waiting(batch, budget, now, preempted_only=self.pause_state == "paused-new")
        if not throttle_new_prefills:
            self._last_unthrottled_capacity_bound = budget <= 0 and bool(self.waiting)
        return batch

    def _schedule_running(self, batch: ModelBatch, budget: int) -> tuple[int, bool, bool]:
        """Give each running request its next chunk; returns (budget left, preempted, any decode)."""
        chunks, scheduled = batch.chunks, self._scheduled
        bm = self.block_manager
        running = self.running
        num_prefill = num_decode = num_kv = 0
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            start = req.num_computed_tokens
            remaining = len(req.all_token_ids) - start
            if remaining <= 0:  # no token was sampled for it last step (an executor that skipped it)
                i += 1
                continue
            n = remaining if remaining < budget else budget
            while not bm.allocate(req, n):
                if self.policy == "priority":  # the lowest priority, latest arrival (vLLM's), maybe scheduled
                    k = max(range(len(running)), key=lambda j: priority_key(running[j]))
                    victim = running.pop(k)
                    if k < i:  # its chunk of this step goes back
                        budget += self._withdraw(batch, victim)
                        i -= 1
                else:
                    victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                end = start + n
                if n == 1 and start >= req.num_prompt_tokens:
                    num_decode += 1
                else:
                    num_prefill += n
                num_kv += end
                chunks.append(req.take_chunk(start, end))
                scheduled.append(req)
                if req.prefill_debt:
                    self._settle(req, max(0, req.prefill_debt - n))
                budget -= n
                i += 1
                continue
            break  # the request itself was preempted: everything after it is gone too
        batch.num_prefill_tokens += num_prefill
        batch.num_decode_seqs += num_decode
        batch.num_kv_tokens += num_kv
        return budget, preempted, batch.num_decode_seqs > 0

    def _withdraw(self, batch: ModelBatch, req: Request) -> int:
        """Take ``req``'s chunk out of this step's batch (it is being preempted) and return its tokens; the blocks
        it was to write leave the prefix cache (published at scheduling time, they would be handed out unwritten)."""
        k = next(k for k, r in enumerate(self._scheduled) if r is req)
        del self._scheduled[k]
        chunk = batch.chunks.pop(k)
        start, m = chunk.start_pos, len(chunk.token_ids)
        self.block_manager.forget_from(req, start // self.block_manager.block_size)
        if m == 1 and start >= req.num_prompt_tokens:  # (the counts _schedule_running adds to the batch)
            batch.num_decode_seqs -= 1
        else:
            batch.num_prefill_tokens -= m
        batch.num_kv_tokens -= start + m
        return m

    def _admit_waiting(self, batch: ModelBatch, budget: int, now: float, *, preempted_only: bool) -> int:
        """Admit waiting requests (with their cached prefix) while they fit; returns the budget left."""
        chunks, scheduled = batch.chunks, self._scheduled
        bm = self.block_manager
        running, waiting = self.running, self.waiting
        num_prefill = num_kv = 0
        while waiting and budget > 0 and len(running) < self.max_num_seqs:
            req = waiting.peek(preempted_only=preempted_only)
            if req is None:
                break
            # Cached positions would have no logits: a request still owed prompt logprobs computes them all.
            prefix = [] if req.prompt_logprobs is not None else bm.find_cached_prefix(req)
            start = len(prefix) * bm.block_size
            num_tokens = len(req.all_token_ids)
            remaining = num_tokens - start
            n = remaining if remaining < budget else budget
            if not bm.allocate(req, n, prefix):
                break
            waiting.take(req)
            if req.num_cached_tokens < 0:  # its first admission
                req.num_cached_tokens = start
                bm.record_admission(num_tokens, start)
                req.queue_time_s = max(0.0, now - req.queued_time)
            req.status = RequestStatus.RUNNING
            running.append(req)
            end = start + n
            self._settle(req, num_tokens - end)
            num_prefill += n
            num_kv += end
            chunks.append(req.take_chunk(start, end))
            scheduled.append(req)
            budget -= n
        batch.num_prefill_tokens += num_prefill
        batch.num_kv_tokens += num_kv
        return budget

    def update(self, batch: ModelBatch, result: StepResult) -> list[tuple[int, Request, int]]:
        """Append sampled tokens; returns ``(chunk index, request, token)`` for each request that got one.

        Requests finished (aborted) since ``schedule()`` are skipped.
        """
        out: list[tuple[int, Request, int]] = []
        sampled = result.sampled
        scheduled = self._scheduled
        if len(sampled) != len(scheduled) or len(batch.chunks) != len(scheduled):
            raise RuntimeError(f"executor returned {len(sampled)} samples for {len(scheduled)} chunks")
        running = RequestStatus.RUNNING
        for idx, req in enumerate(scheduled):
            token = sampled[idx]
            if token is None or req.status != running or req.num_computed_tokens != len(req.all_token_ids):
                continue
            req.output_token_ids.append(token)
            req.all_token_ids.append(token)
            out.append((idx, req, token))
        self._scheduled = []
        return out

    def retire(self, reqs: list[Request]) -> None:
        """Drop requests the core marked finished this step (O(running) once, not per request)."""
        bm = self.block_manager
        for req in reqs:
            self._settle(req, 0)
            bm.free(req)
            del self.requests[req.request_id]
        self.running = [r for r in self.running if not r.is_finished]
