"""``asyncdp bench calibrate``: time the real engine through the batch sweep of spec routing-bench §5, fit the
step-time model, and write a cost-profile file that ``asyncdp bench routing --profile FILE`` reads.

Flow: build one in-process ``EngineCore`` exactly as ``asyncdp.llm.LLM`` does (the real scheduler, block manager
and model runner, on ``--model``, with ``--threads`` torch threads), plan the sweep against its limits
(:func:`asyncdp.bench.sweep.plan`; skipped points and why go to stderr), warm it up, time every point
(:class:`asyncdp.bench.sweep.Sweep`: median of ``--repeats`` ``step()`` calls that each do exactly the point's
work), fit ``a + b·P + c·D + d·K`` (``+ e·E`` with ``--fit-e``; :mod:`asyncdp.bench.fit`), then write the profile
and print the summary.

The profile file holds the keys of :mod:`asyncdp.bench.profiles` (a_ms .. d_ms_per_kv_token, kv_blocks,
max_num_seqs, max_num_batched_tokens, name) and the §5 metadata: model, device, dtype, tp, threads, engine
commit, date, the fit's r2 and max_rel_error, every measured point with its prediction, and the skipped ones.
``kv_blocks`` is in the simulator's 16-token blocks: the engine's usable KV tokens (its blocks minus the
scratch block, times its block size) divided by 16, plus one because the simulated engine reserves a scratch
block too; ``kv_blocks_note`` says so in the file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncdp.errors import ConfigError

if TYPE_CHECKING:
    from asyncdp.bench.fit import Fit
    from asyncdp.bench.sweep import Capacity, Measured, Skipped
    from asyncdp.config.flags import EngineConfig
    from asyncdp.engine.core import EngineCore

DEFAULT_MODEL = "builtin:tiny-dense"
DEFAULT_OUTPUT = "calibrated_profile.json"
SIM_BLOCK_SIZE = 16  # the simulator's KV block size (profiles count blocks of 16 tokens)
ENGINE_FLAGS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size", "num_kv_blocks",
                "kv_cache_memory_bytes", "dtype", "device")


def add_calibrate_parser(bsub: Any) -> None:
    """Register ``bench calibrate`` on the ``bench`` subparsers ``bsub``."""
    p = bsub.add_parser("calibrate", allow_abbrev=False,
                        help="time the real engine through a batch sweep and fit a cost profile for bench routing")
    p.add_argument("--model", default=None, help=f"any model asyncdp serve accepts (default: {DEFAULT_MODEL})")
    p.add_argument("--output", default=DEFAULT_OUTPUT, metavar="FILE",
                   help=f"the profile file to write (JSON; default: {DEFAULT_OUTPUT})")
    p.add_argument("--name", default=None, help="the profile's name (default: DEVICE_MODEL, e.g. cpu_tiny_dense)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch intra-op threads (default: the machine's cores)")
    p.add_argument("--repeats", type=int, default=None, metavar="N",
                   help="timed steps per point; the median counts (default: 5, 2 with --quick)")
    p.add_argument("--quick", action="store_true", help="a handful of small points (tests, a fast look)")
    p.add_argument("--fit-e", action="store_true",
                   help="also fit e, the prefill-attention term e·Σ p·(c0 + p/2) (the simulator's "
                        "e_ms_per_token_pair)")
    p.add_argument("--relative", action="store_true",
                   help="minimise relative errors instead of errors in ms (small steps weigh as much as large)")
    p.add_argument("--refit", default=None, metavar="FILE",
                   help="refit the points of a profile file this command wrote (with --fit-e/--relative), "
                        "without running the engine (so without --model, --threads, --repeats, --quick and the "
                        "engine flags)")
    g = p.add_argument_group("engine (as asyncdp serve; the sweep is capped by these)")
    g.add_argument("--max-num-seqs", type=int, default=None, metavar="N")
    g.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N")
    g.add_argument("--max-model-len", type=int, default=None, metavar="N")
    g.add_argument("--block-size", type=int, default=None, metavar="N")
    g.add_argument("--num-kv-blocks", type=int, default=None, metavar="N")
    g.add_argument("--kv-cache-memory-bytes", type=int, default=None, metavar="BYTES")
    g.add_argument("--dtype", default=None, metavar="{auto,float32,bfloat16,float16}")
    g.add_argument("--device", default=None, metavar="{auto,cpu,cuda}")


def _check_output(value: str) -> Path:
    """``--output`` can be written (:func:`asyncdp.bench.files.check_file`; its folder must exist), checked before
    the engine is built: a sweep's measurements must not be lost to the path."""
    from asyncdp.bench.files import check_file

    return check_file("--output", value, make_folder=False)


