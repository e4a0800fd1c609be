"""The executor interface: how the engine core sees a model.

The scheduler decides *what* to compute in a step (a ``ModelBatch``); an executor computes it and samples. Two
implementations exist: ``asyncdp.engine.model_runner.TorchExecutor`` (the real model, the only torch importer of
the engine) and ``asyncdp.engine.sim_executor.SimExecutor`` (no torch: a step-time cost model and deterministic
tokens, for the simulation harness and load tests).

No torch here: this module is imported by everything above the executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from asyncdp.messages import TokenLogprobs
from asyncdp.sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledChunk:
    """One request's share of a step."""

    request_id: str
    token_ids: list[int]  # tokens whose KV is computed (and written to the cache) in this step
    start_pos: int  # position of token_ids[0]: tokens before it are already in the KV cache
    block_table: list[int]  # the request's KV blocks, covering positions [0, start_pos + len(token_ids))
    sample: bool  # sample a token after the last of token_ids (prompt complete, or a decode step)
    sampling_params: SamplingParams
    num_output_tokens: int  # tokens generated before this step (seeding, min_tokens)


@dataclass(slots=True)
class ModelBatch:
    chunks: list[ScheduledChunk]
    num_prefill_tokens: int = 0  # tokens computed for chunks that are (part of) a prompt
    num_decode_seqs: int = 0  # chunks that are a single decode token
    num_kv_tokens: int = 0  # sum over chunks of start_pos + len(token_ids)

    @property
    def empty(self) -> bool:
        return not self.chunks


@dataclass(slots=True)
class StepResult:
    sampled: list[int | None]  # aligned with batch.chunks; None where chunk.sample is False
    logprobs: list[TokenLogprobs | None] | None = None  # aligned likewise, when any chunk asked for them
    forward_time_s: float = 0.0  # time inside the model forward + sampling (for the overhead share)
    extra: dict[str, float] = field(default_factory=dict)


class Executor(Protocol):
    """Runs one forward for a batch. Constructed with the engine config; owns the KV cache."""

    @property
    def num_kv_blocks(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...

    def execute(self, batch: ModelBatch) -> StepResult: ...

    def execute_dummy(self) -> None:
        """A forward with one padding token and no request state (MoE lockstep); no KV write."""

    def shutdown(self) -> None: ...
