"""The batch sweep of ``asyncdp bench calibrate`` (spec routing-bench §5, "Calibration"): which steps to time on
the real engine, capped by what the engine allows, and timing them.

:func:`plan` is pure: a :class:`Grid` (prefill-only steps of P tokens; decode-only steps of D sequences at a
context) and the engine's :class:`Capacity` in, the points to measure and the ones skipped (with the reason)
out. A prefill point longer than ``max_model_len - 1`` is split over the fewest sequences that fit; the first
context of the grid beyond what ``max_model_len`` leaves room for is measured at the largest that fits
("clamped"), larger ones are skipped.

:class:`Sweep` drives an in-process ``EngineCore`` (the real scheduler, block manager and model runner) and
times the wall time of each ``step()`` that does exactly the planned work. It wraps the core's executor in a
recorder that keeps the work of the last batch (P, D, K and the prefill token pairs E, from the
``ModelBatch`` the scheduler built), so every timed step is checked, and K is what the scheduler counted.

- Prefill point: fresh random prompts (no prefix-cache hit) with ``max_tokens=1``; one step computes them all.
  One untimed repetition, then ``repeats`` timed ones; the median counts.
- Decode point: D distinct random prompts of ``context - 1`` tokens are first prefilled with ``max_tokens=1``
  (their full blocks stay cached), then submitted again: each recomputes at most one block, so within a step
  or two all D are decoding, with distinct KV blocks (no shared prefix, so KV reads are real). The first pure
  decode step is a warm-up, the next ``repeats`` are timed; then the requests are aborted.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from asyncdp.bench.fit import StepWork
from asyncdp.engine.core import EngineCore
from asyncdp.engine.executor import Executor, ModelBatch, StepResult
from asyncdp.engine.sim_executor import prefill_token_pairs
from asyncdp.sampling_params import SamplingParams

SETUP_STEP_LIMIT = 100_000  # a point whose setup takes more steps than this is skipped (the engine is stuck)


@dataclass(frozen=True, slots=True)
class Grid:
    prefill_tokens: tuple[int, ...]
    decode_seqs: tuple[int, ...]
    contexts: tuple[int, ...]


FULL = Grid(prefill_tokens=(256, 512, 1024, 2048, 4096, 8192), decode_seqs=(1, 4, 16, 64, 256, 1024),
            contexts=(512, 1024, 2048, 4096, 8192, 16384, 32768))
QUICK = Grid(prefill_tokens=(32, 64, 128), decode_seqs=(1, 4), contexts=(32, 64))


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the engine allows in one step."""

    max_model_len: int
    usable_kv_blocks: int  # the engine's blocks minus the reserved scratch block
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int


@dataclass(frozen=True, slots=True)
class Point:
    kind: Literal["prefill", "decode"]
    P: int  # prefill tokens (prefill points), else 0
    D: int  # decoding sequences (decode points), else 0
    context: int  # decode points: each sequence's context after its first decode step; prefill points: 0
    prompt_lens: tuple[int, ...]
    note: str = ""

    @property
    def label(self) -> str:
        return f"prefill P={self.P}" if self.kind == "prefill" else f"decode D={self.D} ctx={self.context}"


@dataclass(frozen=True, slots=True)
class Skipped:
    label: str
    reason: str


@dataclass(frozen=True, slots=True)
class Measured:
    point: Point
    work: StepWork  # P, D as planned; K and E the mean over the timed steps
    ms: float  # the median of samples_ms
    samples_ms: tuple[float, ...]


def _decode_slack(d: int, cap: Capacity, repeats: int) -> int:
    """Decode steps a sequence may take before the timing ends: the re-admission (each request recomputes up
    to one block, after the running decodes took their tokens), the warm-up step and the timed ones."""
    admission = math.ceil(d * cap.block_size / max(cap.max_num_batched_tokens - d, cap.block_size)) + 2
    return admission + 1 + repeats


