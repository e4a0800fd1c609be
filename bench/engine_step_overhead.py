"""Per-step Python overhead of EngineCore (scheduler + block manager + detokenizer + outputs), no model.

Runs the sim executor (zero forward time) at a fixed decode batch and reports microseconds per step, and the
share of a step that overhead would be next to a 1-3 ms forward. Prints a table and writes JSON.

    python bench/engine_step_overhead.py [--batch 32] [--prompt-len 512] [--steps 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))

from engine_testing import EOS_ID, VOCAB_SIZE, make_byte_tokenizer  # noqa: E402

from asyncdp.config.flags import EngineConfig  # noqa: E402
from asyncdp.engine.core import EngineCore  # noqa: E402
from asyncdp.engine.sim_executor import SimExecutor  # noqa: E402
from asyncdp.sampling_params import SamplingParams  # noqa: E402
from bench.serving import check_output, positive_int  # noqa: E402


def measure(batch: int, prompt_len: int, steps: int, tokenizer: object, params: SamplingParams) -> float:
    blocks = batch * (prompt_len + steps + 80) // 16 + 64  # room for everyone: no preemption while measuring
    cfg = EngineConfig(executor="sim", max_num_seqs=batch, max_num_batched_tokens=8192, num_kv_blocks=blocks)
    ex = SimExecutor(cfg, VOCAB_SIZE, max_model_len=prompt_len + steps + 64, avoid_token_ids={EOS_ID})
    core = EngineCore(cfg, ex, tokenizer, eos_token_ids={EOS_ID})
    for i in range(batch):
        core.add_request(str(i), [(i * 31 + j) % 256 for j in range(prompt_len)], params)
    while any(r.num_output_tokens == 0 for r in core.scheduler.requests.values()):
        core.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = core.step()
        times.append(time.perf_counter() - t0)
        assert len(out.outputs) == batch
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=positive_int, default=32)
    ap.add_argument("--prompt-len", type=positive_int, default=512)
    ap.add_argument("--steps", type=positive_int, default=300)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    check_output(ap, "--json", a.json)  # before the runs, not after them
    big = 10 ** 6
    cases = {
        "no tokenizer": (None, SamplingParams(max_tokens=big, ignore_eos=True)),
        "byte tokenizer": (make_byte_tokenizer(), SamplingParams(max_tokens=big, ignore_eos=True)),
        "byte tokenizer + stop strings": (
            make_byte_tokenizer(), SamplingParams(max_tokens=big, ignore_eos=True, stop=("\x00\x00\x00", "zzq"))),
    }
    rows = {}
    print(f"batch {a.batch}, prompt {a.prompt_len}, median of {a.steps} decode steps")
    print(f"{'case':34} {'us/step':>8} {'share@1ms':>10} {'share@2ms':>10} {'share@3ms':>10}")
    for name, (tok, params) in cases.items():
        us = measure(a.batch, a.prompt_len, a.steps, tok, params)
        shares = [us / (us + f * 1000) for f in (1, 2, 3)]
        rows[name] = {"us_per_step": us, "share_1ms": shares[0], "share_2ms": shares[1], "share_3ms": shares[2]}
        print(f"{name:34} {us:8.1f} {shares[0]:10.1%} {shares[1]:10.1%} {shares[2]:10.1%}")
    if a.json:
        a.json.write_text(json.dumps({"batch": a.batch, "prompt_len": a.prompt_len, "cases": rows}, indent=2))


if __name__ == "__main__":
    main()
