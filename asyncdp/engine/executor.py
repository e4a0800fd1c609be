"""The executor interface: how the engine core sees a model.

The scheduler decides *what* to compute in a step (a ``ModelBatch``); an executor computes it and samples. Two
implementations exist: ``asyncdp.engine.model_runner.TorchExecutor`` (the real model, the only torch importer of
the engine) and ``asyncdp.engine.sim_executor.SimExecutor`` (no torch: a step-time cost model and deterministic
tokens, for the simulation harness and load tests).

No torch here: this module is imported by everything above the executor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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
    # References to the request's own lists (never copies; read during execute only): penalties count them, and
    # prompt logprobs read the prompt token each chunk row predicts.
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    # Compute the logprobs of the prompt tokens this chunk predicts (rows at positions < num_prompt - 1), with
    # this many top alternatives; None: none (not asked for, or already delivered before a preemption).
    prompt_logprobs: int | None = None

    def num_prompt_logprob_rows(self) -> int:
        """Rows of this chunk whose next token is a prompt token: row j predicts token ``start_pos + j + 1``."""
        if self.prompt_logprobs is None:
            return 0
        return max(0, min(len(self.token_ids), len(self.prompt_token_ids) - 1 - self.start_pos))


@dataclass(slots=True)
class TokenMasks:
    """Allowed tokens of the constrained rows of a step (structured outputs), filled by the engine core."""

    chunk_indices: list[int]  # the sampled chunks that have a grammar, ascending
    bitmask: Any  # numpy int32 [len(chunk_indices), ceil(vocab / 32)]: bit t % 32 of word t // 32 = token t allowed

    def allowed(self, vocab_size: int) -> Any:
        """The bitmask unpacked: numpy bool ``[len(chunk_indices), vocab_size]``, True = allowed (tokens past the
        bitmask's width are not). One C call on the host, far cheaper than unpacking with tensor ops on a CPU."""
        import numpy as np

        bits = np.unpackbits(self.bitmask.astype("<i4", copy=False).view(np.uint8), axis=1, bitorder="little")
        if bits.shape[1] < vocab_size:
            bits = np.pad(bits, ((0, 0), (0, vocab_size - bits.shape[1])))
        return bits[:, :vocab_size].astype(bool)


@dataclass(slots=True)
class ModelBatch:
    chunks: list[ScheduledChunk]
    num_prefill_tokens: int = 0  # tokens computed for chunks that are (part of) a prompt
    num_decode_seqs: int = 0  # chunks that are a single decode token
    num_kv_tokens: int = 0  # sum over chunks of start_pos + len(token_ids)
    token_masks: TokenMasks | None = None  # None: no row of this batch is constrained

    @property
    def empty(self) -> bool:
        return not self.chunks


@dataclass(slots=True)
class StepResult:
    sampled: list[int | None]  # aligned with batch.chunks; None where chunk.sample is False
    logprobs: list[TokenLogprobs | None] | None = None  # aligned likewise, when any chunk asked for them
    # Aligned likewise, when any chunk has ``prompt_logprobs``: the logprobs of prompt tokens
    # ``start_pos + 1 .. start_pos + num_prompt_logprob_rows()`` (given the tokens before each), else None.
    prompt_logprobs: list[list[TokenLogprobs] | None] | None = None
    forward_time_s: float = 0.0  # time inside the model forward + sampling (for the overhead share)
    extra: dict[str, float] = field(default_factory=dict)


class Executor(Protocol):
    """Runs one forward for a batch. Constructed with the engine config; owns the KV cache.

    An executor that honours ``ModelBatch.token_masks`` says so with a true ``applies_token_masks`` attribute;
    the engine core refuses structured-output requests otherwise.

    ``modelled_step_s`` says how the step's time passes: ``None`` for a real executor (``execute`` takes the
    time itself, so the rank runs it on the execution thread); a float for an executor that only *models* its
    cost (``execute`` returns at once and this is the modelled duration of the last ``execute`` or
    ``execute_dummy``, which the rank then waits on the anyio clock: virtual time in tests).
    """

    @property
    def modelled_step_s(self) -> float | None: ...

    @property
    def num_kv_blocks(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...

    def execute(self, batch: ModelBatch) -> StepResult: ...

    def execute_dummy(self) -> None:
        """A forward with one padding token and no request state (MoE lockstep); no KV write."""

    def shutdown(self) -> None: ...
