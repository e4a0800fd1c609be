"""End to end against one real dp=2 deployment with two API-server processes sharing the port (spec §10).

All tests of this module share the ``dp2`` deployment (one launcher, one coordinator, two API servers, two
engines on builtin:tiny-dense) and talk to it with the official ``openai`` client over loopback. Counters are
compared as deltas, so the tests do not depend on each other's order. Each test runs under ``fail_after``.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.conftest import MODEL, Server
from tests.e2e.metrics_text import per_engine, read_metrics, successes

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

DP_SIZE = 2
API_COUNT = 2


async def test_one_completion_reports_finish_reason_and_usage(dp2: Server) -> None:
    with anyio.fail_after(30):
        async with dp2.openai() as client:
            r = await client.completions.create(model=MODEL, prompt="Hello, my name is", max_tokens=5)
    choice = r.choices[0]
    assert choice.finish_reason in ("length", "stop")
    assert r.usage is not None and r.usage.prompt_tokens > 0
    # "length" means all 5 tokens came; "stop" (EOS) may end the completion at any of the 5
    assert r.usage.completion_tokens == 5 if choice.finish_reason == "length" else 1 <= r.usage.completion_tokens <= 5


async def test_two_bursts_of_200_all_succeed_and_balance_over_both_ranks(dp2: Server) -> None:
    """Two bursts of 200 concurrent completions succeed; every rank gets > total // (dp + 1) of them
    (the balance oracle, spec §7.5), and every API process's /metrics shows the whole node (§10)."""
    before = await successes(dp2.base_url)
    burst = 200
    with anyio.fail_after(90):
        async with dp2.openai() as client:
            for _ in range(2):
                results: list[str | None] = []

                async def one(i: int, results: list[str | None] = results) -> None:
                    r = await client.completions.create(model=MODEL, prompt=f"request number {i}", max_tokens=5)
                    results.append(r.choices[0].finish_reason)

                async with anyio.create_task_group() as tg:
                    for i in range(burst):
                        tg.start_soon(one, i)
                assert len(results) == burst
                assert set(results) <= {"length", "stop"}

    total = 2 * burst
    views = []
    for _ in range(4 * API_COUNT):  # fresh connections: the reads land on both API processes
        after = await successes(dp2.base_url)
        views.append({e: after.get(e, 0.0) - before.get(e, 0.0) for e in ("0", "1")})
    for delta in views:
        assert sum(delta.values()) == total, f"a /metrics view misses requests: {views}"
        for engine, n in delta.items():
            assert n > total // (DP_SIZE + 1), f"engine {engine} got {n} of {total}: {delta}"


@pytest.mark.parametrize("stream_first", [False, True])
async def test_temperature_zero_streamed_text_equals_non_streamed(dp2: Server, stream_first: bool) -> None:
    prompt = "The capital of France is"
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story about a cat."}]
    with anyio.fail_after(60):
        async with dp2.openai() as client:

            async def completion(stream: bool) -> str:
                if not stream:
                    r = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
                    return r.choices[0].text
                s = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0,
                                                    stream=True)
                return "".join([c.choices[0].text async for c in s if c.choices])

            async def chat(stream: bool) -> str:
                if not stream:
                    r = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20,
                                                             temperature=0)
                    return r.choices[0].message.content or ""
                s = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20,
                                                         temperature=0, stream=True)
                return "".join([c.choices[0].delta.content or "" async for c in s if c.choices])

            order = (True, False) if stream_first else (False, True)
            texts = [await completion(s) for s in order]
            chats = [await chat(s) for s in order]
    assert texts[0] and texts[0] == texts[1]
    assert chats[0] and chats[0] == chats[1]


