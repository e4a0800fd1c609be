"""Multi-node deployments on loopback for end-to-end tests: each node its own ``asyncdp serve`` process tree.

Theory of operation
-------------------
A :class:`Deployment` is a list of nodes, each a :class:`~tests.e2e.conftest.Server` (a process tree recorded
from ``/proc``, with its own log file). A node with an HTTP endpoint gets ``--host 127.0.0.1 --port P`` on a port
the OS just handed out; a headless node gets no port (``Server.port`` is 0 and never used). Every node gets the
conftest ``BASE_ARGS`` and ``-dpa 127.0.0.1 -dpp RPC``: the rpc port is user-facing, so it is picked like the HTTP
port (bind port 0, close, use) and a launch that loses that race ("cannot listen ... in use") is retried once on
fresh ports, as conftest does.

:func:`deployment` starts the nodes in the order given (``wait_before`` names the nodes after which it waits until
that node's log shows its checkpoint resolved, so "the headless node starts first" is true and not a race), then
waits until every HTTP node answers ``GET /health == 200`` — the head's /health is 200 only once every rank of
the deployment, local or remote, is ready — and fails with all logs if any node exits first. It records every
tree once healthy. :meth:`Deployment.stop` signals the nodes with an endpoint (the hybrid nodes with ``S > 0``
first, the head last; headless nodes follow the head's ``NodeShutdown``), then asserts exit code 0 on every
node, no process left in any tree and no traceback in any log; the finalizer SIGKILLs whatever is left.
:meth:`Deployment.drop` takes a node killed on purpose out of those checks.

Tests act on nodes with :func:`kill_tree` (SIGKILL of a whole recorded tree), :func:`relaunch` (the same command
line again, HTTP port included: a node restarted in place), :func:`wait_code` (an exit code under a deadline) and
:func:`stream_completion` (a long streamed request that reports how it ended).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest

from asyncdp.launcher import rundir
from tests.e2e.conftest import BASE_ARGS, MODEL, READY_TIMEOUT_S, ROOT, Server, free_port

LOST_RACE = re.compile(r"cannot listen on .*in use")
LONG = 400  # tokens: long enough to be in flight when a test acts on the first one


@dataclass(frozen=True)
class NodeSpec:
    """One launch: its arguments (without the common ones) and whether it has an HTTP endpoint."""

    args: tuple[str, ...]
    http: bool = True
    name: str = "node"


def head(*args: str, name: str = "head") -> NodeSpec:
    return NodeSpec(tuple(args), http=True, name=name)


def headless(*args: str, name: str = "headless") -> NodeSpec:
    return NodeSpec(("--headless", *args), http=False, name=name)


def launch_node(spec: NodeSpec, rpc: int, log_path: Path, model: str) -> Server:
    port = free_port() if spec.http else 0
    http = ("--host", "127.0.0.1", "--port", str(port)) if spec.http else ()
    return _popen((*BASE_ARGS, *http, "-dpa", "127.0.0.1", "-dpp", str(rpc), *spec.args), port, log_path, model)


def relaunch(node: Server, log_path: Path, model: str) -> Server:
    """The same command line as ``node``'s, its HTTP port included: a node restarted in place (by an orchestrator)."""
    return _popen(node.args, node.port, log_path, model)


def _popen(args: tuple[str, ...], port: int, log_path: Path, model: str) -> Server:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "asyncdp", "serve", model, *args]
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=ROOT)
    return Server(port=port, process=proc, log_path=log_path, args=args)


