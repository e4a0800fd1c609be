"""TorchExecutor against transformers: greedy decoding of a ragged batch, chunked prefill, dummy batches, sizing.

Besides the built-ins (Qwen3, Qwen3-MoE), other architectures of the family are saved by transformers itself:
Llama (tied embeddings), Qwen2 (q/k/v bias) and Mixtral (routed experts in transformers' own weight layout).

The test plays the scheduler: it hands out KV blocks itself (``Blocks``), sends each prompt as one prefill chunk
(or two, for chunked prefill) and then all sequences as one batched decode step per token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.executor import ModelBatch, ScheduledChunk
from asyncdp.engine.model_runner import TorchExecutor
from asyncdp.errors import ConfigError
from asyncdp.model import load_tokenizer
from asyncdp.sampling_params import SamplingParams

PROMPTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "a",
           "Once upon a time, in a land far away, there lived a"]
NEW_TOKENS = 20
GREEDY = SamplingParams(
    temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=3)


class Blocks:
    """Hands out KV blocks 1.. in order (block 0 is the executor's scratch block, as in the engine core)."""

    def __init__(self, block_size: int, num_blocks: int) -> None:
        self.block_size = block_size
        self.free = list(range(1, num_blocks))[::-1]
        self.tables: dict[str, list[int]] = {}

    def table(self, request_id: str, num_tokens: int) -> list[int]:
        table = self.tables.setdefault(request_id, [])
        while len(table) * self.block_size < num_tokens:
            table.append(self.free.pop())
        return list(table)


def run_greedy(executor: TorchExecutor, prompts: list[list[int]], *, split: int | None = None,
               dummy_between: bool = False) -> tuple[list[list[int]], list[list[float]]]:
    blocks = Blocks(executor.config.block_size, executor.num_kv_blocks)
    outs: list[list[int]] = [[] for _ in prompts]
    top: list[list[float]] = [[] for _ in prompts]

    def record(result_sampled: list[int | None], logprobs: list | None, which: list[int]) -> None:
        assert logprobs is not None
        for row, i in enumerate(which):
            token = result_sampled[row]
            if token is not None:
                outs[i].append(token)
                top[i].extend(lp.logprob for lp in logprobs[row].top)

    if split is not None:  # first part of every prompt longer than `split`: no sampling yet
        first = [ScheduledChunk(str(i), p[:split], 0, blocks.table(str(i), split), False, GREEDY, 0)
                 for i, p in enumerate(prompts) if len(p) > split]
        result = executor.execute(ModelBatch(first))
        assert result.sampled == [None] * len(first)
    chunks, which = [], []
    for i, p in enumerate(prompts):
        start = split if split is not None and len(p) > split else 0
        chunks.append(ScheduledChunk(str(i), p[start:], start, blocks.table(str(i), len(p)), True, GREEDY, 0))
        which.append(i)
    result = executor.execute(ModelBatch(chunks))
    record(result.sampled, result.logprobs, which)
    for _ in range(NEW_TOKENS - 1):
        if dummy_between:
            executor.execute_dummy()
        chunks = []
        for i, p in enumerate(prompts):
            pos = len(p) + len(outs[i]) - 1
            chunks.append(ScheduledChunk(str(i), [outs[i][-1]], pos, blocks.table(str(i), pos + 1), True, GREEDY,
                                         len(outs[i])))
        result = executor.execute(ModelBatch(chunks))
        assert result.forward_time_s > 0
        record(result.sampled, result.logprobs, list(range(len(prompts))))
    return outs, top


def hf_greedy(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path)).eval()
    refs = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=256, eos_token_id=None)
        refs.append(out[0, len(p):].tolist())
    return refs


def make_executor(path: Path, **changes: object) -> TorchExecutor:
    config = EngineConfig(model=str(path), device="cpu", block_size=4, num_kv_blocks=80).replace(**changes)
    return TorchExecutor(config, path)


def encode_all(path: Path) -> list[list[int]]:
    tok = load_tokenizer(path)
    return [tok.encode(p) for p in PROMPTS]


def test_batched_greedy_matches_transformers_generate(model_path: Path) -> None:
    prompts = encode_all(model_path)
    outs, _ = run_greedy(make_executor(model_path), prompts)
    assert outs == hf_greedy(model_path, prompts)


def test_chunked_prefill_gives_same_tokens_and_logprobs(model_path: Path) -> None:
    prompts = encode_all(model_path)
    whole, whole_top = run_greedy(make_executor(model_path), prompts)
    chunked, chunked_top = run_greedy(make_executor(model_path), prompts, split=6)
    assert chunked == whole
    torch.testing.assert_close(torch.tensor(chunked_top), torch.tensor(whole_top), rtol=1e-4, atol=1e-4)



