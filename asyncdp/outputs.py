"""Results of the offline API (``asyncdp.LLM.generate``), in vLLM's shape: cumulative, not deltas."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncdp.messages import TokenLogprobs


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
    # With SamplingParams.prompt_logprobs, as vLLM's: one entry per prompt token, None for the first.
    prompt_logprobs: list[TokenLogprobs | None] | None = None