@dataclass
class Deployment:
    nodes: list[Server]
    specs: list[NodeSpec]
    rpc: int
    model: str

    def node(self, name: str) -> Server:
        return self.nodes[[s.name for s in self.specs].index(name)]

    @property
    def endpoints(self) -> list[Server]:
        return [n for n, s in zip(self.nodes, self.specs, strict=True) if s.http]

    @property
    def head(self) -> Server:
        return self.endpoints[0]

    def logs(self) -> str:
        return "\n".join(f"===== {s.name} ({n.log_path}) =====\n{n.log()[-3000:]}"
                         for n, s in zip(self.nodes, self.specs, strict=True))

    def drop(self, name: str) -> Server:
        """Take a node killed on purpose out of the deployment (stop() then checks only the others)."""
        i = [s.name for s in self.specs].index(name)
        self.specs.pop(i)
        return self.nodes.pop(i)

    def remember_trees(self) -> None:
        for n in self.nodes:
            if n.process.poll() is None:
                n.remember_tree()

    def remaining(self) -> list[int]:
        return sorted(pid for n in self.nodes for pid in n.remaining())

    def wait_gone(self, timeout_s: float = 2.0) -> list[int]:
        deadline = time.monotonic() + timeout_s
        left = self.remaining()
        while left and time.monotonic() < deadline:
            for n in self.nodes:  # a bounded wait that returns early when a launcher is reaped
                try:
                    n.process.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
            left = self.remaining()
        return left

    def wait_exit(self, node: Server, timeout_s: float) -> int:
        try:
            return node.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{node.args} did not exit within {timeout_s} s\n{self.logs()}")

    def stop(self, *, timeout_s: float = 20.0) -> None:
        """SIGTERM the endpoints (hybrid S > 0 first, the head last); every node exits 0 and leaves nothing."""
        self.remember_trees()
        for n in reversed(self.endpoints):
            n.process.send_signal(signal.SIGTERM)
        codes = [self.wait_exit(n, timeout_s) for n in self.nodes]
        assert codes == [0] * len(self.nodes), f"exit codes {codes}\n{self.logs()}"
        self.assert_clean()

    def assert_clean(self) -> None:
        left = self.wait_gone(5.0)
        assert not left, f"processes left after shutdown: {left}\n{self.logs()}"
        for n in self.nodes:
            with pytest.raises(ProcessLookupError):
                os.killpg(n.process.pid, 0)
            assert "Traceback" not in n.log(), f"a traceback was logged\n{self.logs()}"

    def kill_all(self) -> None:
        for n in self.nodes:
            n.kill_all()


