"""End to end: a real MoE deployment, dp=2 with expert parallelism (gloo collectives across two processes).

One module-scoped deployment of ``builtin:tiny-moe`` (``-dp 2 --enable-expert-parallel``) serves the wave,
balance, parity and pause tests, and then the rank-loss test, which ends it: that test comes last in the module (as
``dp2_single_api``'s engine kill does), and the fixture then finds the deployment gone and only checks for
leftovers. Each test before it leaves the group serving and unpaused.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import anyio
import httpx
import pytest

from asyncdp import LLM, SamplingParams
from tests.e2e.conftest import Server, serve
from tests.e2e.metrics_text import per_engine, read_metrics, successes

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MOE = "builtin:tiny-moe"
MOE_ARGS = ("-dp", "2", "--enable-expert-parallel", "--api-server-count", "1")


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp("moe"), *MOE_ARGS, model=MOE) as server:
        yield server


async def _complete(http: httpx.AsyncClient, prompt: str, **body: object) -> dict:
    r = await http.post("/v1/completions", json={"model": MOE, "prompt": prompt, **body})
    assert r.status_code == 200, r.text
    return r.json()


async def _until_running(base_url: str, num: int) -> None:
    """Until the ranks run ``num`` requests between them, by their gauge (polling another process; the caller's
    deadline bounds it): a fixed sleep instead would be too short on a loaded machine, or too long elsewhere."""
    while sum(per_engine(await read_metrics(base_url), "vllm:num_requests_running").values()) < num:  # noqa: ASYNC110
        await anyio.sleep(0.05)


async def test_100_requests_finish_balanced_and_the_group_pauses_within_5s(moe: Server) -> None:
    before = await successes(moe.base_url)
    results: list[dict] = []
    async with httpx.AsyncClient(base_url=moe.base_url, timeout=60.0) as http:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for i in range(100):
                    async def one(i: int = i) -> None:
                        results.append(await _complete(http, f"wave request {i}", max_tokens=10, ignore_eos=True))

                    tg.start_soon(one)
        done_at = time.monotonic()
    assert len(results) == 100
    assert all(r["usage"]["completion_tokens"] == 10 for r in results)
    after = await successes(moe.base_url)
    per_rank = {e: after.get(e, 0.0) - before.get(e, 0.0) for e in ("0", "1")}
    assert all(n > 100 // 3 for n in per_rank.values()), per_rank

    # Within 5 s of the last one the whole group is paused and nothing is in flight.
    with anyio.fail_after(5.0):
        while True:
            text = await read_metrics(moe.base_url)
            running = per_engine(text, "asyncdp:dp_running")
            busy = per_engine(text, "vllm:num_requests_running")
            inflight = per_engine(text, "asyncdp:dp_inflight_requests")
            if (running and not any(running.values()) and not any(busy.values())
                    and not any(inflight.values())):
                break
            await anyio.sleep(0.1)
    assert time.monotonic() - done_at < 5.0
    dummies = per_engine(text, "asyncdp:dp_dummy_steps_total")
    waves = per_engine(text, "asyncdp:dp_waves_completed_total")
    assert sum(waves.values()) >= 2, waves  # both ranks report at least one completed wave
    assert set(dummies) <= {"0", "1"}


async def test_server_info_describes_the_moe_group(moe: Server) -> None:
    async with httpx.AsyncClient(base_url=moe.base_url, timeout=10.0) as http:
        info = (await http.get("/server_info")).json()
    assert info["is_moe"] is True and info["enable_expert_parallel"] is True
    assert info["wave"] is not None and info["wave"]["current"] >= 0
    assert info["coordinator"]["state"] == "alive"
    assert [r["state"] for r in info["managed_ranks"]] == ["ready", "ready"]


async def test_greedy_output_equals_the_single_rank_output(moe: Server) -> None:
    prompts = ["The expert says", "Mixture of experts", "abc"]
    with LLM(MOE, torch_threads=1) as llm:  # dp=1, all experts in one process
        expected = [o.outputs[0].text for o in llm.generate(
            prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))]
    async with httpx.AsyncClient(base_url=moe.base_url, timeout=60.0) as http:
        for rank in (0, 1):  # pinned to each rank: both halves of the expert-parallel group agree with dp=1
            for prompt, want in zip(prompts, expected, strict=True):
                got = await _complete(http, prompt, max_tokens=12, temperature=0.0, ignore_eos=True,
                                      data_parallel_rank=rank)
                assert got["choices"][0]["text"] == want


async def test_pause_abort_ends_requests_with_abort_and_resume_serves_again(moe: Server) -> None:
    async with httpx.AsyncClient(base_url=moe.base_url, timeout=60.0) as http:
        reasons: list[str] = []

        async def long(i: int) -> None:
            body = await _complete(http, f"long {i}", max_tokens=400, ignore_eos=True)
            reasons.append(body["choices"][0]["finish_reason"])

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(long, i)
                await _until_running(moe.base_url, 4)  # every one is on a rank before the pause aborts them
                r = await http.post("/pause", params={"mode": "abort"})
                assert r.status_code == 200, r.text
            assert reasons == ["abort"] * 4
            assert (await http.get("/is_paused")).json()["is_paused"] is True
            assert (await http.post("/resume")).status_code == 200
            assert (await http.get("/is_paused")).json()["is_paused"] is False
            after = await _complete(http, "after resume", max_tokens=5, ignore_eos=True)
            assert after["choices"][0]["finish_reason"] == "length"


async def test_pause_keep_freezes_a_request_and_resume_lets_it_finish(moe: Server) -> None:
    gaps: list[float] = []
    async with httpx.AsyncClient(base_url=moe.base_url, timeout=60.0) as http:
        with anyio.fail_after(60):
            body = {"model": MOE, "prompt": "keep me", "max_tokens": 30, "ignore_eos": True, "stream": True}
            async with http.stream("POST", "/v1/completions", json=body) as stream:
                last = None
                tokens = 0
                finish = None
                async for line in stream.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    now = time.monotonic()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
                    tokens += 1
                    finish = json.loads(line[6:])["choices"][0]["finish_reason"] or finish
                    if tokens == 3:
                        async with httpx.AsyncClient(base_url=moe.base_url, timeout=30.0) as ctl:
                            assert (await ctl.post("/pause", params={"mode": "keep"})).status_code == 200
                            await anyio.sleep(2.0)
                            assert (await ctl.post("/resume")).status_code == 200
    assert finish == "length"
    assert max(gaps) >= 1.6, gaps  # the request was frozen in place across the pause, then continued


async def test_sigkill_of_one_rank_brings_the_deployment_down_within_5s(moe: Server) -> None:
    server = moe
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as http:
        info = (await http.get("/server_info")).json()
        engine1 = next(p["pid"] for p in info["processes"] if p["role"] == "engine" and p["rank"] == 1)
        statuses: list[int] = []

        async def in_flight(i: int) -> None:
            try:
                # within the model's 512-token context: a longer request is refused (400) and never runs
                r = await http.post("/v1/completions", json={"model": MOE, "prompt": f"doomed {i}",
                                                             "max_tokens": 500, "ignore_eos": True})
                statuses.append(r.status_code)
            except httpx.TransportError:
                statuses.append(-1)  # the server went away mid-request: also an error, never a hang

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(in_flight, i)
                await _until_running(server.base_url, 4)  # every one is in flight on a rank when it is killed
                server.remember_tree()
                killed_at = time.monotonic()
                os.kill(engine1, signal.SIGKILL)
        code = await anyio.to_thread.run_sync(server.process.wait, 10)
        gone_after = time.monotonic() - killed_at
    assert code == 1
    assert gone_after < 5.0, gone_after
    assert statuses and all(s != 200 for s in statuses), statuses
    assert set(statuses) <= {503, -1}, statuses  # cut off by the teardown, not refused before it
    assert not server.wait_gone(2.0)
