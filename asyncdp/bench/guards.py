"""What ``asyncdp bench routing`` (and ``bench calibrate``) check before the first run, and how they stop on a
signal: the flags argparse lets through that no run can use, a value listed twice, a flag that would do nothing
with the others given (never silently ignored), the output paths, workloads that would share a table, a workload
stretched past the simulator's limit on virtual time (each a usage error, exit 2, before any run), and Ctrl-C or
SIGTERM during the runs (exit 130 or 143 with one line, no half-written file). :mod:`.command` orchestrates; this
module only refuses and stops.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asyncdp.errors import ConfigError


def csv_items(text: str) -> list[str]:
    """The non-empty items of a comma-separated flag value."""
    return [part.strip() for part in text.split(",") if part.strip()]


@contextmanager
def stop_on_signals(prefix: str = "asyncdp bench", stopped: str = "stopped the runs") -> Iterator[None]:
    """Ctrl-C and SIGTERM (``kill``, ``timeout``, a cancelled CI job) leave the ``with`` blocks as an exception, so
    the runs still going are stopped (:meth:`~asyncdp.bench.runner.Runner.stop`) rather than left to finish with
    nobody to read them; the command then exits with 130 or 143 and one line on stderr, not a traceback. Only the
    main thread can install the SIGTERM handler; elsewhere SIGTERM keeps its default.

    A run in this process (``--jobs 0``) is inside ``trio.run``: there the handler does not raise but has the run
    stop itself (:func:`~asyncdp.bench.runner.interrupt_in_process_run`), which comes out as a KeyboardInterrupt;
    the signal received says which exit it is. An interrupt may also come wrapped in an exception group."""
    from asyncdp.bench.runner import interrupt_in_process_run

    main = threading.current_thread() is threading.main_thread()
    received: list[int] = []

    def terminated(signum: int, frame: object) -> None:
        received.append(signum)
        if not interrupt_in_process_run():
            raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated) if main else None
    try:
        yield
        if received:  # stopped a run that had finished meanwhile: still a stop
            raise SystemExit(128 + received[0])
    except BaseException as exc:
        signum = received[0] if received else signal_of(exc)
        if signum is None:
            raise
        what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
        print(f"{prefix}: {what}: {stopped}", file=sys.stderr)
        raise SystemExit(128 + signum) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def signal_of(exc: BaseException) -> int | None:
    """SIGINT for a KeyboardInterrupt, SIGTERM for the SystemExit of :func:`stop_on_signals`'s handler, alone or
    in an exception group; else None."""
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            found = signal_of(sub)
            if found is not None:
                return found
        return None
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    if isinstance(exc, SystemExit) and exc.code == 128 + signal.SIGTERM:
        return signal.SIGTERM
    return None


def check_flags(ns: argparse.Namespace) -> None:
    """The values argparse lets through that no run can use: each a usage error naming the flag, before any run
    (``--dp 0`` was once taken as "the workload's", ``--seeds ,`` as zero runs, ``--rate-scale nan`` a traceback)."""
    import math

    for flag, value, least in (("--dp", ns.dp, 1), ("--routers", ns.routers, 1), ("--jobs", ns.jobs, 0),
                               ("--trace-block-size", ns.trace_block_size, 1)):
        if value is not None and value < least:
            raise ConfigError(f"{flag} must be >= {least} (got {value}).")
    for flag, number in (("--rate-scale", ns.rate_scale), ("--r-sat", ns.r_sat)):
        if number is not None and not (math.isfinite(number) and number > 0):
            raise ConfigError(f"{flag} must be a finite number > 0 (got {number!r}).")
    for flag, text, what in (("--seeds", ns.seeds, "seed"), ("--policies", ns.policies, "policy name"),
                             ("--workload", ns.workload, "workload name")):
        if text is not None and not csv_items(text):
            raise ConfigError(f"{flag} lists no {what} (got {text!r}); give a comma-separated list.")
        items = csv_items(text or "")
        twice = [item for k, item in enumerate(items) if item in items[:k]]
        if twice:  # each run would be made twice and weigh double in the means over seeds
            raise ConfigError(f"{flag} lists {twice[0]} twice (got {text!r}); give each {what} once.")
    _check_applies(ns)


def _check_applies(ns: argparse.Namespace) -> None:
    """Flags that do nothing with the others given: each an error naming it, not a knob silently ignored."""
    if ns.trace:
        if ns.option:
            raise ConfigError(f"--option {ns.option[0]} does nothing with --trace: a trace has no generator "
                              "options; leave it out.")
        if ns.scale is not None:
            raise ConfigError(f"--scale {ns.scale} does nothing with --trace: a trace replays its own requests "
                              "(at --dp ranks); leave it out.")
    elif ns.trace_block_size is not None and not ns.export_trace:
        raise ConfigError("--trace-block-size does nothing without --trace or --export-trace; leave it out.")
    if ns.export_trace and len(csv_items(ns.workload or "")) > 1:
        raise ConfigError(f"--export-trace writes one workload, and --workload lists several ({ns.workload}); "
                          "export them one at a time.")


def check_workloads(ns: argparse.Namespace, labelled: list[tuple[str, Any]]) -> None:
    """The workloads built, as ``(label, workload)``, before any run: no two under one label (their runs would be
    mixed in one table), and ``--r-sat`` and ``--rate-scale`` each apply to one of them. Two presets of one generator
    have labels of their own (``w3`` and ``w3@ray_scaling``), and run side by side."""
    from asyncdp.bench.arrivals import Closed, RelativeLadder

    workloads = [w for _, w in labelled]
    names = ", ".join(dict.fromkeys(label for label, _ in labelled))
    first = [label for label, w in labelled if w.seed == workloads[0].seed]
    twice = [label for k, label in enumerate(first) if label in first[:k]]
    if twice:  # (w3 and w3@ray_scaling were once averaged together in one "w3" table, as if they were two seeds)
        raise ConfigError(f"--workload {ns.workload}: two of these workloads report as {twice[0]}, and their runs "
                          "would be mixed in one table; run them one at a time.")
    if ns.r_sat is not None and not any(isinstance(w.arrival, RelativeLadder) for w in workloads):
        raise ConfigError(f"--r-sat does nothing here: no workload of this run ({names}) is on a relative ladder "
                          "(W2 at quick scale, W6, W7, W8, or arrival=ladder); leave it out.")
    if ns.rate_scale != 1.0 and all(isinstance(w.arrival, Closed) for w in workloads):
        raise ConfigError(f"--rate-scale does nothing here: every workload of this run ({names}) is a closed loop, "
                          "whose clients send as their answers come (change its clients instead); leave it out.")


def check_span(label: str, workload: Any, ns: argparse.Namespace, r_sat: float | None) -> None:
    """The last send time, once ``--rate-scale`` (and R_sat) are applied, within the simulator's limit on a run
    (:data:`~asyncdp.bench.records.DEADLINE_S`): a slower replay would stop there as a stalled run, after minutes
    of stepping through virtual hours (and a far one overflowed). A dispatcher (W4) sends its records at its rate:
    the expected span is their number over its slowest rate (``--rate-scale 1e-6`` ran for over 5 minutes)."""
    from asyncdp.bench.arrivals import Dispatch, retime
    from asyncdp.bench.records import DEADLINE_S

    _, divisor = retime(workload.arrival, ns.rate_scale, r_sat)
    last_ms = max((r.t_arrival_ms or 0.0 for r in workload.records), default=0.0) / divisor
    if isinstance(workload.arrival, Dispatch):
        slowest = min(workload.sweep_rates_rps or (workload.arrival.rate_rps,)) * ns.rate_scale
        last_ms = max(last_ms, len(workload.records) / slowest * 1000.0)
    if not last_ms <= DEADLINE_S * 1000.0:
        given = f"--r-sat {r_sat:g} and " if ns.r_sat is not None and r_sat is not None else ""
        raise ConfigError(f"{label}: {given}--rate-scale {ns.rate_scale:g} would send its last request "
                          f"about {last_ms / 3.6e6:.4g} virtual hours after its first; the simulator stops a run after "
                          f"{DEADLINE_S / 3600:g} virtual hours (raise {'them' if given else 'it'}).")


def check_outputs(ns: argparse.Namespace) -> None:
    """Each output flag's file can be written (its folder is made if missing, and a probe file made and removed
    there) and is none of the input files nor another output's; ``--plots`` is a folder one can write in
    (:mod:`asyncdp.bench.files`)."""
    from asyncdp.bench.files import check_file, check_folder
    from asyncdp.bench.profiles import PROFILES

    others: list[tuple[str, str | None]] = [("--trace", ns.trace)]
    if ns.profile not in PROFILES:
        others.append(("--profile", ns.profile))
    for flag, value in (("--json", ns.json), ("--csv", ns.csv), ("--export-trace", ns.export_trace)):
        if value:
            check_file(flag, value, others=others)
            others.append((flag, value))
    if ns.plots:
        check_folder("--plots", ns.plots)


