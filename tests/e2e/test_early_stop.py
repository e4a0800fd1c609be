"""SIGTERM while the deployment is still starting, with each API server in the middle of loading its tokenizer
(importing transformers, seconds): the servers used to wait for that load before they could stop, outlived the
launcher's 5 s stop deadline, were killed, and a user's Ctrl-C on a starting server ended in exit 1 with
'did not exit within 5.0 s; killing' and 'stopped after a failure'.

The API servers import a stand-in transformers (``tests/e2e/stalled_imports``) whose import never ends and says
when it began, so the stop comes, for certain, while each is inside its tokenizer load, however fast the load is
(a built-in's tokenizer no longer imports torch, by which the test told the load was under way before)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from tests.e2e.conftest import BASE_ARGS, _launch

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

STALLED_IMPORTS = Path(__file__).resolve().parent / "stalled_imports"


async def test_sigterm_while_the_api_servers_load_their_tokenizer_stops_in_order_with_exit_0(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loading = tmp_path / "loading-tokenizer"
    loading.mkdir()
    monkeypatch.setenv("ASYNCDP_TEST_STALLED_IMPORT", "transformers:asyncdp-api")
    monkeypatch.setenv("ASYNCDP_TEST_STALLED_DIR", str(loading))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(STALLED_IMPORTS), os.environ.get("PYTHONPATH")])))
    server = _launch((*BASE_ARGS, "-dp", "2", "--api-server-count", "2"), tmp_path / "early.log")
    try:
        with anyio.fail_after(60):
            while len(list(loading.iterdir())) < 2:  # both API servers are inside their tokenizer's import
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
