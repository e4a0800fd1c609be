"""End to end: an API-only head kept alive (``ASYNCDP_KEEP_ALIVE_ON_ENGINE_DEATH=1``) loses its only headless
node, answers 503 meanwhile, and serves again once the node restarted with the same flags takes the ranks back.

Before, the coordinator stopped once every rank was lost, so the restarted node's engines could not reach it: they
failed their startup with a traceback, the node exited 1, and the head answered 503 for ever."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from tests.e2e.conftest import MODEL
from tests.e2e.multinode import deployment, head, headless, kill_tree, launch_node, wait_server_info

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

HEAD = head("-dp", "2", "-dpl", "0")
NODE = headless("-dp", "2", "-dpl", "2")


async def test_an_api_only_head_kept_alive_serves_again_once_its_only_node_is_restarted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCDP_KEEP_ALIVE_ON_ENGINE_DEATH", "1")
    with deployment(tmp_path, HEAD, NODE, ready_timeout_s=120) as dep:
        hd = dep.node("head")
        async with httpx.AsyncClient(base_url=hd.base_url, timeout=30.0) as http:
            kill_tree(dep.node("headless"))
            dep.drop("headless")
            await wait_server_info(http, dep, "managed_ranks", ["dead", "dead"], 15)
            gone = await http.post("/v1/completions", json={"model": MODEL, "prompt": "anyone?", "max_tokens": 3})
            assert gone.status_code == 503 and "no data-parallel rank can serve" in gone.text, gone.text
            assert (await http.get("/health")).status_code == 503
            started = time.monotonic()
            again = launch_node(NODE, dep.rpc, tmp_path / "headless-again.log", dep.model)
            dep.nodes.append(again)  # stopped with the head at the end, and checked the same way
            dep.specs.append(NODE)
            await wait_server_info(http, dep, "managed_ranks", ["ready", "ready"], 90)
            took_s = time.monotonic() - started
            assert (await http.get("/health")).status_code == 200
        client = AsyncOpenAI(base_url=f"{hd.base_url}/v1", api_key="none", max_retries=0)
        for i in range(4):
            out = await client.completions.create(model=MODEL, prompt=f"back {i}", max_tokens=4)
            assert out.choices[0].finish_reason in ("length", "stop") and out.usage is not None
        await client.close()
        log = hd.log()
        assert "the coordinator serves on" in log and "joined again" in log, dep.logs()
        assert "ranks 0..1 leave the balancer, no rank is left to serve" in log, dep.logs()
        assert "Traceback" not in again.log(), again.log()[-4000:]
        print(f"\napi-only rejoin: both ranks ready {took_s:.1f} s after the new headless node started")
        dep.stop()
