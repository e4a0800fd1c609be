"""No simulated run outlives ``asyncdp bench routing`` (asyncdp/bench/runner.py): real processes, real signals.

A full-scale W2 run takes tens of minutes, so the workers are still busy when the command is signalled. Before the
fix, a SIGTERM or SIGKILL to the command left its workers computing, orphaned, until their runs ended."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from asyncdp.bench.runner import Runner
from asyncdp.supervisor.children import descendants
from tests.bench.procs import read_until, reap, wait_busy

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _sigint_blocked(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)
    return False


def _workers(pid: int) -> list[int]:
    """The command's run workers: its children but multiprocessing's resource tracker, which the pool starts when
    it is made, long before the workers (a worker read between its fork and its exec still shows the command's
    own command line, so workers are not told by theirs)."""
    out = []
    for child in descendants(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"resource_tracker" not in cmdline and _alive(child):
            out.append(child)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; the kernel's parent-death signal")
@pytest.mark.parametrize(("sig", "status", "message"), [
    (signal.SIGTERM, 143, "terminated (SIGTERM): stopped the runs"),
    (signal.SIGINT, 130, "interrupted: stopped the runs"),  # Ctrl-C: to the whole process group, workers too
    (signal.SIGKILL, -signal.SIGKILL, None),
])
def test_no_run_outlives_the_command(sig, status, message):
    # The command as a shell starts it in the foreground, where Ctrl-C reaches it. A suite run in the background
    # (`cmd &` in a script, nohup) has SIGINT ignored, and a child inherits an ignored signal across exec: the command
    # would then rightly ignore Ctrl-C too and run on. A handler in this process is reset to the default in the child.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncdp", "bench", "routing", "--workload", "w2", "--scale", "full",
             "--policies", "vllm,round_robin", "--jobs", "2"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    workers: list[int] = []
    exits: list[int] = []
    try:
        assert proc.stderr is not None
        # said once both runs have their workers
        head = read_until(proc.stderr.fileno(), b"asyncdp bench: 2 runs, 2 at a time\n", 60)
        assert b"2 runs, 2 at a time" in head, head.decode(errors="replace")
        workers = _workers(proc.pid)
        assert len(workers) == 2, "the command did not start its two runs"
        assert all(_sigint_blocked(pid) for pid in workers)  # deaf to Ctrl-C from birth: the command stops them
        exits = [os.pidfd_open(pid) for pid in workers]  # each readable once its worker has exited
        # signalled at once, while the workers are still importing: no grace period is needed
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # as a terminal sends it
        else:
            proc.send_signal(sig)
        assert proc.wait(timeout=30) == status
        deadline = time.monotonic() + 10
        while exits and (left := deadline - time.monotonic()) > 0:
            done, _, _ = select.select(exits, [], [], left)
            for fd in done:
                exits.remove(fd)
                os.close(fd)
        assert not [pid for pid in workers if _alive(pid)], "a run outlived the command"
        err = (head + proc.stderr.read()).decode()
        if message is not None:
            assert f"asyncdp bench: {message}" in err
            assert "Traceback" not in err  # neither the command's nor a worker's
    finally:
        for fd in exits:
            os.close(fd)
        reap(proc)
        for pid in workers:  # a failed run of this test leaves no orphans either
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


class _Interrupted(Exception):
    pass


def _interrupt(signum: int, frame: object) -> None:
    raise _Interrupted


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs thread-directed signals")
def test_a_signal_another_thread_took_still_interrupts_the_wait_for_runs():
    """The kernel may hand a process-directed signal to any thread that does not block it (tqdm's monitor thread
    runs unblocked), and Python runs the handler in the main thread when that next runs bytecode. A wait for the runs
    without a timeout would put it off until a run ended, minutes later. Here a helper thread takes the signal while
    the main thread waits for a run that ends only 10 s later."""
    never = Future()
    ends = threading.Timer(10.0, never.set_result, [None])  # so that a wait that misses the signal ends too
    takes = threading.Timer(0.1, lambda: signal.pthread_kill(threading.get_ident(), signal.SIGUSR1))
    previous = signal.signal(signal.SIGUSR1, _interrupt)
    try:
        ends.start()
        takes.start()
        with pytest.raises(_Interrupted):
            for _ in Runner.completed([never]):
                pass
        assert not never.done()  # interrupted while the run was still going, not after it ended
    finally:
        signal.signal(signal.SIGUSR1, previous)
        ends.cancel()
        takes.cancel()


def test_a_failed_run_stops_the_pool_without_a_thread_traceback_after_its_own_error() -> None:
    # Shut down before its workers were killed, the pool's manager thread died replacing the worker that had just
    # exited (a TypeError from a thread, printed after the run's own ConfigError).
    script = (
        "from asyncdp.bench.runner import Runner\n"
        "from asyncdp.bench.workloads import build\n"
        "from asyncdp.bench.records import resolve\n"
        "from asyncdp.bench.simulate import ClusterSpec\n"
        "from asyncdp.bench.profiles import load_profile\n"
        "if __name__ == '__main__':\n"
        "    w = resolve(build('w1', 'quick', 1, {'groups': 2, 'prompts_per_group': 2}))\n"
        "    with Runner(1) as r:\n"
        "        try:\n"
        "            r.submit(w, 'nosuch', 1, ClusterSpec(dp_size=2, profile=load_profile('gpu_8b'))).result()\n"
        "        except Exception as exc:\n"
        "            print('run error:', type(exc).__name__)\n"
        "            r.stop()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "run error: ConfigError"
    assert "Traceback" not in done.stderr and "TypeError" not in done.stderr, done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals to a child process")
@pytest.mark.parametrize(("sig", "status", "message"), [
    (signal.SIGTERM, 143, "terminated (SIGTERM): stopped the runs"),
    (signal.SIGINT, 130, "interrupted: stopped the runs"),
])
def test_a_signal_stops_a_run_in_this_process_at_once_with_one_line(tmp_path, sig, status, message):
    # --jobs 0: the run goes on inside trio.run in the command's own thread. The SIGTERM handler raised SystemExit
    # wherever it landed, trio's bookkeeping included: exit 1 after a page of exception-group tracebacks, or a run
    # that went on for over a minute with the SIGTERM lost; Ctrl-C came out as an exception group (exit 1).
    out = tmp_path / "r.json"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a foreground shell starts it
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncdp", "bench", "routing", "--workload", "w9", "--option", "clients=16",
             "--option", "duration_s=600", "--policies", "vllm", "--jobs", "0", "--json", str(out)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        assert proc.stderr is not None
        head = read_until(proc.stderr.fileno(), b"one after another in this process\n", 60)
        assert b"one after another" in head, head.decode(errors="replace")
        assert wait_busy(proc, 0.5, 60), "the run did not get going"  # well into it (about a minute), in trio.run
        sent = time.monotonic()
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == status
        assert time.monotonic() - sent < 10
        err = (head + proc.stderr.read()).decode()
        assert f"asyncdp bench: {message}" in err
        assert "Traceback" not in err and "Exception" not in err, err
        assert not out.exists()
    finally:
        reap(proc)