async def test_server_info_is_answered_by_every_api_process(dp2: Server) -> None:
    """2·C² sequential GETs of /server_info on fresh connections: both API processes answer, each with count C, and the
    process table lists the whole node (spec §10 acceptance, §12.2)."""
    docs = []
    with anyio.fail_after(30):
        async with httpx.AsyncClient(base_url=dp2.base_url, timeout=5.0,
                                     limits=httpx.Limits(max_keepalive_connections=0)) as http:

            async def get() -> None:
                r = await http.get("/server_info")
                r.raise_for_status()
                docs.append(r.json())

            # One at a time: with one shared listening socket, a process that wakes up accepts every pending
            # connection, so a concurrent batch tends to land on a single process. Which process accepts is the
            # kernel's choice: 2·C² GETs usually reach both, and a few more make it certain.
            for _ in range(2 * API_COUNT**2):
                await get()
            while len({d["api_process_rank"] for d in docs}) < API_COUNT and len(docs) < 100:
                await get()
    assert {d["api_process_count"] for d in docs} == {API_COUNT}
    assert {d["api_process_rank"] for d in docs} == set(range(API_COUNT))
    assert {d["parallel_config"]["_api_process_count"] for d in docs} == {API_COUNT}
    for doc in docs:
        assert doc["dp_size"] == DP_SIZE and [r["state"] for r in doc["managed_ranks"]] == ["ready", "ready"]
        roles = sorted(p["role"] for p in doc["processes"])
        assert roles == sorted(["launcher", "api_server", "api_server", "coordinator", "engine", "engine"])
        assert all(isinstance(p["pid"], int) and p["pid"] > 0 for p in doc["processes"])
        assert sorted(p["rank"] for p in doc["processes"] if p["role"] == "engine") == [0, 1]
    assert {p["pid"] for p in docs[0]["processes"]} <= set(dp2.remaining())


@pytest.mark.parametrize("form", ["header", "body"])
async def test_rank_hint_sends_every_request_to_that_rank(dp2: Server, form: str) -> None:
    n = 12
    kwargs = ({"extra_headers": {"X-data-parallel-rank": "1"}} if form == "header"
              else {"extra_body": {"data_parallel_rank": 1}})
    before = await successes(dp2.base_url)
    with anyio.fail_after(60):
        async with dp2.openai() as client, anyio.create_task_group() as tg:

            async def one(i: int) -> None:
                await client.completions.create(model=MODEL, prompt=f"hint {i}", max_tokens=3, **kwargs)

            for i in range(n):
                tg.start_soon(one, i)
    after = await successes(dp2.base_url)
    delta = {e: after.get(e, 0.0) - before.get(e, 0.0) for e in ("0", "1")}
    assert delta == {"0": 0.0, "1": float(n)}


async def test_out_of_range_rank_hint_is_400_with_the_range(dp2: Server) -> None:
    with anyio.fail_after(30):
        async with dp2.openai() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                                extra_headers={"X-data-parallel-rank": "2"})
    assert info.value.status_code == 400
    assert "data_parallel_rank 2 is out of range [0, 2)" in str(info.value)


async def test_client_disconnect_mid_stream_frees_the_request_and_its_kv_blocks(dp2: Server) -> None:
    """A long pinned stream is dropped after a few chunks: rank 1 counts the tokens it delivered but no success
    (as vLLM: a request whose caller left is not one), and its running gauge and KV usage go back to 0 within a
    few seconds."""
    pin = {"X-data-parallel-rank": "1"}
    before = await read_metrics(dp2.base_url)
    successes_before = per_engine(before, "vllm:request_success_total").get("1", 0.0)
    tokens_before = per_engine(before, "vllm:generation_tokens_total").get("1", 0.0)
    with anyio.fail_after(30):
        async with dp2.openai() as client:
            stream = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=480,
                                                     temperature=1.0, stream=True, extra_headers=pin,
                                                     extra_body={"ignore_eos": True})
            chunks = 0
            async for _ in stream:
                chunks += 1
                if chunks == 3:
                    break
            await stream.close()
        assert chunks == 3

        with anyio.fail_after(5):
            while True:
                text = await read_metrics(dp2.base_url)
                running = per_engine(text, "vllm:num_requests_running").get("1", 0.0)
                kv = per_engine(text, "vllm:kv_cache_usage_perc").get("1", 0.0)
                if running == 0 and kv == 0:
                    break
                await anyio.sleep(0.2)
        assert per_engine(text, "vllm:request_success_total").get("1", 0.0) == successes_before
        assert per_engine(text, "vllm:generation_tokens_total").get("1", 0.0) >= tokens_before + chunks


