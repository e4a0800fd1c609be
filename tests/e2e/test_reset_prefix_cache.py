"""End to end, dp=2 behind two API processes in dev mode (``VLLM_SERVER_DEV_MODE=1``): a repeated long prompt hits
the real engines' prefix caches on both ranks, ``POST /reset_prefix_cache`` (to whichever API process takes it)
drops both, and the same prompt then hits nothing on either rank; vLLM's prefix-cache counters keep counting."""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import MODEL, serve
from tests.e2e.metrics_text import per_engine, read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

BLOCK = 16


async def cached(client, prompt: str, rank: str) -> tuple[int, int]:
    """(cached tokens, prompt tokens) of one completion of ``prompt`` pinned to ``rank``."""
    res = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=2,
                                          extra_headers={"X-data-parallel-rank": rank})
    assert res.usage is not None and res.usage.prompt_tokens_details is not None
    return res.usage.prompt_tokens_details.cached_tokens, res.usage.prompt_tokens


async def test_after_a_reset_a_repeated_prompt_hits_nothing_on_either_rank(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # (the launcher's environment, read at its start)
    prompt = f"reset {uuid.uuid4().hex} " + "the quick brown fox jumps over the lazy dog " * 10
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--enable-prompt-tokens-details",
               "--lb-policy", "asyncdp") as server:
        with anyio.fail_after(90):
            async with server.openai() as client, httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                for rank in ("0", "1"):
                    assert (await cached(client, prompt, rank))[0] == 0
                    hit, prompt_tokens = await cached(client, prompt, rank)
                    assert hit == (prompt_tokens - 1) // BLOCK * BLOCK >= 5 * BLOCK
                before = per_engine(await read_metrics(server.base_url), "vllm:prefix_cache_hits_total")
                r = await http.post("/reset_prefix_cache")
                assert r.status_code == 200 and r.json() == {"success": True}
                for rank in ("0", "1"):
                    assert (await cached(client, prompt, rank))[0] == 0
                after = per_engine(await read_metrics(server.base_url), "vllm:prefix_cache_hits_total")
    # cumulative, as vLLM's: the reset takes nothing off them
    assert set(before) == set(after) == {"0", "1"} and all(after[e] >= before[e] > 0 for e in before)