def _write_profile(doc: dict[str, Any], output: Path) -> int:
    """Write the profile whole or not at all; 0, or 1 with one line (the profile kept in the temporary folder)."""
    from asyncdp.bench.files import WriteFailed, keep, write

    text = json.dumps(doc, indent=1) + "\n"
    try:
        write("--output", output, text)
    except WriteFailed as exc:
        kept = keep(text, ".json")
        print(f"asyncdp bench calibrate: error: {exc}" + (f"; the profile is in {kept}" if kept else ""),
              file=sys.stderr)
        return 1
    return 0


def _check_coverage(kinds: set[str], skipped: list[Skipped], when: str) -> None:
    """Both kinds of point are there: without a decode point the fit sets c and d to 0 and the profile models
    decoding as free (without a prefill point, prefill); refused, with the reasons the points were skipped."""
    for kind, terms in (("prefill", "b_ms_per_token"), ("decode", "c_ms_per_seq and d_ms_per_kv_token")):
        if kind not in kinds:
            why = "; ".join(f"{s.label}: {s.reason}" for s in skipped if s.label.startswith(kind)) or "none planned"
            raise ConfigError(f"no {kind} point of the sweep {when}, so {terms} would be 0 (a {kind} step modelled "
                              f"as free); no profile written. Skipped: {why}.")


def _check(ns: argparse.Namespace) -> tuple[EngineConfig, Path, int, int]:
    """The engine config, output path, threads and repeats, or a ConfigError naming the flag."""
    from asyncdp.config.flags import EngineConfig

    threads = (os.cpu_count() or 1) if ns.threads is None else ns.threads
    repeats = (2 if ns.quick else 5) if ns.repeats is None else ns.repeats
    if threads < 1:
        raise ConfigError(f"--threads must be >= 1 (got {threads}).")
    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1 (got {repeats}).")
    output = _check_output(ns.output)
    given = {k: getattr(ns, k) for k in ENGINE_FLAGS if getattr(ns, k) is not None}
    config = EngineConfig(model=ns.model or DEFAULT_MODEL, executor="torch", torch_threads=threads, **given).validate()
    return config, output, threads, repeats


def run(ns: argparse.Namespace) -> int:
    """Run ``bench calibrate`` for parsed arguments ``ns``; returns the exit code. Ctrl-C or SIGTERM stops it with
    one line and exit 130 or 143, no profile written."""
    from asyncdp.bench.guards import stop_on_signals

    with stop_on_signals("asyncdp bench calibrate", "stopped the sweep; no profile written"):
        return _refit(ns) if ns.refit else _calibrate(ns)


def _calibrate(ns: argparse.Namespace) -> int:
    from asyncdp.bench.fit import fit
    from asyncdp.bench.progress import Progress
    from asyncdp.bench.sweep import FULL, QUICK, Measured, Sweep, capacity, plan
    from asyncdp.engine.build import build_engine_core

    config, output, threads, repeats = _check(ns)
    started = time.monotonic()
    core = build_engine_core(config)
    try:
        facts = _engine_facts(core, config.model, threads)  # before the sweep: the commit that runs it
        cap = capacity(core)
        points, skipped = plan(QUICK if ns.quick else FULL, cap, repeats)
        if not points:
            raise ConfigError("no point of the sweep fits this engine: " +
                              "; ".join(f"{s.label}: {s.reason}" for s in skipped))
        _check_coverage({p.kind for p in points}, skipped, "fits this engine")
        for s in skipped:
            print(f"asyncdp bench calibrate: skipped {s.label}: {s.reason}", file=sys.stderr)
        print(f"asyncdp bench calibrate: {len(points)} points to time, {repeats} steps each after a warm-up",
              file=sys.stderr, flush=True)
        sweep = Sweep(core, repeats)
        sweep.warm_up()
        measured: list[Measured] = []
        with Progress(len(points), prefix="asyncdp bench calibrate", unit="point") as progress:
            for point in points:
                result = sweep.measure(point)
                if isinstance(result, Measured):
                    measured.append(result)
                    progress.advance(f"{point.label}: {result.ms:.2f} ms")
                else:
                    skipped.append(result)
                    progress.advance(f"{point.label}: skipped ({result.reason})")
    finally:
        core.shutdown()
    if not measured:
        raise ConfigError("no point of the sweep could be measured: " +
                          "; ".join(f"{s.label}: {s.reason}" for s in skipped))
    _check_coverage({m.point.kind for m in measured}, skipped, "could be measured")
    result_fit = fit([m.work for m in measured], [m.ms for m in measured], with_e=ns.fit_e, relative=ns.relative)
    name = ns.name or _default_name(facts["device"], config.model)
    doc = profile_document(name, facts, cap, result_fit, measured, skipped, repeats=repeats, quick=ns.quick,
                           relative=ns.relative)
    if _write_profile(doc, output):
        return 1
    print(summary_text(doc, measured, result_fit, output, time.monotonic() - started))
    return 0


