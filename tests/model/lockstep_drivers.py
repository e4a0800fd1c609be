"""The lockstep drivers shared by the DP workers (``dp_worker.py``), their single-process references and the
bench (``bench/lockstep_collectives.py``); each runs one executor, on one rank or alone.

``run_schedule`` plays a scheduler that holds a fixed set of prompts, runs exactly ``total_steps`` forwards
(dummy ones while it has nothing to do) and returns the greedy tokens of each prompt. ``run_core`` serves
requests through a real ``EngineCore`` in the MoE lockstep shape. ``time_decode`` times decode steps.
"""

from __future__ import annotations

from typing import Any

GREEDY_KW: dict[str, Any] = {"temperature": 0.0, "ignore_eos": True, "logprobs": 0}


def run_schedule(executor: Any, prompts: list[list[int]], max_tokens: list[int], *, start_step: int,
                 total_steps: int, empty_batch_steps: bool = False) -> tuple[list[list[int]], list[list[float]]]:
    """Prefill every prompt at ``start_step``, decode each until it has ``max_tokens[i]`` tokens; dummies elsewhere.

    Returns each prompt's greedy tokens and their logprobs.

    ``empty_batch_steps`` runs idle steps as ``execute(ModelBatch([]))`` instead of ``execute_dummy()``.
    """
    from asyncdp.engine.executor import ModelBatch, ScheduledChunk
    from asyncdp.sampling_params import SamplingParams

    bs = executor.config.block_size
    free = list(range(executor.num_kv_blocks - 1, 0, -1))  # block 0 is the scratch block
    tables: dict[int, list[int]] = {}
    outs: list[list[int]] = [[] for _ in prompts]
    logprobs: list[list[float]] = [[] for _ in prompts]

    def table(i: int, num_tokens: int) -> list[int]:
        t = tables.setdefault(i, [])
        while len(t) * bs < num_tokens:
            t.append(free.pop())
        return list(t)

    for step in range(total_steps):
        chunks, which = [], []
        if step == start_step:
            for i, p in enumerate(prompts):
                params = SamplingParams(max_tokens=max_tokens[i], **GREEDY_KW)
                chunks.append(ScheduledChunk(str(i), p, 0, table(i, len(p)), True, params, 0))
                which.append(i)
        elif step > start_step:
            for i, p in enumerate(prompts):
                if len(outs[i]) < max_tokens[i]:
                    pos = len(p) + len(outs[i]) - 1
                    params = SamplingParams(max_tokens=max_tokens[i], **GREEDY_KW)
                    chunks.append(ScheduledChunk(str(i), [outs[i][-1]], pos, table(i, pos + 1), True, params,
                                                 len(outs[i])))
                    which.append(i)
        if chunks:
            result = executor.execute(ModelBatch(chunks))
            for row, i in enumerate(which):
                token = result.sampled[row]
                assert token is not None and result.logprobs is not None
                outs[i].append(token)
                logprobs[i].append(result.logprobs[row].logprob)
        elif empty_batch_steps:
            executor.execute(ModelBatch([]))
        else:
            executor.execute_dummy()
    if any(len(o) < n for o, n in zip(outs, max_tokens, strict=True)):
        raise RuntimeError(f"{total_steps} steps are too few for max_tokens {max_tokens}")
    return outs, logprobs


def run_core(executor: Any, requests: list[dict[str, Any]], *, all_reduce_sum: Any = None,
             max_num_batched_tokens: int = 24) -> dict[str, Any]:
    """Serve ``requests`` through a real ``EngineCore`` (scheduler, chunked prefill) in the MoE lockstep shape.

    Each request is ``{"id", "prompt", "max_tokens", "arrive"}`` (the iteration it is added at). Every iteration
    runs exactly one forward (the core's step, or a dummy when it scheduled nothing), then, with a group, an
    all-reduce of "has work" decides whether the group goes on (a sync at every step). Returns the tokens and
    logprobs of each request, and the numbers of real and dummy forwards.
    """
    from asyncdp.engine.core import EngineCore
    from asyncdp.sampling_params import SamplingParams

    config = executor.config.replace(max_num_batched_tokens=max_num_batched_tokens, enable_prefix_caching=False)
    core = EngineCore(config, executor, None, eos_token_ids=())
    tokens: dict[str, list[int]] = {r["id"]: [] for r in requests}
    logprobs: dict[str, list[float]] = {r["id"]: [] for r in requests}
    real = dummy = iteration = 0
    while True:
        for r in requests:
            if r["arrive"] == iteration:
                core.add_request(r["id"], r["prompt"], SamplingParams(max_tokens=r["max_tokens"], **GREEDY_KW))
        out = core.step()
        if out.executed:
            real += 1
        else:
            core.execute_dummy()
            dummy += 1
        for o in out.outputs:
            tokens[o.request_id].extend(o.new_token_ids)
            logprobs[o.request_id].extend(lp.logprob for lp in o.logprobs or [])
        iteration += 1
        local = int(core.has_unfinished() or any(r["arrive"] >= iteration for r in requests))
        if (all_reduce_sum(local) if all_reduce_sum is not None else local) == 0:
            break
    return {"tokens": tokens, "logprobs": logprobs, "real": real, "dummy": dummy}


def time_decode(executor: Any, *, batch: int, prompt_len: int, steps: int, idle: bool = False) -> list[float]:
    """Seconds per decode step of ``batch`` sequences after one prefill; ``idle``: dummy steps only (a rank with
    no work keeping its peers company)."""
    import time

    from asyncdp.engine.executor import ModelBatch, ScheduledChunk
    from asyncdp.sampling_params import SamplingParams

    bs = executor.config.block_size
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    per_seq = -(-(prompt_len + steps + 1) // bs)
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
    last = [0] * batch
    times = []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        if idle:
            executor.execute_dummy()
        else:
            if step == 0:
                chunks = [ScheduledChunk(str(i), [(i * 7 + j) % 200 + 32 for j in range(prompt_len)], 0, tables[i],
                                         True, params, 0) for i in range(batch)]
            else:
                chunks = [ScheduledChunk(str(i), [last[i]], prompt_len + step - 1, tables[i], True, params, step)
                          for i in range(batch)]
            result = executor.execute(ModelBatch(chunks))
            last = [t if t is not None else 0 for t in result.sampled]
        if step:  # the prefill step is not a decode step
            times.append(time.perf_counter() - t0)
    return times
