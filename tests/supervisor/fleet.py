"""A real supervisor process over mock children (:mod:`mock_child`), on 127.0.0.1, for the lifecycle tests.

:func:`start_fleet` picks free ports (bound on port 0 together and closed right before the launch; a launch that
loses that race, "cannot listen" / "Address already in use" in the log before every child listens, is retried
once on fresh ports), writes the spec for :mod:`mock_supervisor` and starts it in a new session with its output
(and, inherited, its children's) in ``supervisor.log``. Waits are polls with a deadline; the poll interval is a
bounded ``Popen.wait`` that returns early when the supervisor exits. The fixture in ``conftest.py`` kills
whatever is left after a test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
POLL_S = 0.1
# The acceptance settings of spec §11.3.
PROBE = {"probe_interval_s": 1.0, "probe_timeout_s": 1.0, "probe_failure_threshold": 3}


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def proc_state(pid: int) -> str | None:
    """The state letter of a process (``Z`` for a zombie), or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()[0]


def is_alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z")


@dataclass
class ChildSpec:
    name: str
    status: int = 200
    drain_s: float = 0.0
    exit_code: int = 0
    grandchild: bool = False


@dataclass
class Fleet:
    dir: Path
    specs: list[ChildSpec]
    settings: dict[str, Any]
    certfile: str | None = None
    keyfile: str | None = None
    ports: list[int] = field(default_factory=list)
    supervisor_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    seen: set[int] = field(default_factory=set)  # every pid the fleet ever had (children and grandchildren)

    @property
    def state(self) -> Path:
        return self.dir / "state"

    @property
    def log_path(self) -> Path:
        return self.dir / "supervisor.log"

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert self.process is not None
        return self.process

    @property
    def scheme(self) -> str:
        return "https" if self.certfile else "http"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def launch(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        for f in self.state.iterdir():
            f.unlink()
        *self.ports, self.supervisor_port = free_ports(len(self.specs) + 1)
        self.supervisor_port = int(self.settings.get("supervisor_port", self.supervisor_port))
        children = []
        for rank, (spec, port) in enumerate(zip(self.specs, self.ports, strict=True)):
            argv = [sys.executable, str(HERE / "mock_child.py"), "--port", str(port), "--state-dir",
                    str(self.state), "--name", spec.name, "--status", str(spec.status), "--drain-s",
                    str(spec.drain_s), "--exit-code", str(spec.exit_code)]
            if self.certfile:
                argv += ["--certfile", self.certfile, "--keyfile", str(self.keyfile)]
            if spec.grandchild:
                argv.append("--grandchild")
            children.append({"dp_rank": rank, "port": port, "argv": argv,
                             "env": {"ASYNCDP_SUPERVISED_RANK": str(rank)}})
        settings = {"host": "127.0.0.1", "supervisor_port": self.supervisor_port, **PROBE,
                    "ssl_certfile": self.certfile, "ssl_keyfile": self.keyfile, **self.settings}
        spec_path = self.dir / "spec.json"
        spec_path.write_text(json.dumps({"children": children, "settings": settings}))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, str(HERE / "mock_supervisor.py"), str(spec_path)],
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True, env=env, cwd=ROOT)

    # ------------------------------------------------------------ waits

    def wait_for(self, what: str, cond: Callable[[], bool], timeout_s: float) -> float:
        """Poll ``cond`` until true; returns when (``time.monotonic()``). Fails the test at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            if cond():
                return time.monotonic()
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout_s} s\n{self.log()[-4000:]}")
            try:
                self.proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the supervisor did not exit within {timeout_s} s\n{self.log()[-4000:]}") from None

    def child_info(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.state / f"{name}.pid").read_text())
        except (OSError, ValueError):
            return None

    def all_listening(self) -> bool:
        infos = [self.child_info(s.name) for s in self.specs]
        for info in infos:
            if info is not None:
                self.seen.update(p for p in (info["pid"], info["grandchild"]) if p)
        return all(infos)

    def wait_children_listening(self, timeout_s: float = 20.0) -> None:
        self.wait_for("every mock child listens", lambda: self.all_listening() or self.proc.poll() is not None,
                      timeout_s)
        assert self.all_listening(), f"the supervisor exited first\n{self.log()[-4000:]}"

    def pid(self, name: str) -> int:
        info = self.child_info(name)
        assert info is not None
        return int(info["pid"])

    def alive(self) -> list[int]:
        """Every pid of the fleet still alive (zombies count as gone)."""
        self.all_listening()
        return sorted(p for p in self.seen if is_alive(p))

    def wait_all_gone(self, timeout_s: float) -> None:
        self.wait_for("every child gone", lambda: not self.alive(), timeout_s)

    # ------------------------------------------------------------ steering the mock children

    def set_health(self, name: str, status: int) -> None:
        tmp = self.state / f"{name}.health.tmp"
        tmp.write_text(str(status))
        tmp.rename(self.state / f"{name}.health")

    def probes(self, name: str) -> int:
        try:
            return len((self.state / f"{name}.probes").read_text().splitlines())
        except OSError:
            return 0

    def wait_probed(self, name: str, more: int, timeout_s: float = 10.0) -> None:
        """Wait until ``name`` has been probed ``more`` more times than now: that many rounds went by."""
        target = self.probes(name) + more
        self.wait_for(f"{more} more probes of {name}", lambda: self.probes(name) >= target, timeout_s)

    def marker(self, name: str, kind: str) -> str | None:
        try:
            return (self.state / f"{name}.{kind}").read_text()
        except OSError:
            return None

    # ------------------------------------------------------------ the supervisor's endpoints

    def get(self, path: str = "/health") -> int | None:
        """The supervisor's answer to ``GET path``; None when the connection is refused, -1 when it broke
        (reset, timed out) without an answer."""
        with httpx.Client(verify=False, timeout=2.0) as http:
            try:
                return http.get(f"{self.scheme}://127.0.0.1:{self.supervisor_port}{path}").status_code
            except httpx.ConnectError:
                return None
            except httpx.TransportError:
                return -1

    def signal(self, sig: signal.Signals) -> float:
        self.proc.send_signal(sig)
        return time.monotonic()

    def kill_everything(self) -> None:
        pids = ([self.proc.pid] if self.process is not None and self.proc.poll() is None else []) + self.alive()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


_RACE_SIGNS = ("Address already in use", "cannot listen on")


def start_fleet(fleet: Fleet, *, expect_listening: bool = True) -> Fleet:
    """Launch ``fleet``; with ``expect_listening``, wait until every child listens (one retry on fresh ports when
    the launch lost a port race)."""
    fleet.launch()
    if not expect_listening:
        return fleet
    for attempt in range(2):
        fleet.wait_for("every mock child listens, or the supervisor exits",
                       lambda: fleet.all_listening() or fleet.proc.poll() is not None, 20.0)
        if fleet.all_listening():
            return fleet
        if attempt == 0 and any(sign in fleet.log() for sign in _RACE_SIGNS):
            fleet.kill_everything()
            fleet.launch()
            continue
        break
    raise AssertionError(f"the supervisor exited before every child listened\n{fleet.log()[-4000:]}")
