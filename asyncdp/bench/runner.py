"""Run each simulated run of ``bench routing`` in a fresh process, ``--jobs`` at a time (spec routing-bench §5:
"policies run as separate processes, two at a time on 2 cores").

A process started for each run (``spawn``: nothing inherited from this one) keeps runs apart: what one run
allocates, caches or leaks is gone with its process. A run's result does not depend on it, though: it once did, as
trio woke timers due at the same virtual instant in the order of their cancel scopes' addresses, so a result moved
with whatever had been allocated before it (``vllm`` on quick W9 read a mean TTFT of 0.0493 s alone and 0.0425 s
after a W1 run) and, across machines, even in fresh processes. :func:`~asyncdp.bench.simulate.simulate` now sets
that order itself (:func:`~asyncdp.bench.simulate.trio_orders_fixed`), so a (workload, policy, seed,
cluster) gives the same log in any process, after any other run, in whatever order the runs finish.

Each run costs the start of an interpreter and the import of the simulator (about 0.5 s here) on top of the run.
``jobs=0`` runs everything in this process instead, one run after another (to step through a run in a debugger or
profile it), with the same results.

No run outlives the command. A full-scale run takes up to tens of minutes, and its result is of no use once the
command is gone: each worker asks the kernel for SIGKILL when the command dies (:func:`asyncdp.runtime.die_with_parent`;
the pool starts workers from the main thread and its manager thread, which live as long as the pool), and leaving
the pool on an error or an interrupt (Ctrl-C, or SIGTERM, which the command turns into one) kills the runs still
going instead of waiting for them (:meth:`Runner.stop`). Workers start with SIGINT blocked (:func:`_signals_blocked`),
so a Ctrl-C, which reaches the whole process group, interrupts the command alone: one line, not a traceback from
every worker. The command waits for its runs in slices of ``POLL_S`` (:meth:`Runner.completed`): the kernel may hand
a signal to any thread that does not block it (tqdm's monitor thread, say), and Python then runs the handler only
when the main thread next runs bytecode, which a wait without a timeout would put off until a run ends.

With ``jobs=0`` the runs go on in this thread, inside ``trio.run``, and a signal handler that raised there (as the
command's SIGTERM handler once did) could land in trio's own bookkeeping: the run was left half torn down, with a
page of tracebacks, exit 1, and once a run that went on for minutes with the SIGTERM lost. So a signal stops an
in-process run the way trio stops one on Ctrl-C: :func:`interrupt_in_process_run` makes a KeyboardInterrupt due
at the run's main task's next checkpoint (:func:`~asyncdp.bench.simulate.simulate` restricts Ctrl-C to
checkpoints too), the run unwinds its task groups, and :meth:`Runner.submit` raises that KeyboardInterrupt alone,
not the exception group the task groups wrap it in.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any

from asyncdp.bench.records import Workload
from asyncdp.bench.simulate import ClusterSpec, RunLog, simulate
from asyncdp.runtime import die_with_parent

__all__ = ["POLL_S", "Runner", "default_jobs", "interrupt_in_process_run"]

POLL_S = 0.2  # the longest a signal waits for the main thread while it waits for runs (module docstring)


def default_jobs() -> int:
    """One run per core."""
    return max(1, os.cpu_count() or 1)


def interrupt_in_process_run() -> bool:
    """From a signal handler: stop the simulated run going on in this thread (module docstring) with a
    KeyboardInterrupt at its main task's next checkpoint, as trio's own Ctrl-C handler does, and say True; False
    when no run is going on here (the caller may then raise)."""
    trio = sys.modules.get("trio")
    if trio is None or not trio.lowlevel.in_trio_run():
        return False
    run_module: Any = importlib.import_module("trio._core._run")  # private (trio's own KI delivery): no stubs
    deliver = getattr(getattr(run_module.GLOBAL_RUN_CONTEXT, "runner", None), "deliver_ki", None)
    if deliver is None:
        return False
    deliver()  # signal-safe: trio calls it from its SIGINT handler
    return True


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread meanwhile; one that comes meanwhile waits for the unblock, then
    interrupts. Around a submit, because it may start a worker: a process started here, and a thread started here,
    inherit the block. The pool's workers start from the thread that submits (the first ones) and from the pool's
    manager thread (the rest), which the first submit starts. So every worker is deaf to Ctrl-C from its first
    instruction, though Ctrl-C reaches the whole process group: the command stops them itself (:meth:`Runner.stop`)
    instead of each printing a KeyboardInterrupt traceback. And the command is not interrupted halfway through
    starting a worker, which would leave it reading its start-up data from a closed pipe (an EOFError traceback).
    The worker takes SIGTERM again first thing (:func:`_worker_start`)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _worker_start(parent_pid: int) -> None:
    """A worker's first act: killed with the command (:func:`asyncdp.runtime.die_with_parent`), and SIGTERM taken
    again (blocked since its birth, :func:`_signals_blocked`; SIGINT stays blocked)."""
    die_with_parent(parent_pid, signal.SIGKILL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


class Runner:
    """A pool of ``jobs`` worker processes, each started for one run and gone after it. Use as a context manager:
    leaving it normally waits for the runs; leaving it on an exception (an error, Ctrl-C) stops them (:meth:`stop`)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._pool = None if jobs == 0 else ProcessPoolExecutor(
            max_workers=jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1,
            initializer=_worker_start, initargs=(os.getpid(),))

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._pool is not None:
            if exc_type is not None:
                self.stop()
            self._pool.shutdown(wait=True, cancel_futures=True)

    def stop(self) -> None:
        """Cancel the runs not started and kill the ones running: after an error or an interrupt their results
        would be thrown away, and waiting for them could take many minutes."""
        if self._pool is None:
            return
        # ProcessPoolExecutor has no public way to stop a running task before Python 3.14 (kill_workers). The
        # workers are killed first, then the pool is shut down and waited for: shut down first, its manager thread
        # could still be replacing a worker that had just exited, and died on the process table shutdown cleared
        # (a TypeError traceback from a thread, printed after the run's own error).
        procs = list((self._pool._processes or {}).values())
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, workload: Workload, policy: str, seed: int, spec: ClusterSpec, *,
               closed_concurrency: int | None = None) -> Future[RunLog]:
        if self._pool is not None:
            with _signals_blocked():
                return self._pool.submit(simulate, workload, policy, seed, spec,
                                         closed_concurrency=closed_concurrency)
        future: Future[RunLog] = Future()  # jobs=0: run it now, here
        try:
            future.set_result(simulate(workload, policy, seed, spec, closed_concurrency=closed_concurrency))
        except Exception as exc:  # noqa: BLE001 - handed to the caller through the future, as a pool would
            future.set_exception(exc)
        except BaseExceptionGroup as group:  # a Ctrl-C (or interrupt_in_process_run) inside the run's task groups
            if group.subgroup(KeyboardInterrupt) is None:
                raise
            raise KeyboardInterrupt from None
        return future

    def run(self, workload: Workload, policy: str, seed: int, spec: ClusterSpec, *,
            closed_concurrency: int | None = None) -> RunLog:
        """One run, waited for (the R_sat measurement's ``run``)."""
        future = self.submit(workload, policy, seed, spec, closed_concurrency=closed_concurrency)
        for _ in self.completed([future]):
            pass
        return future.result()

    @staticmethod
    def completed(futures: Iterable[Future[Any]]) -> Iterator[Future[Any]]:
        """The futures as they finish (those that finish in one slice in the order given); the first failed one
        raises its run's error here. Waits ``POLL_S`` at a time, so a signal another thread took interrupts within
        that (module docstring)."""
        given = list(futures)
        pending = set(given)
        while pending:
            done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in [f for f in given if f in done]:
                future.result()
                yield future
