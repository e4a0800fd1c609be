"""Fixtures that run a real ``asyncdp serve`` deployment as a subprocess tree, and always take it down.

Theory of operation
-------------------
:func:`serve` starts ``python -m asyncdp serve builtin:tiny-dense ...`` in a new session on 127.0.0.1 and a port
the OS just handed out (bound on port 0 and closed right before the launch; a launch that loses that race with
"cannot listen" is retried once on a fresh port). It waits for ``GET /health == 200`` under a deadline, polling
every 0.2 s, and fails with the server's log if the launcher exits first. A 200 counts only from this launch:
``/server_info``'s ``api_process_pid`` must be the launcher or one of its descendants (whatever else answers on
the port, a program that got it first, is waited out until the launcher fails with "cannot listen").

asyncdp's children lead their own sessions, so one process group does not cover a deployment. The fixture records
the launcher's process tree from ``/proc`` (pid and start time, so a reused pid is not mistaken for a survivor)
once healthy and again before stopping. :meth:`Server.stop` sends SIGTERM to the launcher, asserts exit code 0,
that its session is gone (``killpg(pgid, 0)``), that no recorded process remains and that no traceback was
logged; the finalizer SIGKILLs whatever is left, so a failing test never leaks processes.

Module-scoped fixtures share one deployment between the tests of a module: ``dp2`` (dp=2 behind 2 API-server
processes) and ``dp2_single_api`` (dp=2 behind one API server, ``--max-queued-requests 1``).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from asyncdp.launcher import rundir

ROOT = Path(__file__).resolve().parents[2]
MODEL = "builtin:tiny-dense"
READY_TIMEOUT_S = 60.0
BASE_ARGS = ("--executor", "torch", "--max-model-len", "512", "--torch-threads", "1")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def stale_run_dirs() -> set[str]:
    """Run directories whose launcher is gone (see :mod:`asyncdp.launcher.rundir`)."""
    return {path for path, _ in rundir.stale()}


@pytest.fixture(scope="session", autouse=True)
def no_run_directory_left() -> Iterator[None]:
    """The e2e tests leave no run directory behind: deployments stopped in order remove theirs, and the
    harness removes those of deployments it killed whole, as the next launch would."""
    before = stale_run_dirs()
    yield
    left = stale_run_dirs() - before
    assert not left, f"run directories left behind by the e2e tests: {sorted(left)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A port P with P and P + 1 both free right now: the children of a ``-dpl 2`` multi-port supervisor listen on
    ``--port`` + their local index (a free P alone left P + 1 to chance: "Address already in use")."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time in ticks) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name in parentheses may contain spaces
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Live descendants of ``root`` (pid -> start time), from one scan of /proc."""
    children: dict[int, list[int]] = {}
    start: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None and st[0] != "Z":
            children.setdefault(st[1], []).append(int(entry))
            start[int(entry)] = st[2]
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out[child] = start[child]
            todo.append(child)
    return out


@dataclass
class Server:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    args: tuple[str, ...]
    scheme: str = "http"
    known: dict[int, int] = field(default_factory=dict)  # pid -> start time of every process seen in the tree

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def openai(self, **kwargs: Any) -> AsyncOpenAI:
        if self.scheme == "https":  # the tests' self-signed certificate
            kwargs.setdefault("http_client", httpx.AsyncClient(verify=False))
        return AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="x", max_retries=0, **kwargs)

    def remember_tree(self) -> None:
        """Record the launcher's current process tree. Children lead their own sessions and are re-parented
        when the launcher dies, so the tree is recorded while it is whole and checked by pid and start time."""
        self.known.update(descendants(self.process.pid))

    def remaining(self) -> list[int]:
        """Processes of this deployment still alive (zombies count as gone)."""
        if self.process.poll() is None:
            self.remember_tree()
        left = []
        for pid, started in self.known.items():
            st = _stat(pid)
            if st is not None and st[0] != "Z" and st[2] == started:
                left.append(pid)
        if self.process.poll() is None:
            left.append(self.process.pid)
        return sorted(left)

    def titles(self) -> dict[int, str]:
        """pid -> process title (argv[0] after setproctitle) of the deployment's live processes."""
        out = {}
        for pid in self.remaining():
            try:
                out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:  # it ended meanwhile
                pass
        return out

    def wait_gone(self, timeout_s: float = 2.0) -> list[int]:
        """Wait until no process of the deployment is left; return those still alive at the deadline."""
        deadline = time.monotonic() + timeout_s
        left = self.remaining()
        while left and time.monotonic() < deadline:
            try:  # a bounded wait that is not a blind sleep: it returns early if the launcher is reaped
                self.process.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
            left = self.remaining()
        return left

    def stop(self, *, timeout_s: float = 15.0, sig: signal.Signals = signal.SIGTERM) -> float:
        """Signal the launcher; assert exit 0 and no leftover process. Returns the seconds it took."""
        self.remember_tree()
        t0 = time.monotonic()
        self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"launcher did not exit within {timeout_s} s of {sig.name}\n{self.log()[-4000:]}")
        took = time.monotonic() - t0
        assert code == 0, f"launcher exited with {code}\n{self.log()[-4000:]}"
        left = self.wait_gone()
        assert not left, f"processes left after shutdown: {left}\n{self.log()[-4000:]}"
        with pytest.raises(ProcessLookupError):
            os.killpg(self.process.pid, 0)
        assert "Traceback" not in self.log(), f"a traceback was logged\n{self.log()[-4000:]}"
        return took

    def kill_every_process(self) -> None:
        """SIGKILL the launcher and every recorded process of its tree at once: nobody is left to remove the
        run directory."""
        for pid in [self.process.pid, *self.remaining()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.wait_gone(5.0)  # a killed process lets go of its run directory's lock only once it has exited

    def kill_all(self) -> None:
        """:meth:`kill_every_process`, then what the next launch on the machine would do: remove the run
        directories of deployments killed whole."""
        self.kill_every_process()
        rundir.sweep_stale()


def _launch(args: tuple[str, ...], log_path: Path, model: str = MODEL) -> Server:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "asyncdp", "serve", model, "--host", "127.0.0.1", "--port", str(port), *args]
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=ROOT)
    scheme = "https" if "--ssl-certfile" in args else "http"
    return Server(port=port, process=proc, log_path=log_path, args=args, scheme=scheme)


