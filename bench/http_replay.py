"""Replay a routing-bench workload against a real ``asyncdp serve`` over HTTP (issue 10, items 5 and 6).

Each :class:`~asyncdp.bench.records.Record` is one streamed ``POST /v1/completions``: its token ids as the prompt,
materialised as the simulator does (:class:`~asyncdp.bench.materialise.Materialiser`), ``max_tokens = min_tokens =
output_length``, ``ignore_eos``, greedy. ``continuous_usage_stats`` puts the tokens so far in every chunk, so the
first chunk with ``completion_tokens > 0`` is the first token; times are taken when a chunk's line arrives.

Send rule, as :mod:`asyncdp.bench.simulate`: at ``t_arrival_ms``, or with ``after_req`` at ``max(t_arrival_ms,
done(after_req) + think_ms)``. A multi-turn history quotes the *simulated* answer, which the real model does not
generate, so compare hit rates on single-turn workloads (W1, W3, W6). At most ``concurrency`` requests are
outstanding; ``t_send_s`` is when a request actually went out and the worst lag behind schedule is reported. The
replay has a deadline (unfinished requests become ``deadline`` errors) and sends to 127.0.0.1 only.

The result is the simulator's own :class:`~asyncdp.bench.simulate.RunLog` (rank -1: HTTP does not say where a
request ran), so :func:`asyncdp.bench.metrics.compute` measures both sides alike. The server's ``/metrics``
counters, differenced around the run (:class:`ServerCounters`), give the prefix-cache hit rate (Δ hits / Δ
queries, in tokens) and the per-rank load ratio (Δ ``request_success``, busiest over mean). The CLIs are
``bench/routing_real.py`` and ``bench/sim_validation.py``; ``tests/bench/test_http_replay.py`` tests this module.
A request's body and the reading of its stream are in ``bench/completion_stream.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import httpx
import msgspec

from asyncdp.bench import metrics
from asyncdp.bench.materialise import Materialiser, ideal_hit_rate
from asyncdp.bench.records import Record, Workload, resolve
from asyncdp.bench.simulate import RequestEvent, RunLog
from asyncdp.errors import ConfigError
from bench.completion_stream import DONE as DONE  # the end marker parse_sse_line returns, for its callers
from bench.completion_stream import check_loopback, chunk_tokens, completion_body, error_text, parse_sse_line
from bench.server_counters import ServerCounters, scrape, settled

MODEL = "builtin:tiny-dense"
#: tiny-dense's byte-level tokenizer: ids 0..255 are bytes, 256..258 specials; prompts stay in the bytes
TINY_VOCAB = 256
TINY_MAX_MODEL_LEN = 2048


# ---------------------------------------------------------------------- the workload on a real model

#: W1 (SGLang's generated shared prefix) at tiny-dense's size: 8 system prompts of 768 tokens, 8 questions each,
#: Poisson at 8 rps; with 320 KV blocks a rank holds about half the system prompts, not all of them
TINY_W1: dict[str, Any] = {"groups": 8, "prompts_per_group": 8, "system_len": 768, "question_len": 32,
                           "output_len": 16, "arrival": "poisson", "rate_rps": 8.0}
KV_BLOCKS = 320
DP_SIZE = 2


def json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object (``--options``)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object")
    return value


def add_workload_args(ap: argparse.ArgumentParser) -> None:
    """The flags both CLIs share: which workload, how big a cluster, how long to wait, where to write."""
    from bench.serving import non_negative_int, positive_float, positive_int

    ap.add_argument("--workload", default="w1", help="generator name (asyncdp.bench.workloads), default w1")
    ap.add_argument("--scale", default="quick")
    ap.add_argument("--options", type=json_object, default={},
                    help="generator options as a JSON object, over the tiny W1 defaults for w1")
    ap.add_argument("--rate", type=positive_float, default=None,
                    help="Poisson arrival rate, requests/s (sets rate_rps)")
    ap.add_argument("--trace", default=None, help="a Mooncake trace (JSONL) instead of a generator")
    ap.add_argument("--trace-block-size", type=positive_int, default=512,
                    help="tokens per trace hash id (Mooncake: 512)")
    ap.add_argument("--trace-speed", type=positive_float, default=1.0)
    ap.add_argument("--kv-blocks", type=non_negative_int, default=KV_BLOCKS,
                    help="KV blocks (of 16 tokens) per rank; 0: the workload's, else the profile's")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=positive_int, default=64, help="most requests outstanding at the client")
    ap.add_argument("--deadline", type=positive_float, default=120.0, help="seconds allowed per replay")
    ap.add_argument("--startup-timeout", type=positive_float, default=180.0)
    ap.add_argument("--log-dir", default=None, help="keep each server's output in this folder")
    ap.add_argument("--json", default=None, help="write the results as JSON here")


def checked_workload(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Workload:
    """:func:`workload_from_args` after the output flags are checked, before any server starts: a bad workload,
    trace or output path is a usage error of ``ap`` (exit 2), not a traceback or a failure after the runs."""
    from bench.serving import check_output

    check_output(ap, "--json", args.json)
    if args.log_dir:
        folder = Path(args.log_dir)
        if folder.exists() and not folder.is_dir():
            ap.error(f"--log-dir {folder}: is a file, not a folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            ap.error(f"--log-dir {folder}: cannot create the folder ({exc.strerror})")
        if not os.access(folder, os.W_OK):
            ap.error(f"--log-dir {folder}: the folder is not writable")
    try:
        return workload_from_args(args)
    except ConfigError as exc:
        ap.error(str(exc))


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The resolved workload of ``args`` at dp 2, fitted to tiny-dense, with the KV-blocks hint set."""
    from asyncdp.bench.trace import read_trace
    from asyncdp.bench.workloads import build

    if args.trace:
        workload = read_trace(args.trace, args.trace_block_size, seed=args.seed, speed=args.trace_speed,
                              dp_size=DP_SIZE)
    else:
        given = json.loads(args.options) if isinstance(args.options, str) else args.options
        defaults = dict(TINY_W1) if args.workload == "w1" else {}
        if given.get("arrival", "poisson") != "poisson":  # (the generator refuses a rate that would do nothing)
            defaults.pop("rate_rps", None)
        options = {**defaults, **given}
        if args.workload.partition("@")[0].lower() != "w2":  # (w2's stages do not depend on the cluster's size)
            options["dp"] = DP_SIZE
        if args.rate is not None:
            options.update(arrival="poisson", rate_rps=args.rate)
        workload = build(args.workload, args.scale, args.seed, options)
    workload = fit_to_model(workload)
    blocks = args.kv_blocks or workload.kv_blocks_per_rank
    return resolve(msgspec.structs.replace(workload, dp_size=DP_SIZE, kv_blocks_per_rank=blocks))


