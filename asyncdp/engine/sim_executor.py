"""A torch-free executor: a step-time cost model and deterministic tokens.

Used by the simulation harness, load tests and the engine tests. ``execute()`` returns at once; it does NOT
sleep. The step's modelled duration ``a + b*prefill_tokens + c*decode_seqs + d*kv_tokens`` milliseconds
(``EngineConfig.sim_cost``) is reported as ``StepResult.extra["sim_step_s"]`` and kept in ``last_step_s``, which
the executor protocol's ``modelled_step_s`` returns, so the async rank loop can wait for it on its own clock
(virtual time in tests, real time in a demo).
``execute_dummy()`` costs ``a`` and records it the same way.

Tokens are a pure function of (previous token, position, seed): BLAKE2b mod the vocabulary, never an id in
``avoid_token_ids`` (none by default; the factory passes the model's EOS ids so outputs run to ``max_tokens``). They do not depend on the request id, the batch composition or on preemption, so a request
recomputed after preemption, or served with prefix caching on or off, yields the same tokens. The token filters
are honoured: with ``allowed_token_ids`` the token is the allowed id at its index modulo their count, and a
token that ``allowed_token_ids`` or ``bad_words`` forbid (or in ``avoid_token_ids``) moves on to the next one
they allow. No other sampling parameter is honoured (``seed`` from the params is used when set, else the config
seed; the config seed is not derived per rank, so simulated ranks agree on every token).

Prompt logprobs (``SamplingParams.prompt_logprobs``) are those of a uniform model: every prompt token a chunk
predicts gets ``-log(vocab_size)``, and its top-n alternatives are token ids ``0 .. n-1``, each at the same
logprob. Deterministic and independent of the batch, so the simulated cluster and the API tests see the field.

``token_source`` (optional; the routing benchmark's): ``token_source(request_id, index)`` gives the ``index``-th
output token of a request, or None to fall back to the rule above. The benchmark uses it to emit each request's
answer segment, so a later turn that quotes the answer hits the blocks the engine cached for it (routing-bench
spec §4.0 "Materialisation"). Without it nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from hashlib import blake2b

from asyncdp.config.flags import DEFAULT_SIM_KV_BLOCKS, EngineConfig
from asyncdp.engine.executor import ModelBatch, ScheduledChunk, StepResult
from asyncdp.messages import Logprob, TokenLogprobs
from asyncdp.sampling_params.token_filters import banned_tokens

#: ``(request_id, output index) -> token id | None`` (None: the default token rule)
TokenSource = Callable[[str, int], int | None]


def sim_token(prev_token: int, position: int, seed: int, vocab_size: int) -> int:
    digest = blake2b(f"{prev_token}/{position}/{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % vocab_size


class SimExecutor:
    def __init__(
        self,
        config: EngineConfig,
        vocab_size: int,
        *,
        max_model_len: int,
        clock: object = None,
        avoid_token_ids: Iterable[int] = (),
        token_source: TokenSource | None = None,
    ) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2 (got {vocab_size})")
        self._config = config
        self._vocab_size = vocab_size
        self._max_model_len = max_model_len
        self._num_kv_blocks = config.num_kv_blocks if config.num_kv_blocks is not None else DEFAULT_SIM_KV_BLOCKS
        avoid = frozenset(avoid_token_ids)
        self._avoid = avoid if len(avoid) < vocab_size else frozenset()
        self._token_source = token_source
        self._clock = clock  # unused: the caller waits out modelled_step_s on whatever clock it has
        cost = config.sim_cost
        self._a_s = cost.a_ms / 1e3
        self._b_s = cost.b_ms_per_token / 1e3
        self._c_s = cost.c_ms_per_seq / 1e3
        self._d_s = cost.d_ms_per_kv_token / 1e3
        self._e_s = cost.e_ms_per_token_pair / 1e3
        self.last_step_s = 0.0
        self.num_steps = 0
        self.num_dummy_steps = 0

    @property
    def modelled_step_s(self) -> float:
        """The modelled duration of the last step (the executor protocol's declaration: never None here)."""
        return self.last_step_s

    @property
    def num_kv_blocks(self) -> int:
        return self._num_kv_blocks

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def step_cost_s(self, batch: ModelBatch) -> float:
        cost = (self._a_s + self._b_s * batch.num_prefill_tokens + self._c_s * batch.num_decode_seqs
                + self._d_s * batch.num_kv_tokens)
        if self._e_s and batch.num_prefill_tokens:
            cost += self._e_s * prefill_token_pairs(batch)
        return cost

    def execute(self, batch: ModelBatch) -> StepResult:
        vocab = self._vocab_size
        avoid = self._avoid
        default_seed = self._config.seed
        source = self._token_source
        sampled: list[int | None] = []
        for chunk in batch.chunks:
            if not chunk.sample:
                sampled.append(None)
                continue
            if source is not None:
                given = source(chunk.request_id, chunk.num_output_tokens)
                if given is not None:
                    sampled.append(given)
                    continue
            position = chunk.start_pos + len(chunk.token_ids)
            seed = chunk.sampling_params.seed
            token = sim_token(chunk.token_ids[-1], position, default_seed if seed is None else seed, vocab)
            params = chunk.sampling_params
            if params.allowed_token_ids is not None or params.bad_words_token_ids:
                token = filtered_token(token, chunk, avoid, vocab)
            else:
                while token in avoid:
                    token = (token + 1) % vocab
            sampled.append(token)
        self.last_step_s = self.step_cost_s(batch)
        self.num_steps += 1
        prompt_logprobs = None
        if any(c.prompt_logprobs is not None for c in batch.chunks):
            prompt_logprobs = [self._prompt_logprobs(c) for c in batch.chunks]
        return StepResult(sampled, prompt_logprobs=prompt_logprobs, forward_time_s=0.0,
                          extra={"sim_step_s": self.last_step_s})

    def _prompt_logprobs(self, chunk: ScheduledChunk) -> list[TokenLogprobs] | None:
        if chunk.prompt_logprobs is None:
            return None
        value = -math.log(self._vocab_size)
        top = tuple(Logprob(token_id=t, logprob=value) for t in range(min(chunk.prompt_logprobs, self._vocab_size)))
        first = chunk.start_pos + 1
        return [TokenLogprobs(token_id=t, logprob=value, top=top)
                for t in chunk.prompt_token_ids[first:first + chunk.num_prompt_logprob_rows()]]

    def execute_dummy(self) -> None:
        self.last_step_s = self._a_s
        self.num_dummy_steps += 1

    def shutdown(self) -> None:
        pass


def filtered_token(token: int, chunk: ScheduledChunk, avoid: Collection[int], vocab: int) -> int:
    """``token`` moved onto what the chunk's token filters allow (see the module docstring); ``avoid`` is kept
    out where something else is allowed."""
    params = chunk.sampling_params
    banned = set(banned_tokens(params.bad_words_token_ids, chunk.output_token_ids))
    allowed = params.allowed_token_ids
    candidates: Sequence[int] = range(vocab) if allowed is None else sorted({t for t in allowed if t < vocab})
    if not candidates:
        return token
    start = token % len(candidates)
    for skip in (banned | set(avoid), banned):
        for k in range(len(candidates)):
            candidate = candidates[(start + k) % len(candidates)]
            if candidate not in skip:
                return candidate
    return candidates[start]


def prefill_token_pairs(batch: ModelBatch) -> float:
    """``Σ p·(c0 + p/2)`` over the batch's prefill chunks (``p`` tokens after ``c0`` of context): the attention
    work of prefill, the ``e`` term of the cost model. A decode (one token past the prompt) is not a prefill."""
    pairs = 0.0
    for chunk in batch.chunks:
        p, c0 = len(chunk.token_ids), chunk.start_pos
        if not (p == 1 and c0 >= len(chunk.prompt_token_ids)):
            pairs += p * (c0 + p / 2)
    return pairs
