"""``asyncdp serve`` with an API key from the environment (``ASYNCDP_API_KEY``), dp=2 behind two API processes:
the official ``openai`` client gets answers with the key and ``AuthenticationError`` without it on both API
processes, the probes stay open, and the key shows in no log line, no ``/server_info`` and no process's command
line."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

KEY = "sk-e2e-7f3a9c1d5b"


async def test_a_deployment_with_a_key_from_the_environment_serves_only_clients_that_send_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCDP_API_KEY", KEY)
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2") as server:
        with anyio.fail_after(60):
            for _ in range(4):  # fresh clients, fresh connections: both API processes answer
                async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0) as ok:
                    r = await ok.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
                    assert r.choices[0].finish_reason in ("length", "stop")
                async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="wrong",
                                              max_retries=0) as bad:
                    with pytest.raises(openai.AuthenticationError):
                        await bad.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
                    with pytest.raises(openai.AuthenticationError):
                        await bad.models.list()
            async with httpx.AsyncClient(base_url=server.base_url, timeout=10.0) as http:
                assert (await http.get("/health")).status_code == 200
                assert (await http.get("/metrics")).status_code == 200
                assert (await http.get("/server_info")).status_code == 401
                info = await http.get("/server_info", headers={"Authorization": f"Bearer {KEY}"})
                assert info.status_code == 200 and KEY not in info.text
        assert len(server.known) >= 5, server.known  # coordinator, two API servers, two engines
        assert not [pid for pid, line in _command_lines(server.known) if KEY.encode() in line]
        server.stop()
    assert KEY not in server.log()


def _command_lines(pids: dict[int, int]) -> list[tuple[int, bytes]]:
    out = []
    for pid in pids:
        try:
            out.append((pid, Path(f"/proc/{pid}/cmdline").read_bytes()))
        except FileNotFoundError:  # it ended meanwhile
            pass
    return out
