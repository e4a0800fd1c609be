"""MoE data parallelism with real processes: two ranks in a gloo group over loopback (spec §5.5, §9).

One pair of worker processes (``dp_worker.py``) serves every multi-process check of this module. The greedy checks
compare each prompt's tokens at dp = 2 against one single-process executor that decodes all prompts together:
the ranks get different prompt subsets of different sizes, rank 1 starts late and finishes early (dummy batches
while rank 0 decodes), so the per-layer all-to-all splits and the all-gather padding are uneven.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from dp_worker import DPRanks
from lockstep_drivers import run_core, run_schedule

from asyncdp.config.flags import EngineConfig
from asyncdp.engine.model_runner import TorchExecutor
from asyncdp.errors import StartupError
from asyncdp.messages import DPGroupInfo
from asyncdp.model.distributed import (
    cpu_threads_per_engine,
    dp_backend,
    host_rendezvous_store,
    init_dp_group,
    retry_address_in_use,
)
from asyncdp.model.expert_parallel import pack_rows, unpack_rows

TEXTS = ["Hello world", "ab", "The quick brown fox jumps over the lazy dog. " * 3, "a",
         "Once upon a time, in a land far away, there lived a king who"]
MAX_TOKENS = [10, 4, 7, 3, 6]  # rank 0's prefill (148 tokens x top-2) exceeds the padded dispatch cap
RANK_PROMPTS = [[0, 1, 2], [3, 4]]
RANK_START = [0, 3]
TOTAL_STEPS = 14


@pytest.fixture(scope="module")
def ranks(moe_path: Path) -> Any:
    with DPRanks(moe_path, 2, timeout_s=90.0) as pair:
        yield pair


@pytest.fixture(scope="module")
def reference(moe_path: Path) -> tuple[list[list[int]], list[list[float]]]:
    config = EngineConfig(model=str(moe_path), device="cpu", dtype="float32", num_kv_blocks=64, block_size=16,
                          max_num_seqs=8, torch_threads=1)
    executor = TorchExecutor(config, moe_path)
    prompts = [list(t.encode()) for t in TEXTS]
    return run_schedule(executor, prompts, MAX_TOKENS, start_step=0, total_steps=max(MAX_TOKENS))


def _rank_args(mode: str, **extra: Any) -> list[dict[str, Any]]:
    return [{"mode": mode, "prompts": [list(TEXTS[i].encode()) for i in which], "max_tokens": [MAX_TOKENS[i] for i in which],
             "start_step": RANK_START[r], "total_steps": TOTAL_STEPS, **extra} for r, which in enumerate(RANK_PROMPTS)]


@pytest.mark.parametrize("mode", ["ep", "ep-uneven", "tp"])
def test_greedy_tokens_at_dp2_match_dp1_with_uneven_ranks_and_dummy_steps(ranks: DPRanks, reference: Any,
                                                                          mode: str) -> None:
    # "ep": padded all-to-all in decode, uneven for the prefill steps (max_tokens * top_k above the cap).
    # "ep-uneven": every step with the counts exchange and uneven splits. "tp": experts sharded, EP off; it also
    # runs its idle steps as empty batches (which must still join the collectives).
    results = ranks.call("greedy", _rank_args(mode, empty_batch_steps=mode == "tp"))
    ref_tokens, ref_logprobs = reference
    for r, which in enumerate(RANK_PROMPTS):
        res = results[r]
        assert res["exchanges"] == TOTAL_STEPS  # one token-count exchange per forward, real or dummy
        for i, tokens, logprobs in zip(which, res["outputs"], res["logprobs"], strict=True):
            assert tokens == ref_tokens[i], f"prompt {i} on rank {r}"
            # Same tokens could hide a small numeric error: the logprobs agree to float32 noise as well.
            assert logprobs == pytest.approx(ref_logprobs[i], abs=1e-4), f"prompt {i} on rank {r}"
    if mode != "tp":
        layers = 4
        dispatches = [(res["padded_dispatches"], res["uneven_dispatches"]) for res in results]
        assert dispatches[0] == dispatches[1]  # the choice depends only on shared values
        padded, uneven = dispatches[0]
        assert padded + uneven == TOTAL_STEPS * layers
        assert (padded > 0 and uneven > 0) if mode == "ep" else padded == 0


# Engine-core requests: (text index, max_tokens, arrival iteration) per rank. Rank 1's work arrives late and ends
# early; the 24-token step budget splits the long prompts into chunks, mixed with other requests' decodes.
CORE_REQUESTS = [[(2, 6, 0), (0, 5, 2), (1, 9, 4)], [(4, 4, 3), (3, 3, 5)]]


def _core_requests(rank: int) -> list[dict[str, Any]]:
    return [{"id": f"r{rank}-{i}", "prompt": list(TEXTS[t].encode()), "max_tokens": n, "arrive": at}
            for i, (t, n, at) in enumerate(CORE_REQUESTS[rank])]


@pytest.mark.parametrize("mode", ["ep", "tp"])
def test_engine_cores_in_lockstep_at_dp2_match_dp1_with_chunked_prefill_and_late_arrivals(
        ranks: DPRanks, moe_path: Path, mode: str) -> None:
    config = EngineConfig(model=str(moe_path), device="cpu", dtype="float32", num_kv_blocks=64, block_size=16,
                          max_num_seqs=8, torch_threads=1)
    expected = run_core(TorchExecutor(config, moe_path), _core_requests(0) + _core_requests(1))
    assert all(len(expected["tokens"][r["id"]]) == r["max_tokens"] for r in _core_requests(0) + _core_requests(1))
    results = ranks.call("core_generate", [{"mode": mode, "requests": _core_requests(r)} for r in range(2)])
    assert results[0]["real"] + results[0]["dummy"] == results[1]["real"] + results[1]["dummy"]  # lockstep
    assert results[1]["dummy"] > 0  # rank 1 kept rank 0 company with dummy batches
    for res in results:
        for rid, tokens in res["tokens"].items():
            assert tokens == expected["tokens"][rid], rid
            assert res["logprobs"][rid] == pytest.approx(expected["logprobs"][rid], abs=1e-4), rid


@pytest.mark.parametrize(("tokens", "route_to"), [([5, 3], None), ([7, 0], None), ([4, 2], 1), ([1, 6], 0)],
                         ids=["uneven", "one-rank-empty", "all-to-rank-1", "all-to-rank-0"])
def test_expert_backends_match_the_full_layer_with_uneven_splits(ranks: DPRanks, tokens: list[int],
                                                                 route_to: int | None) -> None:
    results = ranks.call("backends", [{"tokens": tokens, "num_experts": 5, "route_to": route_to}] * 2)
    for r, res in enumerate(results):
        for kind in ("ep", "ep-uneven", "tp"):
            assert res[kind]["sizes"] == tokens
            assert res[kind]["shape"] == [tokens[r], 16]
            assert res[kind]["max_abs_err"] < 1e-4, (kind, r, res[kind])


def test_control_all_reduce_sums_and_maxes_across_processes_then_fails_after_abort(ranks: DPRanks) -> None:
    results = ranks.call("all_reduce", [{"values": [1, 0, 7]}, {"values": [0, 1, 3]}])
    for r, res in enumerate(results):
        assert (res["rank"], res["size"]) == (r, 2)
        assert res["sum"] == [1, 1, 10]
        assert res["max"] == [1, 1, 7]
        assert res["after_abort"] == "aborted"
        assert res["communicator_aborts"] == 1  # abort is idempotent


def test_rendezvous_store_binds_a_real_port_clients_can_reach() -> None:
    store, port = host_rendezvous_store("127.0.0.1", timeout_s=10.0)
    assert port > 0
    client = dist.TCPStore("127.0.0.1", port, is_master=False)
    client.set("k", "v")
    assert store.get("k") == b"v"


def test_init_retries_address_in_use_four_times_then_raises_startup_error() -> None:
    calls: list[int] = []
    sleeps: list[float] = []

    def join() -> None:
        calls.append(1)
        raise RuntimeError("The server socket has failed to listen on any local network address: "
                           "Address already in use")

    with pytest.raises(StartupError, match="5 'address in use'"):
        retry_address_in_use(join, sleep=sleeps.append, delay_s=0.1)
    assert len(calls) == 5
    assert sleeps == [0.1, 0.2, 0.4, 0.8]


def test_init_retry_returns_after_a_transient_address_in_use() -> None:
    attempts = iter([OSError("[Errno 98] Address already in use"), None])

    def join() -> str:
        exc = next(attempts)
        if exc is not None:
            raise exc
        return "joined"

    assert retry_address_in_use(join, sleep=lambda s: None) == "joined"


def test_init_does_not_retry_other_failures() -> None:
    calls = []

    def join() -> None:
        calls.append(1)
        raise RuntimeError("connection refused")

    with pytest.raises(RuntimeError, match="refused"):
        retry_address_in_use(join, sleep=lambda s: None)
    assert len(calls) == 1


def test_init_rejects_a_rank_outside_the_group_and_nccl_without_cuda() -> None:
    info = DPGroupInfo(master_addr="127.0.0.1", master_port=1, dp_size=2, backend="gloo", launch_nonce=bytes(16))
    with pytest.raises(StartupError, match="outside the DP group"):
        init_dp_group(info, 2)
    if not torch.cuda.is_available():
        with pytest.raises(StartupError, match="CUDA is not available"):
            init_dp_group(DPGroupInfo(master_addr="127.0.0.1", master_port=1, dp_size=2, backend="nccl",
                                      launch_nonce=bytes(16)), 0)


def test_backend_and_cpu_threads_follow_the_device_and_local_engine_count() -> None:
    assert dp_backend("cuda") == "nccl"
    assert dp_backend("cpu") == "gloo"
    assert cpu_threads_per_engine(4, cpu_count=16) == 4
    assert cpu_threads_per_engine(4, cpu_count=2) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_packed_rows_carry_expert_ids_bit_exactly_in_every_dtype(dtype: torch.dtype) -> None:
    hidden = torch.randn(5, 8).to(dtype)
    ids = torch.tensor([[0, 1], [5, 255], [256, 70000], [-1, 3], [2**31 - 1, 7]])
    weights = torch.rand(5, 2).to(dtype)
    packed = pack_rows(hidden, ids, weights)
    assert packed.dtype == dtype
    # A byte copy, as the collectives do, keeps the id bits (they may read as subnormals or NaNs).
    h, i, w = unpack_rows(torch.cat([packed[3:], packed[:3]]), 8, 2)
    assert torch.equal(i, torch.cat([ids[3:], ids[:3]]))
    assert torch.equal(h, torch.cat([hidden[3:], hidden[:3]]))
    assert torch.equal(w, torch.cat([weights[3:], weights[:3]]))