def describe(workload: Workload) -> str:
    n_in = sum(r.input_length for r in workload.records)
    n_out = sum(r.output_length for r in workload.records)
    span = max((r.t_arrival_ms or 0.0) for r in workload.records) / 1e3
    opts = {k: v for k, v in workload.options.items() if k != "dp"}
    return (f"workload {workload.name} {json.dumps(opts, sort_keys=True)}: {len(workload.records)} requests over "
            f"{span:.1f} s, {n_in} prompt + {n_out} output tokens, ideal hit rate "
            f"{ideal_hit_rate(workload.records):.3f}; dp {workload.dp_size}, {workload.kv_blocks_per_rank} KV "
            f"blocks/rank")



def fit_to_model(workload: Workload, vocab_size: int = TINY_VOCAB,
                 max_model_len: int = TINY_MAX_MODEL_LEN) -> Workload:
    """``workload`` with its tokens drawn from ``vocab_size`` ids; a record longer than ``max_model_len``
    (prompt + output) is a ConfigError naming it (scale the generator down instead)."""
    for r in workload.records:
        if r.input_length + r.output_length > max_model_len:
            raise ConfigError(f"{workload.name}: record {r.req_id} needs {r.input_length}+{r.output_length} "
                              f"tokens, more than max_model_len {max_model_len}; scale the workload down.")
    return msgspec.structs.replace(workload, vocab_size=vocab_size, max_model_len=max_model_len)


# ---------------------------------------------------------------------- the server's counters


def summarise(log: RunLog, server: ServerCounters) -> dict[str, float]:
    """:func:`asyncdp.bench.metrics.compute` on the client's log, hit rate and load ratio from the server's."""
    out = metrics.compute(log)
    out["prefix_hit_rate"] = server.hit_rate
    out["max_mean_load_ratio"] = server.load_ratio(log.dp_size)
    out["completed"] = float(sum(1 for e in log.events if e.error is None and e.t_last_s is not None))
    out["failed"] = float(sum(1 for e in log.events if e.error is not None))
    return out


def ratios(results: Mapping[str, Mapping[str, float]], base: str, keys: Sequence[str]) -> dict[str, dict[str, float]]:
    """Each result's ``keys`` over ``base``'s (NaN where the base is 0)."""
    ref = results[base]
    return {name: {k: (r[k] / ref[k] if ref[k] else math.nan) for k in keys} for name, r in results.items()}


