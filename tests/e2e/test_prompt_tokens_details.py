"""End to end, dp=2 behind two API processes with ``--enable-prompt-tokens-details``: the official ``openai`` client
reads ``usage.prompt_tokens_details.cached_tokens`` from the real engines' prefix caches.

Every request is pinned to one rank (``X-data-parallel-rank``), so a prompt sent twice finds the blocks its first
run computed, whichever API process takes each request. The engines cache whole 16-token blocks and leave one
prompt token to compute, so a repeated prompt of P tokens reports ``(P - 1) // 16 * 16`` cached tokens. A ``cache_salt`` confines the hits to the
prompts sent under the same salt.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio
import openai
import pytest

from tests.e2e.conftest import MODEL, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

BLOCK = 16


def text(tag: str) -> str:
    """A prompt of about 100 tokens that no other prompt of the test begins like."""
    return f"{tag} {uuid.uuid4().hex} " + "the quick brown fox jumps over the lazy dog " * 10


def hit_of(prompt_tokens: int) -> int:
    return (prompt_tokens - 1) // BLOCK * BLOCK


async def test_repeated_prompts_report_their_cached_prefix(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2", "--enable-prompt-tokens-details") as server:
        with anyio.fail_after(90):
            async with server.openai() as client:
                for rank in ("0", "1"):
                    pin = {"X-data-parallel-rank": rank}
                    # completions, not streamed: 0 on the first run (reported, not left out), then the prefix
                    prompt = text(f"rank {rank}")
                    first = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=3,
                                                            extra_headers=pin)
                    second = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=3,
                                                             extra_headers=pin)
                    assert first.usage is not None and first.usage.prompt_tokens_details is not None
                    assert first.usage.prompt_tokens_details.cached_tokens == 0
                    assert second.usage is not None and second.usage.prompt_tokens_details is not None
                    expected = hit_of(second.usage.prompt_tokens)
                    assert expected >= 5 * BLOCK
                    assert second.usage.prompt_tokens_details.cached_tokens == expected

                    # n = 3 on that cached prompt: the prompt's hit once, not once per sample
                    three = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, n=3,
                                                            extra_headers=pin)
                    assert three.usage is not None and three.usage.prompt_tokens_details is not None
                    assert three.usage.prompt_tokens_details.cached_tokens == expected

                    # several prompts: the sum of their hits (a new prompt adds 0)
                    fresh = text(f"fresh {rank}")
                    both = await client.completions.create(model=MODEL, prompt=[prompt, fresh], max_tokens=2,
                                                           extra_headers=pin)
                    assert both.usage is not None and both.usage.prompt_tokens_details is not None
                    assert both.usage.prompt_tokens_details.cached_tokens == expected

                    # chat, streamed: the final usage chunk carries it
                    messages = [{"role": "user", "content": text(f"chat {rank}")}]
                    await client.chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                                         max_tokens=2, extra_headers=pin)
                    stream = await client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=2, stream=True,  # type: ignore[arg-type]
                        stream_options={"include_usage": True}, extra_headers=pin)
                    chunks = [chunk async for chunk in stream]
                    usage = chunks[-1].usage
                    assert chunks[-1].choices == [] and usage is not None
                    assert usage.prompt_tokens_details is not None
                    assert usage.prompt_tokens_details.cached_tokens == hit_of(usage.prompt_tokens) > 0



async def test_a_cache_salt_isolates_the_cached_prefix(tmp_path: Path) -> None:
    """vLLM's ``cache_salt``: a prompt repeated under the same salt hits the real engine's prefix cache; under
    another salt, or without one, it hits nothing of the salted runs (and they nothing of the unsalted one)."""
    with serve(tmp_path, "--enable-prompt-tokens-details") as server:
        with anyio.fail_after(60):
            async with server.openai() as client:
                prompt = text("salted")
                cached, prompt_tokens = [], 0
                for salt in ("tenant-a", "tenant-a", "tenant-b", None, "tenant-b", None):
                    res = await client.completions.create(
                        model=MODEL, prompt=prompt, max_tokens=2,
                        extra_body={"cache_salt": salt} if salt is not None else None)
                    assert res.usage is not None and res.usage.prompt_tokens_details is not None
                    cached.append(res.usage.prompt_tokens_details.cached_tokens)
                    prompt_tokens = res.usage.prompt_tokens
                expected = hit_of(prompt_tokens)
                assert expected >= 5 * BLOCK
                assert cached == [0, expected, 0, 0, expected, expected]
                messages = [{"role": "user", "content": text("salted chat")}]
                hits = []
                for salt in ("s", "t", "s"):
                    chat = await client.chat.completions.create(
                        model=MODEL, messages=messages, max_tokens=2,  # type: ignore[arg-type]
                        extra_body={"cache_salt": salt})
                    assert chat.usage is not None and chat.usage.prompt_tokens_details is not None
                    hits.append(chat.usage.prompt_tokens_details.cached_tokens)
                    prompt_tokens = chat.usage.prompt_tokens
                assert hits[:2] == [0, 0] and hits[2] == hit_of(prompt_tokens) > 0
                with pytest.raises(openai.BadRequestError) as err:
                    await client.completions.create(model=MODEL, prompt="x", extra_body={"cache_salt": ""})
                assert "cache_salt" in str(err.value)