def _in_tree(pid: object, root: int) -> bool:
    """Whether ``pid`` is ``root`` or a descendant of it (its parent chain, from /proc, reaches ``root``)."""
    while isinstance(pid, int) and pid > 1:
        if pid == root:
            return True
        st = _stat(pid)
        if st is None:
            return False
        pid = st[1]
    return False


def _api_key(args: tuple[str, ...]) -> str | None:
    """The API key the deployment was given (``--api-key`` or its environment variables), if any."""
    for i, arg in enumerate(args):
        if arg == "--api-key" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--api-key="):
            return arg.partition("=")[2]
    return os.environ.get("ASYNCDP_API_KEY") or os.environ.get("VLLM_API_KEY")


def _stranger(http: httpx.Client, server: Server) -> str | None:
    """None when the process answering on the server's port belongs to this launch (``api_process_pid`` of
    ``/server_info``: the launcher or one of its descendants); else what answered instead, for the failure."""
    key = _api_key(server.args)
    response = http.get(f"{server.base_url}/server_info",
                        headers={"Authorization": f"Bearer {key}"} if key else None)
    try:
        pid = response.json().get("api_process_pid") if response.status_code == 200 else None
    except (ValueError, AttributeError):
        pid = None
    if _in_tree(pid, server.process.pid):
        return None
    if pid is not None:
        return f"pid {pid}, not of this launch (launcher pid {server.process.pid})"
    return f"a server whose /server_info answered {response.status_code} without a pid"


def _wait_healthy(server: Server, timeout_s: float) -> bool:
    """True once /health is 200 from this launch; False if the launcher exited first. Fails the test at the
    deadline.

    A 200 counts only when ``/server_info`` on the port names a process of this launch (one more request, once the
    health check passes): another deployment sharing the port, or a program that got it first, may answer too."""
    deadline = time.monotonic() + timeout_s
    stranger = None
    with httpx.Client(timeout=2.0, verify=False) as http:
        while time.monotonic() < deadline:
            try:
                if http.get(f"{server.base_url}/health").status_code == 200:
                    stranger = _stranger(http, server)
                    if stranger is None:
                        server.remember_tree()
                        return True
            except httpx.TransportError:
                pass
            try:  # poll interval, and an early exit if the launcher died
                server.process.wait(timeout=0.2)
                return False
            except subprocess.TimeoutExpired:
                pass
    answered = f"; the port was answered by {stranger}" if stranger else ""
    pytest.fail(f"server not healthy within {timeout_s} s{answered}\n{server.log()[-4000:]}")


@contextmanager
def serve(log_dir: Path, *args: str, ready_timeout_s: float = READY_TIMEOUT_S, model: str = MODEL) -> Iterator[Server]:
    """Run a deployment for the duration of the block; stop it (asserting a clean exit) afterwards.

    The caller may stop it itself (``server.stop()``) inside the block; the finalizer then only checks for leftovers.
    """
    full_args = (*BASE_ARGS, *args)
    log_path = log_dir / f"asyncdp-{uuid.uuid4().hex[:8]}.log"
    server = _launch(full_args, log_path, model)
    try:
        if not _wait_healthy(server, ready_timeout_s) and re.search(r"cannot listen on .*in use", server.log()):
            server.kill_all()
            server = _launch(full_args, log_path, model)  # lost the race for the port: once more, on a new one
            _wait_healthy(server, ready_timeout_s)
        if server.process.poll() is not None:
            pytest.fail(f"server exited with {server.process.returncode} before ready\n{server.log()[-4000:]}")
        yield server
        if server.process.poll() is None:
            server.stop()
    finally:
        if server.process.poll() is None or server.remaining():
            server.kill_all()


def _module_server(tmp_path_factory: pytest.TempPathFactory, name: str, *args: str) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp(name), *args) as server:
        yield server


@pytest.fixture(scope="module")
def dp2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """dp=2 behind two API-server processes sharing the port (the default count for -dp 2, made explicit)."""
    yield from _module_server(tmp_path_factory, "dp2", "-dp", "2", "--api-server-count", "2")


@pytest.fixture(scope="module")
def dp2_single_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """dp=2 behind one in-launcher API server that admits one request at a time."""
    yield from _module_server(tmp_path_factory, "dp2-1api", "-dp", "2", "--api-server-count", "1",
                              "--max-queued-requests", "1")
