"""An orderly stop of a TLS deployment (asyncio, the default backend) while clients hold idle keep-alive
connections, as connection pools and load balancers do: closing each waited up to 30 s for the client's TLS
close_notify, which an idle client never sends, so the API servers outlived the drain deadline, were killed,
and the launcher exited 1 with a traceback."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import MODEL, serve
from tests.e2e.tls import self_signed_cert

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


async def test_sigterm_with_idle_tls_keep_alive_clients_drains_and_exits_0(tmp_path: Path) -> None:
    key, cert = await self_signed_cert(tmp_path)
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--shutdown-timeout", "5",
               "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)) as server:
        clients = [httpx.AsyncClient(base_url=server.base_url, verify=False, timeout=10.0) for _ in range(4)]
        try:
            with anyio.fail_after(30):
                for client in clients:  # each keeps its connection open, idle, after its answer
                    r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
                    assert r.status_code == 200, r.text
            took = await anyio.to_thread.run_sync(server.stop)  # exit 0, nothing left, no traceback
        finally:
            for client in clients:
                await client.aclose()
    assert took < 5.0 + 5.0, took  # within the drain plus the launcher's margin: no API server was killed
