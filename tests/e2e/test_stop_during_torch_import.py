"""SIGTERM while every engine is still importing torch (seconds, before it builds its model): the engines imported
torch on their event loop (setting torch's thread count), so none of them saw the launcher's stop until the import
was done, and an import slower than the launcher's 5 s stop deadline ended a user's Ctrl-C on a starting server in
'did not exit within 5.0 s; killing' and exit 1.

The engines import a stand-in torch (``tests/e2e/stalled_imports``) whose import never ends and says when it began,
so the stop comes, for certain, while each engine is inside the import, however slow or fast the machine is."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from tests.e2e.conftest import BASE_ARGS, _launch

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

STALLED_IMPORTS = Path(__file__).resolve().parent / "stalled_imports"
DEPLOYMENTS = {
    "dense": ("builtin:tiny-dense", ("-dp", "2", "--api-server-count", "1")),
    "moe": ("builtin:tiny-moe", ("-dp", "2", "--enable-expert-parallel", "--api-server-count", "1")),
}


@pytest.mark.parametrize("kind", list(DEPLOYMENTS))
async def test_sigterm_while_the_engines_import_torch_stops_in_order_with_exit_0(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, args = DEPLOYMENTS[kind]
    importing = tmp_path / "importing-torch"
    importing.mkdir()
    monkeypatch.setenv("ASYNCDP_TEST_STALLED_IMPORT", "torch:asyncdp-engine")
    monkeypatch.setenv("ASYNCDP_TEST_STALLED_DIR", str(importing))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(STALLED_IMPORTS), os.environ.get("PYTHONPATH")])))
    server = _launch((*BASE_ARGS, *args), tmp_path / "stop.log", model)
    try:
        with anyio.fail_after(60):
            while len(list(importing.iterdir())) < 2:  # both engines are inside `import torch`
                assert server.process.poll() is None, server.log()[-3000:]
                await anyio.sleep(0.02)
        server.remember_tree()
        server.process.send_signal(signal.SIGTERM)
        code = await anyio.to_thread.run_sync(lambda: server.process.wait(timeout=30))
        log = server.log()
        assert "did not exit within" not in log and "killed before they exited" not in log, log[-4000:]
        assert code == 0, log[-4000:]
        assert "Traceback" not in log, log[-4000:]
        assert not server.wait_gone(), log[-4000:]
    finally:
        if server.process.poll() is None or server.remaining():
            server.kill_all()