def table(rows: Mapping[str, Mapping[str, float]], keys: Sequence[str], fmt: Mapping[str, str] | None = None,
          first: str = "") -> str:
    """A plain-text table: one row per name, one column per key."""
    fmt = fmt or {}
    width = max([len(first), *map(len, rows)])
    lines = [f"{first:<{width}}  " + "  ".join(f"{k:>14}" for k in keys)]
    for name, r in rows.items():
        lines.append(f"{name:<{width}}  " + "  ".join(f"{format(r[k], fmt.get(k, '.3f')):>14}" for k in keys))
    return "\n".join(lines)


# ---------------------------------------------------------------------- the replay


Progress = Callable[[int, int], None]


def progress_printer(label: str, every: int = 10) -> Progress:
    """A progress callback printing ``label: done/total`` to stderr every ``every`` completions and at the end."""
    def show(done: int, total: int) -> None:
        if done % every == 0 or done == total:
            print(f"  {label}: {done}/{total} requests", file=sys.stderr, flush=True)
    return show


class _Replayer:
    def __init__(self, client: httpx.AsyncClient, workload: Workload, model: str, concurrency: int,
                 progress: Progress | None) -> None:
        self.client, self.w, self.model = client, workload, model
        self.mat = Materialiser(workload.seed, workload.vocab_size)
        self.slots = anyio.Semaphore(concurrency)
        self.log = RunLog(dp_size=workload.dp_size)
        self.events: dict[int, RequestEvent] = {}
        self.dependents: dict[int, list[Record]] = {}
        for r in workload.records:
            if r.after_req is not None:
                self.dependents.setdefault(r.after_req, []).append(r)
        self.progress = progress
        self.done = 0
        self.max_lag_s = 0.0
        self.t0 = 0.0

    def now(self) -> float:
        return anyio.current_time() - self.t0

    async def run(self, deadline_s: float) -> RunLog:
        self.t0 = anyio.current_time()  # the event loop's clock: trio's is not time.monotonic()
        with anyio.move_on_after(deadline_s):
            async with anyio.create_task_group() as tg:
                roots = sorted((r for r in self.w.records if r.after_req is None),
                               key=lambda r: (r.t_arrival_ms or 0.0, r.req_id))
                for rec in roots:
                    await anyio.sleep_until(self.t0 + (rec.t_arrival_ms or 0.0) / 1e3)
                    await self.slots.acquire()
                    tg.start_soon(self._one, tg, rec, (rec.t_arrival_ms or 0.0) / 1e3)
        wanted = {r.req_id: r.output_length for r in self.w.records}
        for ev in self.events.values():  # cut off at the deadline, streamed in part or not at all
            if ev.error is None and ev.output_tokens != wanted[ev.req_id]:
                ev.error = "deadline"
        self.log.events = sorted(self.events.values(), key=lambda e: e.req_id)
        self.log.unsent = len(self.w.records) - len(self.log.events)
        return self.log

    async def _one(self, tg: anyio.abc.TaskGroup, rec: Record, due_s: float) -> None:
        t_send = self.now()
        self.max_lag_s = max(self.max_lag_s, t_send - due_s)
        ev = self.events[rec.req_id] = RequestEvent(req_id=rec.req_id, router=0, rank=-1, t_send_s=t_send,
                                                    prompt_tokens=rec.input_length, turn=rec.turn,
                                                    measured=t_send * 1e3 >= self.w.warmup_ms)
        body = completion_body(self.model, self.mat.prompt(rec), rec.output_length)
        try:
            headers = {"X-Session-ID": rec.routing_key} if rec.routing_key else None  # as the simulator's key
            async with self.client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
                if resp.status_code != 200:
                    ev.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                    return
                async for line in resp.aiter_lines():
                    chunk = parse_sse_line(line)
                    if not isinstance(chunk, dict):  # not a data line, or the [DONE] marker
                        continue
                    if (err := error_text(chunk)) is not None:
                        ev.error = err
                        return
                    tokens = chunk_tokens(chunk)
                    if tokens is not None and tokens > ev.output_tokens:
                        t = self.now()
                        if ev.t_first_s is None:
                            ev.t_first_s = t
                        ev.t_last_s, ev.output_tokens = t, tokens
            if ev.output_tokens != rec.output_length:
                ev.error = f"got {ev.output_tokens} tokens, expected {rec.output_length}"
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: a chunk that is not JSON
            ev.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.slots.release()
            self.done += 1
            if self.progress is not None:
                self.progress(self.done, len(self.w.records))
        if ev.error is None:
            for nxt in self.dependents.pop(rec.req_id, ()):
                due = max((nxt.t_arrival_ms or 0.0) / 1e3, (ev.t_last_s or self.now()) + nxt.think_ms / 1e3)
                tg.start_soon(self._later, tg, nxt, due)

    async def _later(self, tg: anyio.abc.TaskGroup, rec: Record, due_s: float) -> None:
        await anyio.sleep_until(self.t0 + due_s)
        await self.slots.acquire()
        await self._one(tg, rec, due_s)


