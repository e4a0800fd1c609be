"""SIGTERM while the deployment is still starting, with each API server in the middle of loading its tokenizer
(importing transformers, seconds): the servers used to wait for that load before they could stop, outlived the
launcher's 5 s stop deadline, were killed, and a user's Ctrl-C on a starting server ended in exit 1 with
'did not exit within 5.0 s; killing' and 'stopped after a failure'."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import pytest

from tests.e2e.conftest import BASE_ARGS, _launch, descendants

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


def _api_servers_loading_torch(root: int) -> int:
    """How many of ``root``'s API-server children have torch mapped: the tokenizer load imports transformers,
    which imports torch, and nothing else an API server does before it serves."""
    count = 0
    for pid in descendants(root):
        try:
            if b"asyncdp-api-" in Path(f"/proc/{pid}/cmdline").read_bytes() and \
                    "libtorch" in Path(f"/proc/{pid}/maps").read_text():
                count += 1
        except OSError:  # it ended meanwhile
            pass
    return count


async def test_sigterm_while_the_api_servers_load_their_tokenizer_stops_in_order_with_exit_0(tmp_path: Path) -> None:
    server = _launch((*BASE_ARGS, "-dp", "2", "--api-server-count", "2"), tmp_path / "early.log")
    try:
        with anyio.fail_after(60):
            while await anyio.to_thread.run_sync(_api_servers_loading_torch, server.process.pid) < 2:
                assert server.process.poll() is None, server.log()[-3000:]
                assert "serving builtin" not in server.log(), "ready before the signal: no stop during startup"
                await anyio.sleep(0.02)
        server.remember_tree()
        server.process.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(lambda: server.process.wait(timeout=30))
        log = server.log()
        assert code == 0, log[-4000:]
        assert "did not exit within" not in log and "stopped after a failure" not in log, log[-4000:]
        assert "Traceback" not in log, log[-4000:]
        assert not server.wait_gone(), log[-4000:]
    finally:
        if server.process.poll() is None or server.remaining():
            server.kill_all()