async def test_bad_requests_are_rejected_with_openai_errors(dp2: Server) -> None:
    with anyio.fail_after(30):
        async with dp2.openai() as client:
            with pytest.raises(openai.BadRequestError):
                await client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
            with pytest.raises(openai.BadRequestError):
                await client.completions.create(model=MODEL, prompt="x", max_tokens=2, temperature=-0.5)
            with pytest.raises(openai.BadRequestError):
                await client.completions.create(model=MODEL, prompt="x", max_tokens=10_000)
            with pytest.raises(openai.NotFoundError) as info:
                await client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
            assert info.value.status_code == 404
        async with httpx.AsyncClient(base_url=dp2.base_url, timeout=5.0) as http:
            r = await http.post("/v1/completions", content=b'{"model": "' + MODEL.encode() + b'", "prompt": ',
                                headers={"content-type": "application/json"})
            assert r.status_code == 400
            assert r.json()["error"]["code"] == 400 and r.json()["error"]["type"] == "BadRequestError"
            r = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": "not a list"})
            assert r.status_code == 400


async def test_grammars_over_the_librarys_limits_are_400s_never_a_stop_cut_short(dp2: Server) -> None:
    """``a{99999999}`` compiles but exhausts llguidance's lexer fuel at its first token: refused up front,
    naming the parameter. A grammar that fails only past the validation probe ends with a 400 (whole) or an
    error event (streamed), where it used to answer 200 with ``finish_reason="stop"`` and a truncated text."""
    pytest.importorskip("llguidance", reason="structured outputs need llguidance")
    from asyncdp.sampling_params.structured import PROBE_STEPS

    late = f"[a-z]{{{PROBE_STEPS + 8}}}b{{99999999}}"
    with anyio.fail_after(60):
        async with dp2.openai() as client:
            with pytest.raises(openai.BadRequestError) as refused:
                await client.completions.create(model=MODEL, prompt="x", max_tokens=20,
                                                extra_body={"guided_regex": "a{99999999}"})
            assert refused.value.body["param"] == "guided_regex"  # type: ignore[index]
            with pytest.raises(openai.BadRequestError) as whole:
                await client.completions.create(model=MODEL, prompt="x", max_tokens=60, temperature=0,
                                                extra_body={"guided_regex": late})
            assert whole.value.body["param"] == "guided_regex"  # type: ignore[index]
            assert "failed during generation" in whole.value.message
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=60, temperature=0,
                stream=True, extra_body={"guided_regex": late})
            reasons = []
            with pytest.raises(openai.APIError) as streamed:
                async for chunk in stream:
                    reasons += [c.finish_reason for c in chunk.choices]
            assert streamed.value.body["code"] == 400  # type: ignore[index]
            assert streamed.value.body["param"] == "guided_regex"  # type: ignore[index]
            assert "failed during generation" in streamed.value.message
            assert set(reasons) <= {None}


