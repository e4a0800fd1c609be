"""``asyncdp route`` as a process without any endpoint up: it starts, says so, answers 503, stops with exit 0; and
a port already in use is one log line and exit status 1."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.e2e.conftest import ROOT
from tests.router.route_process import route


def dead_endpoint() -> str:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_with_no_endpoint_up_health_and_requests_are_503_and_sigterm_exits_0(tmp_path: Path) -> None:
    url = dead_endpoint()
    with route(tmp_path / "router.log", url) as router:
        with httpx.Client(base_url=router.base_url, timeout=10) as http:
            health = http.get("/health")
            r = http.post("/v1/completions", json={"model": "m", "prompt": "x"})
        assert health.status_code == 503 and health.json()["endpoints"][0]["url"] == url
        assert r.status_code == 503 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert "no endpoint is usable" in r.json()["error"]["message"]
        assert router.stop() == 0
        log = router.log()
    assert f"endpoint {url} is not used: GET /load failed: ConnectError" in log and "(0 usable now)" in log
    assert "Traceback" not in log


def test_a_port_in_use_is_one_error_line_and_exit_status_1() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "asyncdp", "route", "--endpoint", dead_endpoint(), "--host",
                               "127.0.0.1", "--port", str(port)], capture_output=True, text=True, timeout=30,
                              cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and f"cannot listen on 127.0.0.1 port {port}: Address already in use" in lines[0]
