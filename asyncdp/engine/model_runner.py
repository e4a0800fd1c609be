"""``TorchExecutor``: the real model behind the ``Executor`` interface (the engine's only torch importer).

It owns the model, the paged KV cache and the sampler. Per step it flattens the scheduled chunks (single-token
chunks first, so all decodes form one contiguous batched attention call), builds the slot mapping and the
attention metadata with a handful of tensor constructions, runs one forward, computes logits only for the rows
that sample (plus, for a request with ``prompt_logprobs``, every row of its chunk that predicts a prompt token:
row j of a chunk predicts token ``start_pos + j + 1``), and samples. Structured-output rows arrive with the
core's allowed-token bitmask (``ModelBatch.token_masks``), unpacked on the host and copied to the device once
per step. Penalties (and bad words) get each row's prompt and output
ids from the chunk (references to the request's lists). ``StepResult.forward_time_s`` covers forward + logits +
sampling (+ prompt logprobs); everything else in a step (input building here, scheduling above) is per-step
overhead.

KV cache: per layer K and V tensors ``[num_kv_blocks, block_size, num_kv_heads, head_dim]``. Block 0 is scratch,
never given to a request (the engine core's block manager reserves it): dummy batches write there and padded
gathers read it, so no request's blocks are ever touched by them. ``num_kv_blocks`` is ``config.num_kv_blocks``,
or ``kv_cache_memory_bytes // bytes_per_block`` capped at what ``max_num_seqs`` full-length sequences could use
plus the scratch block; on CUDA with ``gpu_memory_utilization`` the bytes are that share of the device less what
is in use on it once the weights are loaded (``asyncdp.model.info.kv_bytes_from_share``).

DP mode (MoE, dp > 1; spec §9): built with a ``DPContext``, the executor loads only its expert shard (its expert
block with expert parallelism, else its slice of every expert), routes every MoE block through the cross-rank
backend, and exchanges token counts before every forward. ``execute`` and ``execute_dummy`` then run the same
collectives in the same order on every rank, so they must be called in lockstep (one forward per loop
iteration on every rank) from the rank's execution thread.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.executor import ModelBatch, ScheduledChunk, StepResult
from asyncdp.engine.sampler import Sampler, rank_seed, token_logprobs
from asyncdp.errors import ConfigError
from asyncdp.messages import TokenLogprobs
from asyncdp.model import read_model_info
from asyncdp.model.decoder import ArchSpec
from asyncdp.model.info import kv_bytes_from_share, kv_cache_num_blocks, load_config
from asyncdp.model.layers import AttentionMetadata, PrefillChunk
from asyncdp.model.loader import load_model, torch_dtype
from asyncdp.model.moe import ExpertShard

if TYPE_CHECKING:
    from asyncdp.model.distributed import DPContext
    from asyncdp.model.expert_parallel import ForwardSizes


# Prompt-logprob rows per logits computation: bounds the [rows, vocab] fp32 buffer of a long prompt chunk.
PROMPT_LOGITS_ROWS = 512


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was requested but CUDA is not available; use --device cpu or auto.")
    return torch.device(name)


class TorchExecutor:
    applies_token_masks = True  # structured outputs: ModelBatch.token_masks restrict the sampled rows
    modelled_step_s: float | None = None  # a real forward: execute() takes the time itself (see Executor)

    def __init__(self, config: EngineConfig, model_path: Path, *, shard: ExpertShard | None = None,
                 dp: DPContext | None = None, dp_rank: int = 0) -> None:
        config.validate()
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        self.config = config
        self.device = select_device(config.device)
        self.info = read_model_info(model_path)
        dtype_name = self.info.dtype if config.dtype == "auto" else config.dtype
        if dtype_name not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"checkpoint dtype {dtype_name!r} is not supported; pass --dtype float32.")
        if self.device.type == "cpu" and dtype_name == "float16":
            dtype_name = "float32"  # fp16 matmuls are slow or missing on CPU
        self.dtype = torch_dtype(dtype_name)
        max_len = config.max_model_len or self.info.max_position_embeddings
        if max_len > self.info.max_position_embeddings:
            raise ConfigError(f"--max-model-len {max_len} exceeds the model's max_position_embeddings "
                              f"({self.info.max_position_embeddings}); lower it.")
        self._max_model_len = max_len
        spec = ArchSpec.from_config(load_config(model_path))
        if dp is not None and spec.num_experts:
            from asyncdp.model.expert_parallel import expert_shard_for

            if shard is not None:
                raise ValueError("pass either shard or dp, not both: dp decides the rank's expert shard")
            if dp.enable_expert_parallel and dp.dp_size > spec.num_experts:
                raise ConfigError(f"expert-parallel size {dp.dp_size} exceeds the model's {spec.num_experts} "
                                  "experts; lower --data-parallel-size or disable expert parallelism.")
            if not dp.enable_expert_parallel and dp.dp_size > spec.moe_intermediate:
                raise ConfigError(f"dp size {dp.dp_size} exceeds the experts' intermediate size "
                                  f"{spec.moe_intermediate}; enable expert parallelism.")
            shard = expert_shard_for(spec.num_experts, spec.moe_intermediate, dp.dp_rank, dp.dp_size,
                                     dp.enable_expert_parallel)
        loading_since = time.monotonic()
        self.model = load_model(model_path, device=self.device, dtype=self.dtype, shard=shard)
        self.load_s = time.monotonic() - loading_since  # reported by the rank's "weights loaded" line
        self._sizes: ForwardSizes | None = None
        if dp is not None:
            self._sizes = self._install_dp(dp)

        self.block_size = bs = config.block_size
        elem = torch.finfo(self.dtype).bits // 8
        bytes_per_block = 2 * spec.num_layers * bs * spec.num_kv_heads * spec.head_dim * elem
        # the same sizing the launcher checks before anything starts (asyncdp.model.info.check_fits_model)
        share = config.gpu_memory_utilization
        if share is not None and self.device.type == "cuda" and not config.num_kv_blocks:
            free, total = torch.cuda.mem_get_info(self.device)
            kv_bytes = kv_bytes_from_share(share, total_bytes=total, free_bytes=free)
            num_blocks = kv_cache_num_blocks(config.replace(kv_cache_memory_bytes=max(1, kv_bytes)),
                                             max_model_len=max_len, bytes_per_block=bytes_per_block)
            if num_blocks < 2:
                raise ConfigError(f"--gpu-memory-utilization {share} leaves fewer than 2 KV blocks ({bytes_per_block} "
                                  f"bytes each) once the weights are loaded ({total - free} of {total} bytes of "
                                  f"{self.device} in use); raise it.")
        else:
            num_blocks = kv_cache_num_blocks(config, max_model_len=max_len, bytes_per_block=bytes_per_block)
        if num_blocks < 2:
            raise ConfigError(f"--kv-cache-memory-bytes {config.kv_cache_memory_bytes} holds fewer than 2 KV blocks "
                              f"({bytes_per_block} bytes each); raise it.")
        self._num_kv_blocks = num_blocks
        self.scratch_block = 0
        shape = (num_blocks, bs, spec.num_kv_heads, spec.head_dim)
        # Zeroed, not empty: masked-out gathered slots must hold finite values (0 * NaN would poison outputs).
        self.kv_caches = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                           torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(spec.num_layers)]
        # Unseeded sampling draws from a per-rank stream: ranks of one deployment must not repeat each other.
        rank = dp.dp_rank if dp is not None else dp_rank
        self.sampler = Sampler(self.info.eos_token_ids, seed=rank_seed(config.seed, rank), device=self.device)
        self._offsets = torch.arange(bs, device=self.device)
        self._dummy = self._dummy_inputs()

    def _install_dp(self, dp: DPContext) -> ForwardSizes:
        from asyncdp.model.expert_parallel import ForwardSizes, install_expert_backends

        group = dp.group
        if group.device.type != self.device.type:
            raise ConfigError(f"the DP group's data backend {group.backend} runs on {group.device.type}, "
                              f"the model on {self.device.type}; use one device type on every rank.")
        sizes = ForwardSizes(group.exchange, dp.dp_rank, dp.dp_size, group.exchange_device)
        install_expert_backends(self.model.moe_blocks(), group=group.data, dp_rank=dp.dp_rank, dp_size=dp.dp_size,
                                num_experts=self.model.spec.num_experts,
                                enable_expert_parallel=dp.enable_expert_parallel, sizes=sizes,
                                ep_padded_max_rows=dp.ep_padded_max_rows)
        return sizes

    @property
    def num_dp_exchanges(self) -> int:
        """Forwards run in DP mode (real and dummy); 0 outside DP mode."""
        return 0 if self._sizes is None else self._sizes.num_exchanges

    @property
    def num_kv_blocks(self) -> int:
        return self._num_kv_blocks

    @property
    def num_parameters(self) -> int:
        """Parameters this rank holds (a MoE rank of a DP group: its share of the experts)."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def kv_cache_bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv_caches)

    def describe_weights(self) -> tuple[int, str, str, float]:
        """(parameters, dtype, device, seconds the weights took to load), for the startup log."""
        return self.num_parameters, str(self.dtype).removeprefix("torch."), str(self.device), self.load_s

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def vocab_size(self) -> int:
        """The engine core rejects prompt token ids outside ``[0, vocab_size)`` before they reach the model."""
        return self.info.vocab_size

    # ------------------------------------------------------------------ inputs

    def _gather_slots(self, block_tables: list[list[int]]) -> torch.Tensor:
        """[B, num_blocks] block ids -> [B, num_blocks * block_size] cache slots."""
        table = torch.tensor(block_tables, dtype=torch.int64, device=self.device)
        return (table.unsqueeze(-1) * self.block_size + self._offsets).flatten(1)

    def _dummy_inputs(self) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        slot = self.scratch_block * self.block_size
        ids = torch.zeros(1, dtype=torch.int64, device=self.device)
        slots = torch.tensor([slot], dtype=torch.int64, device=self.device)
        meta = AttentionMetadata(slot_mapping=slots, num_decode=1, decode_slots=slots.view(1, 1),
                                 decode_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=self.device))
        return ids, ids.clone(), meta

    def _prepare(self, batch: ModelBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        bs = self.block_size
        chunks = batch.chunks
        decodes = [i for i, c in enumerate(chunks) if len(c.token_ids) == 1]
        prefills = [i for i, c in enumerate(chunks) if len(c.token_ids) != 1]
        last_index = [0] * len(chunks)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        context_lens: list[int] = []
        tables: list[list[int]] = []
        for flat, i in enumerate(decodes):
            c = chunks[i]
            pos = c.start_pos
            input_ids.append(c.token_ids[0])
            positions.append(pos)
            slots.append(c.block_table[pos // bs] * bs + pos % bs)
            context_lens.append(pos + 1)
            last_index[i] = flat
        meta = AttentionMetadata(slot_mapping=torch.empty(0), num_decode=len(decodes))
        if decodes:
            max_blocks = -(-max(context_lens) // bs)
            pad = [self.scratch_block] * max_blocks
            for i in decodes:
                table = chunks[i].block_table[:max_blocks]
                tables.append(table + pad[len(table):])
            max_ctx = max(context_lens)
            meta.decode_slots = self._gather_slots(tables)[:, :max_ctx].contiguous()
            lens = torch.tensor(context_lens, device=self.device)
            meta.decode_mask = (torch.arange(max_ctx, device=self.device) < lens.unsqueeze(1)).view(-1, 1, 1, max_ctx)
        for i in prefills:
            c = chunks[i]
            start, num = len(input_ids), len(c.token_ids)
            s = c.start_pos
            table = c.block_table
            input_ids.extend(c.token_ids)
            positions.extend(range(s, s + num))
            slots.extend(table[p // bs] * bs + p % bs for p in range(s, s + num))
            last_index[i] = start + num - 1
            chunk = PrefillChunk(start=start, end=start + num)
            if s > 0:
                ctx = s + num
                chunk.kv_slots = self._gather_slots([table[: -(-ctx // bs)]])[0, :ctx]
                q_pos = torch.arange(s, ctx, device=self.device).unsqueeze(1)
                chunk.mask = (torch.arange(ctx, device=self.device).unsqueeze(0) <= q_pos).unsqueeze(0)
            meta.prefills.append(chunk)
        meta.slot_mapping = torch.tensor(slots, dtype=torch.int64, device=self.device)
        ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        pos_t = torch.tensor(positions, dtype=torch.int64, device=self.device)
        return ids, pos_t, meta, last_index

    # ------------------------------------------------------------------ steps

    @torch.inference_mode()
    def execute(self, batch: ModelBatch) -> StepResult:
        chunks = batch.chunks
        if not chunks:
            if self._sizes is not None:  # peers run a forward this step: keep the collectives in lockstep
                self.execute_dummy()
            return StepResult(sampled=[])
        ids, positions, meta, last_index = self._prepare(batch)
        sample_rows = [i for i, c in enumerate(chunks) if c.sample]
        row_index = torch.tensor([last_index[i] for i in sample_rows], dtype=torch.int64, device=self.device)
        started = time.perf_counter()
        if self._sizes is not None:
            self._sizes.exchange(ids.numel())
        hidden = self.model(ids, positions, meta, self.kv_caches)
        sampled: list[int | None] = [None] * len(chunks)
        logprobs: list[TokenLogprobs | None] | None = None
        if sample_rows:
            logits = self.model.compute_logits(hidden[row_index])
            params = [chunks[i].sampling_params for i in sample_rows]
            counts = [chunks[i].num_output_tokens for i in sample_rows]
            penalised = any(p.has_penalties for p in params)
            with_output = penalised or any(p.bad_words_token_ids for p in params)
            token_mask = None
            if batch.token_masks is not None:
                row_of = {i: row for row, i in enumerate(sample_rows)}
                allowed = batch.token_masks.allowed(logits.shape[1])
                token_mask = ([row_of[i] for i in batch.token_masks.chunk_indices],
                              torch.from_numpy(allowed).to(self.device))
            tokens, row_logprobs = self.sampler(
                logits, params, counts,
                prompt_token_ids=[chunks[i].prompt_token_ids for i in sample_rows] if penalised else None,
                output_token_ids=[chunks[i].output_token_ids for i in sample_rows] if with_output else None,
                token_mask=token_mask)
            for row, i in enumerate(sample_rows):
                sampled[i] = tokens[row]
            if row_logprobs is not None:
                logprobs = [None] * len(chunks)
                for row, i in enumerate(sample_rows):
                    logprobs[i] = row_logprobs[row]
        elif self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        prompt_logprobs = None
        if any(c.prompt_logprobs is not None for c in chunks):
            prompt_logprobs = self._prompt_logprobs(chunks, hidden, last_index)
        return StepResult(sampled=sampled, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                          forward_time_s=time.perf_counter() - started)

    def _prompt_logprobs(self, chunks: list[ScheduledChunk], hidden: torch.Tensor,
                         last_index: list[int]) -> list[list[TokenLogprobs] | None]:
        """Per chunk with ``prompt_logprobs``: log_softmax of the logits of every row that predicts a prompt token,
        at that token, with the top alternatives; logits are computed PROMPT_LOGITS_ROWS rows at a time."""
        out: list[list[TokenLogprobs] | None] = [None] * len(chunks)
        for i, c in enumerate(chunks):
            if c.prompt_logprobs is None:
                continue
            num = c.num_prompt_logprob_rows()
            first_row = last_index[i] - len(c.token_ids) + 1  # the chunk's rows are contiguous in the flat batch
            targets = c.prompt_token_ids[c.start_pos + 1: c.start_pos + 1 + num]
            entries: list[TokenLogprobs] = []
            for lo in range(0, num, PROMPT_LOGITS_ROWS):
                hi = min(num, lo + PROMPT_LOGITS_ROWS)
                raw = torch.log_softmax(self.model.compute_logits(hidden[first_row + lo: first_row + hi]), dim=-1)
                ids = torch.tensor(list(targets[lo:hi]), dtype=torch.int64, device=self.device)
                entries.extend(e for e in token_logprobs(raw, ids, [c.prompt_logprobs] * (hi - lo))
                               if e is not None)
            out[i] = entries
        return out

    @torch.inference_mode()
    def execute_dummy(self) -> None:
        ids, positions, meta = self._dummy
        if self._sizes is not None:
            self._sizes.exchange(ids.numel())
        self.model(ids, positions, meta, self.kv_caches)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def shutdown(self) -> None:
        self.kv_caches = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
