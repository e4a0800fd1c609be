"""End to end, dp=2 behind two API processes: the vLLM series a vLLM dashboard reads beyond the latency histograms,
against a counted workload.

The series: ``vllm:request_params_n`` and ``vllm:request_max_num_generation_tokens`` (once per prompt, when its
last sequence finishes), ``vllm:request_params_max_tokens`` (once per sequence), ``vllm:iteration_tokens_total``
(one observation per engine step's output to an API process: its sum is the prompt and generated tokens) and the
``finished_reason="error"`` series of ``vllm:request_success_total``.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import MODEL, serve
from tests.e2e.metrics_text import per_engine, read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


def total(text: str, name: str, **match: str) -> float:
    return sum(per_engine(text, name, **match).values())


async def test_request_parameters_and_iteration_tokens_match_a_counted_workload(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2") as server:
        with anyio.fail_after(60):
            before = await read_metrics(server.base_url)
            for engine in ("0", "1"):
                assert per_engine(before, "vllm:request_success_total", finished_reason="error")[engine] == 0
                for name in ("vllm:request_params_n_count", "vllm:request_params_max_tokens_count",
                             "vllm:request_max_num_generation_tokens_count", "vllm:iteration_tokens_total_count"):
                    assert per_engine(before, name)[engine] == 0, name
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                one = await http.post("/v1/completions", json={
                    "model": MODEL, "prompt": "one", "max_tokens": 5, "ignore_eos": True})
                three = await http.post("/v1/completions", json={
                    "model": MODEL, "prompt": "three", "n": 3, "max_tokens": 7, "ignore_eos": True})
                # no max_tokens: the limit is the room left in the context (--max-model-len 512), as vLLM resolves it
                unbounded = await http.post("/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": "fill " * 96}], "ignore_eos": True})
            for r in (one, three, unbounded):
                assert r.status_code == 200, r.text
            room = 512 - unbounded.json()["usage"]["prompt_tokens"]
            assert unbounded.json()["usage"]["completion_tokens"] == room
            with anyio.fail_after(10):
                while True:  # counters are summed over both API processes; poll until the last one is in
                    after = await read_metrics(server.base_url)
                    if total(after, "vllm:request_params_n_count") - total(before, "vllm:request_params_n_count") == 3:
                        break
                    await anyio.sleep(0.1)

            def grew(name: str) -> float:
                return total(after, name) - total(before, name)

            assert grew("vllm:request_params_n_count") == 3  # one per prompt
            assert grew("vllm:request_params_n_sum") == 1 + 3 + 1
            assert grew("vllm:request_max_num_generation_tokens_sum") == 5 + 7 + room  # n=3: the longest, once
            assert grew("vllm:request_params_max_tokens_count") == 1 + 3 + 1  # one per sequence
            assert grew("vllm:request_params_max_tokens_sum") == 5 + 3 * 7 + room
            assert grew("vllm:iteration_tokens_total_sum") == \
                grew("vllm:prompt_tokens_total") + grew("vllm:generation_tokens_total")
            assert grew("vllm:iteration_tokens_total_count") >= room  # at least one step per token of the longest