def test_staggered_arrivals_mix_prefills_and_decodes_in_one_step(moe_path: Path) -> None:
    """Prompt i arrives at step 3*i, so most steps carry decodes plus a (chunked) prefill with a cached prefix."""
    prompts = encode_all(moe_path)
    executor = make_executor(moe_path)
    blocks = Blocks(executor.config.block_size, executor.num_kv_blocks)
    outs: list[list[int]] = [[] for _ in prompts]
    prefilled = [0] * len(prompts)
    step = 0
    while any(len(o) < NEW_TOKENS for o in outs):
        chunks, which = [], []
        for i, p in enumerate(prompts):
            if step < 3 * i or len(outs[i]) == NEW_TOKENS:
                continue
            if prefilled[i] < len(p):  # prefill in pieces of at most 7 tokens
                start, end = prefilled[i], min(prefilled[i] + 7, len(p))
                prefilled[i] = end
                chunks.append(ScheduledChunk(str(i), p[start:end], start, blocks.table(str(i), end), end == len(p),
                                             GREEDY, 0))
            else:
                pos = len(p) + len(outs[i]) - 1
                chunks.append(ScheduledChunk(str(i), [outs[i][-1]], pos, blocks.table(str(i), pos + 1), True,
                                             GREEDY, len(outs[i])))
            which.append(i)
        result = executor.execute(ModelBatch(chunks))
        for row, i in enumerate(which):
            token = result.sampled[row]
            if token is not None:
                outs[i].append(token)
        step += 1
    assert outs == hf_greedy(moe_path, prompts)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batched_greedy_on_cuda_matches_cpu(model_path: Path) -> None:
    prompts = encode_all(model_path)
    cpu, _ = run_greedy(make_executor(model_path), prompts)
    cuda, _ = run_greedy(make_executor(model_path, device="cuda"), prompts, split=6)
    assert cuda == cpu

def test_dummy_batches_between_steps_leave_outputs_unchanged(moe_path: Path) -> None:
    prompts = encode_all(moe_path)
    plain, _ = run_greedy(make_executor(moe_path), prompts)
    with_dummies, _ = run_greedy(make_executor(moe_path), prompts, dummy_between=True)
    assert with_dummies == plain


def test_kv_blocks_derive_from_memory_and_cap_at_max_num_seqs(dense_path: Path) -> None:
    # 4 layers x 2 (K, V) x block 16 x 2 kv heads x 16 dims x 4 bytes = 16 KiB per block
    small = make_executor(dense_path, num_kv_blocks=None, block_size=16, kv_cache_memory_bytes=10 * 16384,
                          max_model_len=256)
    assert small.num_kv_blocks == 10
    capped = make_executor(dense_path, num_kv_blocks=None, block_size=16, kv_cache_memory_bytes=1 << 30,
                           max_model_len=256, max_num_seqs=3)
    assert capped.num_kv_blocks == 3 * 256 // 16 + 1  # + the scratch block
    assert capped.max_model_len == 256
    assert make_executor(dense_path).max_model_len == 2048


def test_max_model_len_beyond_model_limit_is_a_config_error(dense_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        make_executor(dense_path, max_model_len=4096)


COMMON: dict[str, Any] = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
          "initializer_range": 0.3}
FAMILIES: dict[str, tuple[Any, dict[str, Any]]] = {
    "llama": (transformers.LlamaConfig, {"tie_word_embeddings": True, "rope_theta": 5000.0}),
    "qwen2": (transformers.Qwen2Config, {"tie_word_embeddings": False}),
    "mixtral": (transformers.MixtralConfig, {"num_local_experts": 4, "num_experts_per_tok": 2,
                                             "tie_word_embeddings": False}),
}


def save_random_model(kind: str, dest: Path) -> Any:
    config_cls, extra = FAMILIES[kind]
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(config_cls(**COMMON, **extra)).eval()
    if kind == "qwen2":  # biases start at zero; make them matter
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("_proj.bias"):
                    param.normal_(0.0, 0.5)
    model.save_pretrained(str(dest))
    return model


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_family_greedy_matches_transformers(kind: str, tmp_path: Path) -> None:
    model = save_random_model(kind, tmp_path)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 300, (n,), generator=gen).tolist() for n in (5, 17, 1, 30)]
    refs = []
    for p in prompts:
        ids = torch.tensor([p])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=0, eos_token_id=None)
        refs.append(out[0, len(p):].tolist())
    outs, _ = run_greedy(make_executor(tmp_path), prompts, split=8)
    assert outs == refs