@dataclass
class Replay:
    log: RunLog
    server: ServerCounters
    wall_s: float
    max_lag_s: float
    load_1m: float  # the machine's 1-minute load average at the end: how shared the cores were

    def metrics(self) -> dict[str, float]:
        out = summarise(self.log, self.server)
        out["max_send_lag_s"] = self.max_lag_s
        out["load_1m"] = self.load_1m
        return out


async def replay(base_url: str, workload: Workload, *, model: str = MODEL, concurrency: int = 64,
                 deadline_s: float = 120.0, progress: Progress | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> Replay:
    """Replay ``workload`` (resolved) against ``base_url`` and difference the server's counters around it.
    ``transport``: httpx's, for a fake server in tests."""
    check_loopback(base_url)
    timeout = httpx.Timeout(deadline_s, connect=10.0)
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits, transport=transport) as client:
        before = await scrape(client)
        replayer = _Replayer(client, workload, model, concurrency, progress)
        t = time.monotonic()
        log = await replayer.run(deadline_s)
        wall = time.monotonic() - t
        after = await settled(client, before, sum(1 for e in log.events if e.error is None))
    return Replay(log, after.minus(before), wall, replayer.max_lag_s, os.getloadavg()[0])


def server_flags(workload: Workload, kv_blocks: int | None, max_num_seqs: int | None = None,
                 max_num_batched_tokens: int | None = None) -> list[str]:
    """``asyncdp serve`` flags that give the server the cluster the simulator models for ``workload``."""
    flags = ["-dp", str(workload.dp_size), "--api-server-count", "1", "--block-size", str(workload.block_size),
             "--max-model-len", str(workload.max_model_len or TINY_MAX_MODEL_LEN), "--log-level", "warning"]
    blocks = workload.kv_blocks_per_rank or kv_blocks
    if blocks:
        flags += ["--num-kv-blocks", str(blocks)]
    if max_num_seqs:
        flags += ["--max-num-seqs", str(max_num_seqs)]
    if max_num_batched_tokens:
        flags += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    return flags


async def warm_up(base_url: str, dp_size: int, model: str = MODEL) -> None:
    """A few short requests of a prompt no workload has (token 0 repeated), ``dp_size`` at a time twice, so the
    first measured requests do not pay the engines' first forward passes; then wait until the server has counted
    them, so that the run's counters start after them."""
    check_loopback(base_url)
    body = {**completion_body(model, [0] * 40, 4), "stream": False}
    body.pop("stream_options")
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0) as client:
        before = await scrape(client)
        for _ in range(2):
            async with anyio.create_task_group() as tg:
                for _ in range(dp_size):
                    tg.start_soon(partial(client.post, "/v1/completions", json=body))
        await settled(client, before, 2 * dp_size)


def serve_and_replay(policy: str, workload: Workload, args: argparse.Namespace, extra_flags: Sequence[str],
                     caps: tuple[int | None, int | None, int | None] = (None, None, None)) -> Replay:
    """Launch ``asyncdp serve`` for ``workload`` with ``--lb-policy policy`` (``caps``: the profile's KV blocks,
    max_num_seqs, max_num_batched_tokens for what the workload leaves open), warm it up and replay once."""
    from bench.serving import asyncdp_serve

    flags = [*server_flags(workload, *caps), *extra_flags, "--lb-policy", policy]
    with ExitStack() as stack:
        log: IO[bytes]
        if args.log_dir:
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
            log = stack.enter_context(open(Path(args.log_dir) / f"serve-{policy}.log", "wb"))
        else:  # a file even so: a server that fails to start is reported with its last lines
            log = stack.enter_context(tempfile.NamedTemporaryFile(prefix=f"serve-{policy}-", suffix=".log"))
        print(f"[{policy}] asyncdp serve {MODEL} {' '.join(flags)}", file=sys.stderr, flush=True)
        base_url, _pid = stack.enter_context(asyncdp_serve(MODEL, *flags, log=log, timeout_s=args.startup_timeout))
        print(f"[{policy}] ready at {base_url}; replaying {len(workload.records)} requests", file=sys.stderr,
              flush=True)

        async def go() -> Replay:
            await warm_up(base_url, workload.dp_size)
            return await replay(base_url, workload, concurrency=args.concurrency, deadline_s=args.deadline,
                                progress=progress_printer(policy))

        return anyio.run(go)
    raise AssertionError("unreachable")  # ExitStack does not swallow exceptions