def _split(total: int, most: int) -> tuple[int, ...]:
    n = math.ceil(total / most)
    return tuple(total // n + (1 if i < total % n else 0) for i in range(n))


def plan(grid: Grid, cap: Capacity, repeats: int) -> tuple[list[Point], list[Skipped]]:
    """The points of ``grid`` the engine can run, and the others with the reason."""
    points: list[Point] = []
    skipped: list[Skipped] = []
    bs = cap.block_size
    for p in grid.prefill_tokens:
        label = f"prefill P={p}"
        lens = _split(p, cap.max_model_len - 1)
        blocks = sum(math.ceil(n / bs) for n in lens)
        if p > cap.max_num_batched_tokens:
            skipped.append(Skipped(label, f"P exceeds max_num_batched_tokens {cap.max_num_batched_tokens}"))
        elif len(lens) > cap.max_num_seqs:
            skipped.append(Skipped(label, f"needs {len(lens)} sequences of at most max_model_len - 1 = "
                                          f"{cap.max_model_len - 1} tokens; max_num_seqs is {cap.max_num_seqs}"))
        elif blocks > cap.usable_kv_blocks:
            skipped.append(Skipped(label, f"needs {blocks} KV blocks; the engine has {cap.usable_kv_blocks}"))
        else:
            note = f"{len(lens)} sequences (max_model_len {cap.max_model_len})" if len(lens) > 1 else ""
            points.append(Point("prefill", p, 0, 0, lens, note))
    for d in grid.decode_seqs:
        slack = _decode_slack(d, cap, repeats)
        longest = cap.max_model_len - 1 - slack  # the context a sequence may start its timing at
        measured_below = 0
        for ctx in sorted(grid.contexts):
            label = f"decode D={d} ctx={ctx}"
            note = ""
            if d > cap.max_num_seqs:
                skipped.append(Skipped(label, f"D exceeds max_num_seqs {cap.max_num_seqs}"))
                continue
            if d > cap.max_num_batched_tokens:
                skipped.append(Skipped(label, f"D exceeds max_num_batched_tokens {cap.max_num_batched_tokens}"))
                continue
            run_ctx = ctx
            if ctx > longest:
                if longest < 2 or longest <= measured_below:
                    skipped.append(Skipped(label, f"context exceeds max_model_len {cap.max_model_len} (with "
                                                  f"{slack} decode steps of room)"))
                    continue
                run_ctx, note = longest, f"context clamped from {ctx} (max_model_len {cap.max_model_len})"
            blocks = d * math.ceil((run_ctx + slack + 1) / bs)
            if blocks > cap.usable_kv_blocks:
                skipped.append(Skipped(label, f"needs {blocks} KV blocks; the engine has {cap.usable_kv_blocks}"))
                continue
            measured_below = run_ctx
            points.append(Point("decode", 0, d, run_ctx, (run_ctx - 1,) * d, note))
    return points, skipped


def batch_work(batch: ModelBatch) -> StepWork:
    """The work of one scheduled batch, as the scheduler counted it, plus the prefill token pairs E (the sim
    executor's own count, so the fit and the simulator agree on what E is)."""
    return StepWork(batch.num_prefill_tokens, batch.num_decode_seqs, batch.num_kv_tokens,
                    prefill_token_pairs(batch))


class RecordingExecutor:
    """The engine's executor, unchanged, keeping the work of the last batch it ran."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.last = StepWork(0, 0, 0)

    @property
    def modelled_step_s(self) -> float | None:
        return self.inner.modelled_step_s

    @property
    def num_kv_blocks(self) -> int:
        return self.inner.num_kv_blocks

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    def execute(self, batch: ModelBatch) -> StepResult:
        self.last = batch_work(batch)
        return self.inner.execute(batch)

    def execute_dummy(self) -> None:
        self.inner.execute_dummy()

    def shutdown(self) -> None:
        self.inner.shutdown()


class Sweep:
    """Times planned points on ``core`` (which must have no requests); ``clock`` is the wall clock."""

    def __init__(self, core: EngineCore, repeats: int, *, seed: int = 0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.core = core
        self.repeats = repeats
        self.recorder = RecordingExecutor(core.executor)
        core.executor = self.recorder
        self._rng = random.Random(seed)
        self._vocab = min(getattr(self.recorder.inner, "vocab_size", None) or 256, 32_000)
        self._clock = clock
        self._ids = 0

    def _prompt(self, n: int) -> list[int]:
        return [self._rng.randrange(self._vocab) for _ in range(n)]

    def _add(self, prompt: list[int], params: SamplingParams) -> str:
        self._ids += 1
        rid = f"cal-{self._ids}"
        self.core.add_request(rid, prompt, params)
        return rid

    def _timed_step(self) -> tuple[float, StepWork]:
        self.recorder.last = StepWork(0, 0, 0)
        start = self._clock()
        self.core.step()
        return (self._clock() - start) * 1e3, self.recorder.last

    def _drain(self) -> None:
        steps = 0
        while self.core.has_unfinished():
            self.core.step()
            steps += 1
            if steps > SETUP_STEP_LIMIT:
                raise RuntimeError("the engine did not finish the calibration requests")

    def warm_up(self) -> None:
        """A short prefill and a few decode steps, untimed (allocator, kernels, caches)."""
        n = max(2, min(256, self.core.max_model_len // 2, self.core.scheduler.max_num_batched_tokens))
        self._add(self._prompt(n), SamplingParams(max_tokens=4, ignore_eos=True))
        self._drain()

    def measure(self, point: Point) -> Measured | Skipped:
        result = self._prefill(point) if point.kind == "prefill" else self._decode(point)
        self._drain()
        return result

    def _result(self, point: Point, samples: list[tuple[float, StepWork]]) -> Measured:
        ms = [t for t, _ in samples]
        k = round(statistics.fmean(w.K for _, w in samples))
        e = statistics.fmean(w.E for _, w in samples)
        return Measured(point, StepWork(point.P, point.D, k, e), statistics.median(ms), tuple(ms))

    def _prefill(self, point: Point) -> Measured | Skipped:
        samples = []
        for rep in range(1 + self.repeats):
            for n in point.prompt_lens:
                self._add(self._prompt(n), SamplingParams(max_tokens=1))
            ms, work = self._timed_step()
            if (work.P, work.D) != (point.P, 0) or self.core.has_unfinished():
                return Skipped(point.label, f"the engine scheduled P={work.P} D={work.D}, not this point's work")
            if rep:
                samples.append((ms, work))
        return self._result(point, samples)

    def _decode(self, point: Point) -> Measured | Skipped:
        prompts = [self._prompt(n) for n in point.prompt_lens]
        for prompt in prompts:
            self._add(prompt, SamplingParams(max_tokens=1))
        self._drain()  # their full blocks stay cached: the second submission recomputes at most one block each
        ids = [self._add(prompt, SamplingParams(max_tokens=None, ignore_eos=True)) for prompt in prompts]
        try:
            for _ in range(SETUP_STEP_LIMIT):
                _, work = self._timed_step()
                if (work.P, work.D) == (0, point.D):
                    break  # the first pure decode step: the warm-up
                if not self.core.has_unfinished():
                    return Skipped(point.label, "the sequences finished before they all decoded in one step")
            else:
                return Skipped(point.label, "the sequences never all decoded in one step")
            samples = []
            for _ in range(self.repeats):
                ms, work = self._timed_step()
                if (work.P, work.D) != (0, point.D):
                    return Skipped(point.label, f"a timed step had P={work.P} D={work.D}, not D={point.D} "
                                                "decodes only")
                samples.append((ms, work))
            return self._result(point, samples)
        finally:
            self.core.abort_requests(ids)


def capacity(core: EngineCore) -> Capacity:
    """The step limits of ``core``."""
    bm, sched = core.block_manager, core.scheduler
    return Capacity(core.max_model_len, bm.num_usable_blocks, bm.block_size, sched.max_num_seqs,
                    sched.max_num_batched_tokens)
