"""Ctrl-C (KeyboardInterrupt) that lands in ``EngineCore.step()`` outside the forward (in the scheduler, the block
manager, or while the sampled tokens are appended) must leave the offline ``LLM`` usable: its next ``generate()``
returns exactly what a fresh one returns, and the cache ends with every block free and no stale prefix-cache entry.

The interrupt is injected at calls the step makes (before or after the call did its work), on the nth call. The
executor is ``KVReadingExecutor``: it samples from the context it reads back from the KV slots, so a prefix-cache
hit on a block no forward wrote, or a block handed to two requests, changes the tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from test_engine_kv_consistency import BASE, make_core

from asyncdp.engine.block_manager import BlockManager
from asyncdp.engine.core import EngineCore
from asyncdp.engine.request import Request
from asyncdp.engine.scheduler import Scheduler
from asyncdp.llm import LLM
from asyncdp.sampling_params import SamplingParams

PROMPTS = [BASE[:n] + list(b"#%d" % i) for i, n in enumerate([20, 20, 9, 33, 14, 26])]
PARAMS = SamplingParams(max_tokens=10)
# 12 usable blocks of 4 tokens for six requests of up to 45 tokens, 16 tokens a step: prefix hits, chunked
# prefill and preemption all happen.
CONFIG: dict[str, Any] = {"num_kv_blocks": 13, "block_size": 4, "max_num_batched_tokens": 16, "max_num_seqs": 4}

POINTS: list[tuple[object, str]] = [
    (BlockManager, "find_cached_prefix"), (BlockManager, "allocate"), (BlockManager, "_publish"),
    (BlockManager, "record_admission"), (BlockManager, "free"),
    (Scheduler, "_schedule_running"), (Scheduler, "_admit_waiting"), (Scheduler, "_preempt"),
    (Scheduler, "_requeue"), (Scheduler, "_settle"), (Scheduler, "_owe_uncached"), (Request, "take_chunk"),
    # after the forward: the tokens are appended, requests finish and are retired
    (Scheduler, "update"), (EngineCore, "_stop_status"), (Scheduler, "retire"),
]


def fresh_llm() -> LLM:
    return LLM.from_engine_core(make_core(**CONFIG))


def tokens(llm: LLM) -> list[list[int]]:
    return [r.outputs[0].token_ids for r in llm.generate(PROMPTS, PARAMS)]


REFERENCE = tokens(fresh_llm())


@contextmanager
def interrupt_at(owner: object, name: str, nth: int, after: bool) -> Iterator[None]:
    """The ``nth`` call of ``owner.name`` raises KeyboardInterrupt, before or after doing its work."""
    real: Callable[..., Any] = getattr(owner, name)
    calls = 0

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == nth and not after:
            raise KeyboardInterrupt
        result = real(*args, **kwargs)
        if calls == nth and after:
            raise KeyboardInterrupt
        return result

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, real)


def assert_cache_clean(core: EngineCore) -> None:
    bm = core.block_manager
    assert not core.scheduler.requests and not core.scheduler.waiting and not core.scheduler.running
    assert core.scheduler.prefill_tokens == 0
    assert bm.num_free_blocks == bm.num_usable_blocks
    assert all(bm.ref_count(b) == 0 for b in range(bm.num_blocks))
    for h, bid in bm._cached.items():  # every entry names a block that still carries its hash
        assert bm.block_hash(bid) == h


def test_the_workload_preempts_hits_the_prefix_cache_and_chunks_prefills() -> None:
    llm = fresh_llm()
    tokens(llm)
    stats = llm.llm_engine.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert len(set(map(tuple, REFERENCE))) == len(PROMPTS)


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize(("owner", "name"), POINTS, ids=[name for _, name in POINTS])
def test_generate_after_an_interrupt_in_the_step_gives_the_tokens_of_a_fresh_llm(
        owner: object, name: str, after: bool) -> None:
    llm = fresh_llm()
    interrupted = 0
    for nth in (1, 2, 3, 5, 8, 13, 21):
        with interrupt_at(owner, name, nth, after):
            try:
                llm.generate(PROMPTS, PARAMS)
            except KeyboardInterrupt:
                interrupted += 1
        assert tokens(llm) == REFERENCE, f"after an interrupt at call {nth}"
        assert_cache_clean(llm.llm_engine)
    assert interrupted >= 3


def test_the_step_after_an_interrupted_one_reports_every_request_aborted_and_frees_everything() -> None:
    core = make_core(**CONFIG)
    for i, prompt in enumerate(PROMPTS):
        core.add_request(str(i), prompt, PARAMS)
    core.step()
    with interrupt_at(BlockManager, "allocate", 2, after=True), pytest.raises(KeyboardInterrupt):
        core.step()
    step = core.step()
    assert not step.executed
    assert sorted((o.request_id, o.finished, o.finish_reason) for o in step.outputs) == [
        (str(i), True, "abort") for i in range(len(PROMPTS))]
    assert sorted(step.finished_request_ids) == [str(i) for i in range(len(PROMPTS))]
    assert_cache_clean(core)
    assert core.block_manager.num_cached_blocks == 0  # a half-done publication is not trusted
    assert not core.has_unfinished()


def test_a_failed_forward_still_keeps_its_requests() -> None:
    """Only an interrupt outside the forward drops the requests; a failed forward requeues them (unschedule)."""
    core = make_core(**CONFIG)
    core.add_request("a", PROMPTS[0], PARAMS)
    with interrupt_at(core.executor, "execute", 1, after=False), pytest.raises(KeyboardInterrupt):
        core.step()
    got: list[int] = []
    while core.has_unfinished():
        got += [t for o in core.step().outputs for t in o.new_token_ids]
    assert got == REFERENCE[0]


def test_a_pause_with_a_bad_mode_drops_nothing() -> None:
    core = make_core(**CONFIG)
    core.add_request("a", PROMPTS[0], PARAMS)
    with pytest.raises(ValueError, match="pause mode"):
        core.pause("later")  # type: ignore[arg-type]
    got: list[int] = []
    while core.has_unfinished():
        got += [t for o in core.step().outputs for t in o.new_token_ids]
    assert got == REFERENCE[0]
