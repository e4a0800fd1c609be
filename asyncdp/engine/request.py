"""One request's state inside an engine core.

A ``Request`` is created by ``EngineCore.add_request`` and lives until it finishes. The scheduler moves it between
``waiting`` and ``running`` and advances ``num_computed_tokens``; the block manager owns the meaning of
``block_ids``, ``block_hashes`` and ``num_registered_blocks``; the core appends sampled tokens and decides when it
finishes. ``all_token_ids`` is prompt + output, kept incrementally so nothing per step is O(context).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

from asyncdp.engine.executor import ScheduledChunk
from asyncdp.messages import RequestOutput
from asyncdp.sampling_params import SamplingParams

if TYPE_CHECKING:
    from asyncdp.engine.detokenizer import IncrementalDetokenizer
    from asyncdp.errors import InvalidRequestError
    from asyncdp.messages import TokenLogprobs


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # back in waiting, to be recomputed from scratch (prefix cache permitting)
    WAITING_FOR_GRAMMAR = 3  # queued, never scheduled until its grammar compiled (vLLM's WAITING_FOR_FSM)
    FINISHED_STOPPED = 4
    FINISHED_LENGTH = 5
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7  # the request's own input failed mid-generation (its grammar): ``Request.error`` says why

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


class Request:
    __slots__ = (
        "request_id", "prompt_token_ids", "sampling_params", "arrival_time", "client_index", "status",
        "output_token_ids", "all_token_ids", "num_computed_tokens", "block_ids", "block_hashes",
        "num_registered_blocks", "num_cached_tokens", "num_preemptions", "detokenizer", "first_token_time",
        "queued_time", "queue_time_s",
        "stop_reason", "max_tokens", "num_prompt_tokens", "prompt_logprobs", "extra", "prefill_debt", "error",
        "queue_seq",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        *,
        arrival_time: float,
        client_index: int = 0,
        max_tokens: int,
        queued_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = sampling_params
        self.arrival_time = arrival_time
        self.client_index = client_index
        self.status = RequestStatus.WAITING
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []  # chained hashes of the full blocks of all_token_ids, grown lazily
        self.num_registered_blocks = 0  # leading blocks of block_ids already published to the prefix cache
        self.num_cached_tokens = -1  # prefix-cache hit at first admission; -1 until admitted
        self.num_preemptions = 0
        self.detokenizer: IncrementalDetokenizer | None = None
        self.first_token_time: float | None = None
        # When this rank queued it, on its own clock (the arrival time is the API server's): its queue time's start.
        self.queued_time = arrival_time if queued_time is None else queued_time
        self.queue_time_s: float | None = None  # set when first scheduled (a preemption does not restart it)
        self.stop_reason: str | int | None = None
        self.max_tokens = max_tokens  # resolved: min(params.max_tokens, max_model_len - prompt)
        # With SamplingParams.prompt_logprobs: one entry per prompt token ([0] stays None), filled chunk by chunk,
        # until the first output carries them; then None again (nothing more to compute, even after preemption).
        self.prompt_logprobs: list[TokenLogprobs | None] | None = (
            [None] * self.num_prompt_tokens if sampling_params.prompt_logprobs is not None else None)
        self.extra: dict[str, Any] | None = None
        self.prefill_debt = 0  # its part of Scheduler.prefill_tokens: prompt tokens it still owes the rank
        self.error: InvalidRequestError | None = None  # why it finished with FINISHED_ERROR
        self.queue_seq = -1  # under --scheduling-policy priority: its order among equal keys (request_queue.py)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_STOPPED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self.status)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def take_chunk(self, start: int, end: int) -> ScheduledChunk:
        """Schedule tokens ``[start, end)``: they count as computed from now on (the scheduler's step)."""
        self.num_computed_tokens = end
        return ScheduledChunk(self.request_id, self.all_token_ids[start:end], start, self.block_ids,
                              end == len(self.all_token_ids), self.sampling_params, len(self.output_token_ids),
                              self.prompt_token_ids, self.output_token_ids,
                              self.sampling_params.prompt_logprobs if self.prompt_logprobs is not None else None)

    def abort_output(self) -> RequestOutput:
        """The output that reports it aborted: the text its detokenizer still held, its prompt and cache counts."""
        return RequestOutput(
            request_id=self.request_id, finished=True, finish_reason="abort",
            new_text=self.detokenizer.take_delta(True) if self.detokenizer is not None else "",
            num_prompt_tokens=self.num_prompt_tokens, num_cached_tokens=max(self.num_cached_tokens, 0),
            first_token_time=self.first_token_time, queue_time_s=None if self.output_token_ids else self.queue_time_s)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, prompt={self.num_prompt_tokens}, "
                f"out={self.num_output_tokens}, computed={self.num_computed_tokens})")