def _wait_logged(node: Server, pattern: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if re.search(pattern, node.log()):
            return
        try:
            node.process.wait(timeout=0.1)
            pytest.fail(f"node exited with {node.process.returncode} before logging {pattern!r}\n{node.log()}")
        except subprocess.TimeoutExpired:
            pass
    pytest.fail(f"node did not log {pattern!r} within {timeout_s} s\n{node.log()}")


def wait_healthy(dep: Deployment, timeout_s: float) -> str | None:
    """None once every endpoint answers /health 200, else the log of the node that exited first."""
    deadline = time.monotonic() + timeout_s
    pending = list(dep.endpoints)
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            for n in dep.nodes:
                if n.process.poll() is not None:
                    return n.log()
            for n in list(pending):
                try:
                    if http.get(f"{n.base_url}/health").status_code == 200:
                        pending.remove(n)
                except httpx.TransportError:
                    pass
            if not pending:
                dep.remember_trees()
                return None
            try:  # poll interval, and an early return if the head died
                dep.head.process.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
    pytest.fail(f"deployment not healthy within {timeout_s} s\n{dep.logs()}")


def start(log_dir: Path, specs: Sequence[NodeSpec], *, model: str = MODEL,
          wait_before: Sequence[str] = ()) -> Deployment:
    """Launch the nodes in order on one fresh rpc port (no health wait)."""
    rpc = free_port()
    nodes = []
    for spec in specs:
        log_path = log_dir / f"{spec.name}-{uuid.uuid4().hex[:6]}.log"
        nodes.append(launch_node(spec, rpc, log_path, model))
        if spec.name in wait_before:
            _wait_logged(nodes[-1], r"checkpoint .* \(resolved in", READY_TIMEOUT_S)
    return Deployment(nodes, list(specs), rpc, model)


@contextmanager
def deployment(log_dir: Path, *specs: NodeSpec, model: str = MODEL, wait_before: Sequence[str] = (),
               ready_timeout_s: float = 2 * READY_TIMEOUT_S) -> Iterator[Deployment]:
    """Run a multi-node deployment for the block; stop it (asserting a clean exit on every node) afterwards.
    The caller may end it itself; the finalizer then only removes leftovers."""
    dep = start(log_dir, specs, model=model, wait_before=wait_before)
    try:
        exited = wait_healthy(dep, ready_timeout_s)
        if exited is not None and LOST_RACE.search(exited):
            dep.kill_all()
            dep = start(log_dir, specs, model=model, wait_before=wait_before)  # lost a port race: once more
            exited = wait_healthy(dep, ready_timeout_s)
        if exited is not None:
            pytest.fail(f"a node exited before the deployment was ready\n{dep.logs()}")
        yield dep
        if any(n.process.poll() is None for n in dep.nodes):
            dep.stop()
    finally:
        if any(n.process.poll() is None or n.remaining() for n in dep.nodes):
            dep.kill_all()


# ---------------------------------------------------------------------------------------------- acting on nodes


def kill_tree(node: Server) -> None:
    """SIGKILL every process of a node's tree (its children lead their own sessions: no one process group)."""
    node.remember_tree()
    for pid in [node.process.pid, *node.remaining()]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    node.process.wait(timeout=5)
    rundir.sweep_stale()  # what the next launch on the machine would do: nobody was left to remove it


async def wait_code(node: Server, timeout_s: float, dep: Deployment) -> int:
    """The node's exit code; fails the test (with every log) if it is still running at the deadline."""
    try:
        return await anyio.to_thread.run_sync(lambda: node.process.wait(timeout=timeout_s))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{node.args} did not exit within {timeout_s} s\n{dep.logs()}")


async def stream_completion(http: httpx.AsyncClient, started: anyio.Event, out: list[tuple[object, ...]],
                            **body: object) -> None:
    """A streamed completion (``body`` overrides the defaults): appends ("done", chunks, finish_reason) or
    ("error", status or error object or transport error); ``started`` is set at the first chunk or the end."""
    chunks = 0
    finish = None
    payload = {"model": MODEL, "prompt": "tell me a long story", "max_tokens": LONG, "ignore_eos": True,
               "stream": True, **body}
    try:
        async with http.stream("POST", "/v1/completions", json=payload) as r:
            if r.status_code != 200:
                out.append(("error", r.status_code))
                started.set()
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    out.append(("error", data["error"]))
                    started.set()
                    return
                chunks += 1
                started.set()
                finish = data["choices"][0].get("finish_reason") or finish
    except httpx.HTTPError as exc:
        out.append(("error", repr(exc)))
        started.set()
        return
    out.append(("done", chunks, finish))


async def wait_server_info(http: httpx.AsyncClient, dep: Deployment, what: str, want: list[str],
                           timeout_s: float) -> dict:
    """Poll ``http``'s /server_info until the states of its ``what`` (``managed_ranks``, or ``nodes`` in node
    order) are ``want``; the document then. Fails the test (with every log) at the deadline or if a node exits."""
    def states(info: dict) -> list[str]:
        rows = info[what] if what != "nodes" else sorted(info["nodes"], key=lambda n: n["node"])
        return [row["state"] for row in rows]

    info: dict = {}
    with anyio.move_on_after(timeout_s):
        while True:
            info = (await http.get("/server_info")).json()
            if states(info) == want:
                return info
            if any(n.process.poll() is not None for n in dep.nodes):
                pytest.fail(f"a node exited while waiting for {what} {want}\n{dep.logs()}")
            await anyio.sleep(0.2)
    pytest.fail(f"{what} not {want} within {timeout_s} s: {info.get(what)}\n{dep.logs()}")


# ---------------------------------------------------------------------------------------------- layouts


def internal(api_count: int) -> tuple[NodeSpec, ...]:
    """Head with ranks 0-1 and the API servers, a headless node with ranks 2-3."""
    return (head("-dp", "4", "-dpl", "2", "--api-server-count", str(api_count)),
            headless("-dp", "4", "-dpl", "2", "-dpr", "2"))


def api_only(api_count: int) -> tuple[NodeSpec, ...]:
    """An API-only head (no engine) and a headless node with both ranks."""
    return (head("-dp", "2", "-dpl", "0", "--api-server-count", str(api_count)),
            headless("-dp", "2", "-dpl", "2"))


def by_node_rank(api_count: int) -> tuple[NodeSpec, ...]:
    """The internal layout by node index: ``--nnodes 2 --node-rank 0|1``."""
    return (head("-dp", "4", "--nnodes", "2", "--node-rank", "0", "--api-server-count", str(api_count)),
            headless("-dp", "4", "--nnodes", "2", "--node-rank", "1"))


def hybrid(api_count: int) -> tuple[NodeSpec, ...]:
    """Two hybrid-LB nodes, each balancing over its own two ranks behind its own port."""
    common = ("-dp", "4", "-dpl", "2", "--data-parallel-hybrid-lb", "--api-server-count", str(api_count))
    return (head(*common, "-dpr", "0", name="head"), head(*common, "-dpr", "2", name="node1"))


LAYOUTS = {"internal": internal, "api_only": api_only, "by_node_rank": by_node_rank, "hybrid": hybrid}
