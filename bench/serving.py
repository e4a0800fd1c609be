"""One ``asyncdp serve`` for a benchmark: launched on a free loopback port, waited for on ``/health``, stopped with
SIGTERM (the launcher stops its children in order) and killed as a process group if it does not exit.

Also what the bench scripts share for their command lines: a bad value is a usage error (``<script>: error: ...``
on stderr, exit 2), found before any server or long run starts, never a traceback (argparse types for counts,
rates, policy and model names; :func:`check_output` for the files a script writes), and :func:`run_cli`, which
ends a run that fails after them with one line, never a traceback."""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx

ROOT = Path(__file__).resolve().parents[1]


def exit_on_sigterm() -> None:
    """SIGTERM (``timeout``, an orchestrator, ``kill``) ends the script as Ctrl-C does, by an exception, so the
    ``finally`` clauses stop the servers it started; by default Python dies at once and leaves them running (each
    leads its own session). Only from the main thread, and only over the default handler."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be >= {least} (got {value})")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (0 or a negative count is a usage error, exit 2, not a traceback or a hang)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an int >= 0 (where 0 means "none" or "the default"; a negative count is a usage error)."""
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    """An argparse type: a finite float > 0 (a rate, a period, a timeout)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 and finite (got {text})")
    return value


def policy_list(text: str) -> list[str]:
    """An argparse type: comma-separated load-balancing policy names, each one ``make_policy`` accepts, so an
    unknown name is a usage error naming the valid ones before any run or server starts."""
    from asyncdp.dp.balance import make_policy
    from asyncdp.errors import ConfigError

    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("no policy given")
    for name in names:
        try:
            make_policy(name)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).rstrip(".")) from None
    return names


def model_name(text: str) -> str:
    """An argparse type: a built-in model name or a local checkpoint directory (checked, not loaded)."""
    from asyncdp.errors import ConfigError
    from asyncdp.model import BUILTIN_PREFIX, builtin_names, resolve_model

    if text.startswith(BUILTIN_PREFIX):
        if text not in builtin_names():
            raise argparse.ArgumentTypeError(f"unknown built-in model {text!r}; known: {', '.join(builtin_names())}")
        return text
    try:
        resolve_model(text)  # a directory: only checked for config.json, weights and a tokenizer
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).rstrip(".")) from None
    return text


def git_tracked(path: Path) -> bool:
    """Whether ``path`` is a file git tracks in the work tree holding it (False where git or a work tree is
    missing)."""
    folder = path.resolve().parent
    if not folder.is_dir():
        return False
    try:
        return subprocess.run(["git", "-C", str(folder), "ls-files", "--error-unmatch", "--", path.name],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def check_output(parser: argparse.ArgumentParser, flag: str, path: Path | str | None) -> Path | None:
    """Before any work: ``path`` (the value of ``flag``) can be written, its folder made if missing (the checks of
    ``asyncdp bench``'s outputs, :func:`asyncdp.bench.files.check_file`), and it is not a file git tracks (a
    benchmark's output must never replace a committed file by surprise); otherwise a usage error (exit 2).
    Returns the path (None stays None: the output is optional)."""
    from asyncdp.bench.files import check_file
    from asyncdp.errors import ConfigError

    if path is None:
        return None
    try:
        checked = check_file(flag, str(path))
    except ConfigError as exc:
        parser.error(str(exc))
    if git_tracked(checked):
        parser.error(f"{flag} {path}: is a file tracked by git; write the output elsewhere (bench/results/ is "
                     "not tracked)")
    checked.parent.mkdir(parents=True, exist_ok=True)  # the scripts write it in place (check_file makes nothing)
    return checked


def free_port() -> int:
    """A port that was free a moment ago (the launcher binds ``--port`` itself; a lost race shows as an exit
    before ``/health`` answers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    """``asyncdp serve`` exited before ``/health`` answered, or did not answer in time; the message ends with the
    last lines of its output when it went to a file (a bad flag is then named, not hidden)."""


def _log_tail(log: IO[bytes] | None, lines: int = 20) -> str:
    name = getattr(log, "name", None)
    if log is None or not isinstance(name, str) or not os.path.isfile(name):
        return ""
    log.flush()
    tail = Path(name).read_text(errors="replace").strip().splitlines()[-lines:]
    return "; its last output:\n" + "\n".join(f"  {line}" for line in tail) if tail else ""


@contextmanager
def asyncdp_serve(model: str, *args: str, log: IO[bytes] | None = None, env: dict[str, str] | None = None,
                  timeout_s: float = 120.0, tree: Path = ROOT,
                  poll_s: float = 0.2) -> Iterator[tuple[str, int]]:
    """Yield ``(base_url, launcher pid)`` once ``/health`` answers 200 (polled every ``poll_s``); the output goes to
    ``log`` (else nowhere). ``tree``: the checkout of asyncdp it runs from (a baseline's, to compare two)."""
    exit_on_sigterm()
    port = free_port()
    cmd = [sys.executable, "-m", "asyncdp", "serve", model, "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT if log else
                            subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(tree), **(env or {})}, cwd=tree,
                            start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, base_url, timeout_s, log, poll_s)
        yield base_url, proc.pid
    finally:
        stop_server(proc)


def wait_ready(proc: subprocess.Popen[bytes], base_url: str, timeout_s: float, log: IO[bytes] | None = None,
               poll_s: float = 0.2) -> None:
    """Return once ``base_url``'s ``/health`` answers 200; :class:`ServerStartError` if ``proc`` exits first or
    ``timeout_s`` passes (with the last lines of ``log``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        try:  # the poll interval, ending early if the server died
            code = proc.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                raise ServerStartError(f"asyncdp serve was not ready in {timeout_s:g} s{_log_tail(log)}") from None
        else:
            raise ServerStartError(f"asyncdp serve exited with {code} before ready{_log_tail(log)}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL of its process group after 30 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_cli(main: Callable[[], int]) -> None:
    """Exit with ``main()``'s status, never with a traceback for what the user can fix: a ConfigError that got
    past the argument checks (a bad workload or profile) is one line ``<script>: error: ...`` and exit 2; a server
    that does not start is one such line with the server's last output, and exit 1, and so is a request a running
    server failed or dropped."""
    from asyncdp.errors import ConfigError

    prog = Path(sys.argv[0]).name
    try:
        sys.exit(main())
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except ServerStartError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except httpx.HTTPError as exc:
        print(f"{prog}: error: a request failed: {exc!r}", file=sys.stderr)
        sys.exit(1)


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (Linux, from /proc), children before their own."""
    out, todo = [], [root]
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(text[text.rindex(")") + 2:].split()[1]), []).append(int(entry))
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tree_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of ``pid`` and its descendants so far (Linux, from /proc); None for no pid, or
    where /proc cannot tell (not Linux, the process gone)."""
    if pid is None:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    try:
        while todo:
            p = todo.pop()
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
    except (OSError, ValueError):
        return None
    return total


def startup_took(log: IO[bytes]) -> float:
    """The launcher's "startup took N s" from a deployment's ``log`` (read from its start); NaN when it has none."""
    log.seek(0)
    took = re.search(rb"startup took ([0-9.]+) s", log.read())
    return float(took.group(1)) if took else float("nan")


def measure_startup(trees: dict[str, Path], n: int, model: str, *serve_args: str,
                    probe: Callable[[str, int], None] | None = None) -> dict[str, list[tuple[float, float]]]:
    """``n`` rounds, each starting ``asyncdp serve model *serve_args`` once from each tree in turn (one thread per
    engine, stopped once healthy): per tree, each start's (seconds to /health 200, the launcher's "startup took"
    seconds). ``probe(tree name, launcher pid)`` runs on each deployment once startup took, before it stops."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for _ in range(n):
        for name, tree in trees.items():
            with tempfile.TemporaryFile() as log:
                t0 = time.perf_counter()
                with asyncdp_serve(model, *serve_args, "--torch-threads", "1", log=log,
                                   env={"OMP_NUM_THREADS": "1"}, timeout_s=180, tree=tree, poll_s=0.05) as (_, pid):
                    ready_s = time.perf_counter() - t0
                    wait_logged(log, b"startup took ", 30.0)  # an API server's /health 200 can come first
                    if probe is not None:
                        probe(name, pid)
                runs[name].append((ready_s, startup_took(log)))
    return runs


def wait_logged(log: IO[bytes], needle: bytes, timeout_s: float) -> None:
    """Until ``needle`` is in the running server's ``log`` (read without moving the offset the server writes at),
    or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while needle not in os.pread(log.fileno(), os.fstat(log.fileno()).st_size, 0) and time.monotonic() < deadline:
        time.sleep(0.05)


def baseline_trees(parser: argparse.ArgumentParser, baseline: Path | None,
                   flag: str = "--baseline") -> dict[str, Path]:
    """``{"this tree": ROOT}``, plus ``"baseline"``: the checkout given by ``flag``, to start deployments from in
    the same alternating rounds (a parser error when it holds no asyncdp tree)."""
    if baseline is None:
        return {"this tree": ROOT}
    if not (baseline / "asyncdp" / "__main__.py").is_file():
        parser.error(f"{flag} {baseline} holds no asyncdp tree")
    return {"this tree": ROOT, "baseline": baseline.resolve()}
