"""The e2e harness yields a deployment only once the server answering on its port is that deployment.

:func:`tests.e2e.conftest.serve` used to accept a 200 from ``/health`` from whatever listened on the port. When a
launch lost its port to another program between the harness's port-0 pick and the launcher's bind, the test then
talked to that program (here a plain HTTP server answering 200 to everything, as another deployment would), while
the launcher itself had exited with "cannot listen". Now the harness asks ``/server_info`` which process answered
(``api_process_pid``) and waits for its own launch; the lost race is retried on a fresh port as before.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.e2e import conftest
from tests.e2e.conftest import serve

pytestmark = [pytest.mark.e2e]


class _Stranger(BaseHTTPRequestHandler):
    """Another server: 200 to every GET, and a ``/server_info`` naming a process that is not the launch's."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = json.dumps({"api_process_pid": os.getpid()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


@pytest.fixture
def stranger() -> Iterator[int]:
    """The port of a plain HTTP server that answers like a healthy deployment."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Stranger)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_a_launch_whose_port_another_server_answers_on_is_not_yielded(tmp_path, monkeypatch, stranger):
    picks, real_free_port = [stranger], conftest.free_port
    # The first launch is handed the stranger's port, as when it loses the race for it; the retry a free one.
    monkeypatch.setattr(conftest, "free_port", lambda: picks.pop() if picks else real_free_port())
    with serve(tmp_path) as server:
        assert server.port != stranger, "the harness yielded the port another server answers on"
        info = httpx.get(f"{server.base_url}/server_info", timeout=5).json()
        assert info["api_process_pid"] == server.process.pid  # one API server: the launcher's own
        assert f"cannot listen on 127.0.0.1:{stranger}: Address already in use" in server.log()