def _default_name(device: str, model: str) -> str:
    stem = model.removeprefix("builtin:").rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^0-9A-Za-z]+", "_", f"{device}_{stem}").strip("_").lower()


def _engine_facts(core: EngineCore, model: str, threads: int) -> dict[str, Any]:
    executor: Any = core.executor
    device = getattr(executor, "device", None)
    device_type = getattr(device, "type", "cpu")
    return {"model": model, "device": device_type, "device_name": _device_name(device),
            "dtype": str(getattr(executor, "dtype", "unknown")).removeprefix("torch."), "tp": 1,
            "threads": threads, "engine_commit": engine_commit(),
            "date": datetime.now(UTC).replace(microsecond=0).isoformat()}


def _device_name(device: Any) -> str:
    if getattr(device, "type", "cpu") == "cuda":
        import torch  # already loaded by the executor; only its device query is needed

        return str(torch.cuda.get_device_name(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def engine_commit() -> str:
    """``git rev-parse HEAD`` (``-dirty`` with uncommitted tracked changes) of the checkout asyncdp runs from,
    else the package version."""
    from asyncdp.version import __version__

    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root:
            raise ValueError("asyncdp is not the root of this checkout")
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, ValueError, subprocess.SubprocessError):
        return f"asyncdp {__version__}"
    return commit + ("-dirty" if dirty else "")


def sim_kv_blocks(cap: Capacity) -> int:
    """The engine's KV capacity in the simulator's blocks of 16 tokens (its scratch block added back), at most
    what a simulated rank may have (:data:`~asyncdp.bench.records.MAX_KV_BLOCKS`, which ``--profile`` enforces)."""
    from asyncdp.bench.records import MAX_KV_BLOCKS

    return min(cap.usable_kv_blocks * cap.block_size // SIM_BLOCK_SIZE + 1, MAX_KV_BLOCKS)


def profile_document(name: str, facts: dict[str, Any], cap: Capacity, result: Fit, measured: list[Measured],
                     skipped: list[Skipped], *, repeats: int, quick: bool, relative: bool = False) -> dict[str, Any]:
    """The profile file's JSON object: the keys ``load_profile`` reads, then the calibration's metadata."""
    from asyncdp.bench.fit import KEYS

    coef = {KEYS[t]: v for t, v in result.coefficients.items()}
    blocks = sim_kv_blocks(cap)
    whole = cap.usable_kv_blocks * cap.block_size // SIM_BLOCK_SIZE + 1
    return {
        "name": name, **{k: coef.get(k, 0.0) for k in ("a_ms", "b_ms_per_token", "c_ms_per_seq",
                                                        "d_ms_per_kv_token")},
        **({"e_ms_per_token_pair": coef["e_ms_per_token_pair"]} if "e_ms_per_token_pair" in coef else {}),
        "kv_blocks": blocks, "max_num_seqs": cap.max_num_seqs, "max_num_batched_tokens": cap.max_num_batched_tokens,
        "kv_blocks_note": (f"in the simulator's blocks of {SIM_BLOCK_SIZE} tokens: the engine's "
                           f"{cap.usable_kv_blocks} usable blocks of {cap.block_size} tokens (its scratch block "
                           f"excluded) = {cap.usable_kv_blocks * cap.block_size} tokens, / {SIM_BLOCK_SIZE}, + 1 "
                           f"for the simulated engine's own scratch block = {whole}"
                           + (f", capped at {blocks}, the most a simulated rank may have" if blocks < whole else "")),
        "max_model_len": cap.max_model_len, "engine_block_size": cap.block_size,
        "engine_kv_blocks": cap.usable_kv_blocks,
        **facts,
        "r2": result.r2, "max_rel_error": result.max_rel_error,
        "fit": {"model": "a + b*P + c*D + d*K" + (" + e*E" if "e" in result.coefficients else ""),
                "units": "ms; P prefill tokens, D decoding sequences, K sum of context after the step, "
                         "E sum over prefill chunks of p*(c0 + p/2)",
                "weights": "relative" if relative else "ms",
                "clamped_to_zero": list(result.clamped), "repeats": repeats, "statistic": "median",
                "sweep": "quick" if quick else "full"},
        "points": [{"kind": m.point.kind, "P": m.work.P, "D": m.work.D, "K": m.work.K, "E": m.work.E,
                    **({"context": m.point.context} if m.point.kind == "decode" else {}),
                    "measured_ms": round(m.ms, 4), "predicted_ms": round(p, 4),
                    **({"note": m.point.note} if m.point.note else {})}
                   for m, p in zip(measured, result.predicted_ms, strict=True)],
        "skipped": [{"point": s.label, "reason": s.reason} for s in skipped],
    }


def summary_text(doc: dict[str, Any], measured: list[Measured], result: Fit, output: Path, wall_s: float) -> str:
    """The closing table: the points, the coefficients, R², the largest relative error, the file written."""
    lines = [f"asyncdp bench calibrate: {doc.get('model')} on {doc.get('device')} ({doc.get('device_name')}), "
             f"{doc.get('dtype')}, {doc.get('threads')} threads: {len(measured)} points measured, "
             f"{len(doc['skipped'])} skipped, " + (f"refit of {doc['refit_of']}" if "refit_of" in doc else
                                                   f"{wall_s:.0f} s"), "",
             f"{'point':<28} {'P':>6} {'D':>5} {'K':>9} {'measured ms':>12} {'predicted ms':>13} {'error':>8}"]
    worst = ("", 0.0)
    for m, p in zip(measured, result.predicted_ms, strict=True):
        err = (p - m.ms) / m.ms
        if abs(err) >= abs(worst[1]):
            worst = (m.point.label, err)
        lines.append(f"{m.point.label:<28} {m.work.P:>6} {m.work.D:>5} {m.work.K:>9} {m.ms:>12.3f} {p:>13.3f} "
                     f"{err:>+8.1%}")
    from asyncdp.bench.fit import KEYS

    lines += ["", f"{'coefficient':<22} value"]
    lines += [f"{KEYS[t]:<22} {v:.6g}" + ("  (clamped to 0)" if t in result.clamped else "")
              for t, v in result.coefficients.items()]
    lines += [f"{'R²':<22} {result.r2:.4f}", f"{'max relative error':<22} {result.max_rel_error:.1%} ({worst[0]})",
              f"{'kv_blocks (16 tokens)':<22} {doc['kv_blocks']}",
              f"{'profile':<22} {output} (name {doc['name']})"]
    return "\n".join(lines)


FACT_KEYS = ("model", "device", "device_name", "dtype", "tp", "threads", "engine_commit", "date")


def _refit(ns: argparse.Namespace) -> int:
    """``--refit FILE``: the points of a profile file refitted with this run's fit options, no engine."""
    from asyncdp.bench.fit import StepWork, fit
    from asyncdp.bench.sweep import Capacity, Measured, Point, Skipped

    engine = [f"--{k.replace('_', '-')}" for k in ("model", "threads", "repeats", *ENGINE_FLAGS)
              if getattr(ns, k) is not None] + (["--quick"] if ns.quick else [])
    if engine:  # (they were once silently ignored)
        raise ConfigError(f"{engine[0]} does nothing with --refit: a refit fits the points stored in {ns.refit} "
                          "again, without running the engine; leave it out.")
    output = _check_output(ns.output)
    path = Path(ns.refit)
    try:
        text = path.read_text()
    except (OSError, ValueError) as exc:  # (ValueError: not UTF-8)
        raise ConfigError(f"--refit {path}: cannot read it ({getattr(exc, 'strerror', None) or exc}).") from None
    try:
        doc = json.loads(text)
        measured = [Measured(Point(p["kind"], int(p["P"]), int(p["D"]), int(p.get("context", 0)), (),
                                   p.get("note", "")),
                             StepWork(int(p["P"]), int(p["D"]), int(p["K"]), float(p["E"])),
                             float(p["measured_ms"]), (float(p["measured_ms"]),)) for p in doc["points"]]
        bs = int(doc["engine_block_size"])
        usable = int(doc.get("engine_kv_blocks", (int(doc["kv_blocks"]) - 1) * SIM_BLOCK_SIZE // bs))
        cap = Capacity(int(doc["max_model_len"]), usable, bs, int(doc["max_num_seqs"]),
                       int(doc["max_num_batched_tokens"]))
        skipped = [Skipped(str(s["point"]), str(s["reason"])) for s in doc.get("skipped", [])]
        repeats, quick = int(doc["fit"]["repeats"]), doc["fit"]["sweep"] == "quick"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--refit {path}: not a profile file written by bench calibrate ({exc!r}).") from None
    if not measured:
        raise ConfigError(f"--refit {path}: the file holds no measured point.")
    _check_coverage({m.point.kind for m in measured}, skipped, f"was measured in --refit {path}")
    result = fit([m.work for m in measured], [m.ms for m in measured], with_e=ns.fit_e, relative=ns.relative)
    facts = {k: doc[k] for k in FACT_KEYS if k in doc}
    new = profile_document(ns.name or str(doc.get("name", path.stem)), facts, cap, result, measured, skipped,
                           repeats=repeats, quick=quick, relative=ns.relative)
    new["refit_of"] = str(path)
    if _write_profile(new, output):
        return 1
    print(summary_text(new, measured, result, output, 0.0))
    return 0