async def test_a_resume_that_overtakes_a_waiting_pause_ends_that_pause_with_409(dp2: Server) -> None:
    """``POST /pause?mode=wait`` waits for the running requests; a ``POST /resume`` before they end resumes the
    engines, and the waiting pause call ends with 409 (a conflict between the two callers), never a 500. The
    running request is not disturbed and finishes."""
    pause: list[httpx.Response] = []
    tokens, finish = 0, None
    async with dp2.openai() as client, httpx.AsyncClient(base_url=dp2.base_url, timeout=30.0) as http:
        try:
            with anyio.fail_after(60):
                stream = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=480,
                                                         stream=True, extra_body={"ignore_eos": True})

                async def pause_and_wait() -> None:
                    pause.append(await http.post("/pause", params={"mode": "wait"}))

                async with anyio.create_task_group() as tg:
                    async for chunk in stream:
                        tokens += 1
                        finish = chunk.choices[0].finish_reason
                        if tokens == 3:
                            tg.start_soon(pause_and_wait)
                            # polling another process's state: until every engine has the pause
                            while not (await http.get("/is_paused")).json()["is_paused"]:  # noqa: ASYNC110
                                await anyio.sleep(0.01)
                            assert not pause, "the pause completed while a request was still running"
                            resumed = await http.post("/resume")
                            assert resumed.status_code == 200, resumed.text
        finally:
            await http.post("/resume")  # the deployment is shared: never leave it paused
        assert (await http.get("/is_paused")).json() == {"is_paused": False}
    assert finish == "length" and tokens == 480
    assert pause[0].status_code == 409, pause[0].text
    error = pause[0].json()["error"]
    assert error["code"] == 409 and "resumed before the pause completed" in error["message"]


def _maps_torch(pid: int) -> bool:
    return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()


async def test_the_api_servers_run_without_torch_and_the_engines_with_it(dp2: Server) -> None:
    """An API server runs no model: it loaded its tokenizer through ``AutoTokenizer``, whose import pulled in
    torch (a second of CPU at startup and about 185 MiB in every API process), now the built-in's own class.
    Checked after chat requests (the chat template, tools) on new connections, which the kernel spreads over both
    API servers."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with anyio.fail_after(60):
        for _ in range(4):
            async with httpx.AsyncClient(base_url=dp2.base_url, timeout=30.0) as http:
                r = await http.post("/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                    "tools": [tool], "tool_choice": "required"})
                assert r.status_code == 200, r.text
    titles = dp2.titles()
    apis = [pid for pid, title in titles.items() if title.startswith("asyncdp-api")]
    engines = [pid for pid, title in titles.items() if title.startswith("asyncdp-engine")]
    assert len(apis) == API_COUNT and len(engines) == DP_SIZE, titles
    assert [pid for pid in apis if _maps_torch(pid)] == []
    assert all(_maps_torch(pid) for pid in engines)


async def test_http2_clients_multiplex_completions_streams_and_errors_on_one_connection(dp2: Server) -> None:
    """hypercorn serves HTTP/2 too (h2c with prior knowledge, as a proxy such as Envoy speaks it upstream): 40
    completions multiplexed on one connection all succeed and reach both ranks, a stream over it ends with
    ``[DONE]``, and a bad body is the same OpenAI-style 400 as over HTTP/1.1."""
    before = await successes(dp2.base_url)
    with anyio.fail_after(60):
        async with httpx.AsyncClient(base_url=dp2.base_url, http1=False, http2=True, timeout=30.0) as h2:
            answers: list[httpx.Response] = []

            async def one(i: int) -> None:
                answers.append(await h2.post("/v1/completions", json={
                    "model": MODEL, "prompt": f"multiplexed {i}", "max_tokens": 4, "ignore_eos": True}))

            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(one, i)
            async with h2.stream("POST", "/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                    "stream": True}) as stream:
                events = [line async for line in stream.aiter_lines() if line.startswith("data: ")]
                streamed_version = stream.http_version
            bad = await h2.post("/v1/completions", content=b'{"model": ', headers={"content-type": "application/json"})
    assert {r.http_version for r in answers} == {"HTTP/2"} and streamed_version == "HTTP/2"
    assert [r.status_code for r in answers] == [200] * 40
    assert all(r.json()["usage"]["completion_tokens"] == 4 for r in answers)
    assert events[-1] == "data: [DONE]" and len(events) >= 3
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
    after = await successes(dp2.base_url)
    gained = {e: after.get(e, 0.0) - before.get(e, 0.0) for e in ("0", "1")}
    assert sum(gained.values()) == 41 and all(n > 0 for n in gained.values()), gained
