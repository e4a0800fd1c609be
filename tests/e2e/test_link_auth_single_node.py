"""End to end, one node: ``asyncdp serve builtin:tiny-dense -dp 2`` draws a secret of its own, so a stranger that
connects to any of its links (the handshake listener, each API server's engine listener, the coordinator's two)
and sends a well-formed first frame is told the link needs the secret and is closed, with one warning naming it;
the deployment goes on serving the official ``openai`` client on both ranks, and stops cleanly."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, serve
from tests.e2e.link_auth import frames_in, poke, run_sockets, valid_looking_first_frame

pytestmark = [pytest.mark.e2e]


def completions_work(base_url: str, n: int) -> None:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=30) as client:
        for _ in range(n):
            r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
            assert r.choices[0].finish_reason in ("length", "stop")


def test_a_stranger_on_any_link_of_a_one_node_deployment_is_closed_and_the_deployment_serves_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_root = Path(tempfile.mkdtemp(prefix="adp-", dir="/tmp"))  # short: a Unix socket's path has 107 bytes
    monkeypatch.setenv("TMPDIR", str(run_root))  # the deployment's run directory, and its sockets, go there
    try:
        with serve(tmp_path, "-dp", "2", "--api-server-count", "2") as server:
            completions_work(server.base_url, 2)
            sockets = run_sockets(run_root)
            names = " ".join(p.name for p in sockets)
            assert len(sockets) == 5 and "handshake" in names and "coord-engine" in names, names
            for path in sockets:
                answer, closed = poke(str(path), valid_looking_first_frame(path.name))
                assert closed, f"{path.name}: a stranger's link stayed open\n{server.log()[-3000:]}"
                (told,) = frames_in(answer)
                assert "ASYNCDP_DP_SECRET" in getattr(told, "reason", ""), (path.name, told)
            completions_work(server.base_url, 4)
            info = httpx.get(f"{server.base_url}/server_info", timeout=10).json()
            assert [r["state"] for r in info["managed_ranks"]] == ["ready", "ready"]
            server.stop()
        refused = [line for line in server.log().splitlines()
                   if "WARNING" in line and "refused a link from a local process" in line]
        assert len(refused) == len(sockets), "\n".join(refused)
    finally:
        shutil.rmtree(run_root, ignore_errors=True)
