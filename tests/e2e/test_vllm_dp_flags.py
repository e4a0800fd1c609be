"""A vLLM DP command line carries over: ``asyncdp serve builtin:tiny-dense -dp 2`` with the flags vLLM's own DP
end-to-end tests start their servers with (tests/v1/distributed/test_internal_lb_dp.py: ``--dtype bfloat16
--max-model-len 2048 --max-num-seqs 128 --enforce-eager``; float32 here, the CPU's dtype) and a few more common
ones, serves completions to the official ``openai`` client, and the honoured flags take effect in every API-server
process (docs/reference/cli.md, "vLLM flags that carry over")."""

from __future__ import annotations

from pathlib import Path

import anyio
import openai
import pytest

from tests.e2e.conftest import MODEL, serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

VLLM_DP_TEST_FLAGS = ("--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "128", "--enforce-eager")
MORE_VLLM_FLAGS = ("--gpu-memory-utilization", "0.9", "--trust-remote-code", "--enable-chunked-prefill",
                   "--disable-log-stats", "--swap-space", "4", "--kv-cache-dtype", "auto", "--load-format", "auto",
                   "--distributed-executor-backend", "mp", "--max-logprobs", "3", "--enable-log-requests",
                   "--max-log-len", "4", "--uvicorn-log-level", "debug", "--generation-config", "vllm")


async def test_a_vllm_dp_command_line_serves_completions_with_its_flags_in_effect(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "2", *VLLM_DP_TEST_FLAGS, *MORE_VLLM_FLAGS) as server:
        with anyio.fail_after(60):
            async with server.openai() as client:
                r = await client.completions.create(model=MODEL, prompt="Hello, my name is", max_tokens=5,
                                                    temperature=1.0, logprobs=3)
                with pytest.raises(openai.BadRequestError) as refused:
                    await client.completions.create(model=MODEL, prompt="Hello", max_tokens=1, logprobs=4)
        log = server.log()
    choice = r.choices[0]
    assert choice.finish_reason in ("length", "stop") and len(choice.text) >= 1
    assert r.usage is not None and r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert choice.logprobs is not None and choice.logprobs.top_logprobs  # (3, and the sampled token where not in them)
    assert all(3 <= len(top) <= 4 for top in choice.logprobs.top_logprobs)
    assert "greater than max allowed: 3" in refused.value.message  # --max-logprobs
    received = [line for line in log.splitlines() if "Received request cmpl-" in line]  # --enable-log-requests
    assert len(received) == 1 and all(line.endswith("].") for line in received), received  # (not the refused one)
    assert all(len(line.rsplit("prompt_token_ids: [", 1)[1].split(",")) <= 4 for line in received)  # --max-log-len
    assert log.count("asyncdp.http: Running on") == 2  # --uvicorn-log-level debug, in both API-server processes
