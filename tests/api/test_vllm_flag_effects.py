"""What the honoured vLLM flags do in an API server (docs/reference/cli.md, "vLLM flags that carry over"):
``--max-logprobs`` bounds a request's logprobs with vLLM's 400, ``--enable-log-requests`` logs one line per prompt
(``--max-log-len`` of its token ids) and, with ``--enable-log-outputs``, one line per choice generated, and
``--uvicorn-log-level`` sets the HTTP server's log level."""

from __future__ import annotations

import logging
import re

import pytest

from asyncdp.api.serve import http_log_level
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("route", "body", "param", "message"), [
    ("/v1/completions", {"prompt": "a", "logprobs": 4}, "logprobs",
     "Requested sample logprobs of 4, which is greater than max allowed: 3"),
    ("/v1/completions", {"prompt": "a", "prompt_logprobs": 4}, "prompt_logprobs",
     "Requested prompt logprobs of 4, which is greater than max allowed: 3"),
    ("/v1/completions", {"prompt": "a", "logprobs": 4, "stream": True}, "logprobs",
     "Requested sample logprobs of 4, which is greater than max allowed: 3"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 4}, "top_logprobs",
     "Requested sample logprobs of 4, which is greater than max allowed: 3"),  # (chat's name for them)
    ("/v1/chat/completions", {"messages": CHAT, "prompt_logprobs": 4, "stream": True}, "prompt_logprobs",
     "Requested prompt logprobs of 4, which is greater than max allowed: 3"),
    ("/v1/completions", {"prompt": "a", "n": 2, "use_beam_search": True}, "n",
     "Requested sample logprobs of 4, which is greater than max allowed: 3"),
])
async def test_more_logprobs_than_max_logprobs_is_vllms_400_before_anything_starts(route, body, param, message):
    async with running(max_logprobs=3) as srv:
        r = await srv.http.post(route, json={"max_tokens": 1, **body})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["message"]) == (param, message)
    assert srv.fake.submitted == []


async def test_max_logprobs_itself_is_served_on_both_routes():
    async with running(max_logprobs=3) as srv:
        c = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "logprobs": 3,
                                                         "prompt_logprobs": 3})
        chat = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1, "logprobs": True,
                                                                 "top_logprobs": 3})
    assert c.status_code == 200 and chat.status_code == 200, (c.text, chat.text)
    assert [(p.logprobs, p.prompt_logprobs) for _, _, p, _ in srv.fake.submitted] == [(3, 3), (3, None)]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_max_logprobs_above_20_is_served_up_to_it_and_refused_beyond(route):
    """The cap is the server's, not the request schema's: 25 sample and prompt logprobs, and a beam search of 12
    (whose steps ask 24), under --max-logprobs 30."""
    body: dict = {"prompt": "a"} if route == "/v1/completions" else {"messages": CHAT}
    asks = {"logprobs": 25} if route == "/v1/completions" else {"logprobs": True, "top_logprobs": 25}
    field = "logprobs" if route == "/v1/completions" else "top_logprobs"
    async with running(max_logprobs=30) as srv:
        ok = await srv.http.post(route, json={**body, "max_tokens": 1, "prompt_logprobs": 25, **asks})
        beams = await srv.http.post(route, json={**body, "max_tokens": 1, "n": 12, "use_beam_search": True})
        over = await srv.http.post(route, json={**body, "max_tokens": 1, **asks, field: 31})
        schema = (await srv.http.get("/openapi.json")).json()["components"]["schemas"]
    assert ok.status_code == 200 and beams.status_code == 200, (ok.text, beams.text)
    assert (srv.fake.submitted[0][2].logprobs, srv.fake.submitted[0][2].prompt_logprobs) == (25, 25)
    assert len(ok.json()["choices"][0]["logprobs"]["content" if field == "top_logprobs" else "top_logprobs"]) == 1
    assert over.status_code == 400 and (over.json()["error"]["param"], over.json()["error"]["message"]) == (
        field, "Requested sample logprobs of 31, which is greater than max allowed: 30")
    request = schema["CompletionRequest" if field == "logprobs" else "ChatRequest"]["properties"]
    assert [s.get("maximum") for s in request[field]["anyOf"]] == [None, 30]  # (null, or up to the cap)
    assert [s.get("maximum") for s in request["prompt_logprobs"]["anyOf"]] == [None, 30]


async def test_max_logprobs_minus_1_leaves_the_vocabulary_as_the_only_limit():
    async with running(max_logprobs=-1) as srv:
        vocab = len(srv.fake.tokenizer)
        ok = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "logprobs": vocab,
                                                          "prompt_logprobs": vocab})
        over = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1,
                                                                 "prompt_logprobs": vocab + 1})
    assert ok.status_code == 200, ok.text
    assert srv.fake.submitted[0][2].logprobs == vocab > 20
    assert over.status_code == 400 and (over.json()["error"]["param"], over.json()["error"]["message"]) == (
        "prompt_logprobs", f"Requested prompt logprobs of {vocab + 1}, which is greater than max allowed: {vocab}")


async def test_enable_log_requests_logs_each_prompt_once_with_max_log_len_token_ids(caplog):
    caplog.set_level(logging.INFO, logger="asyncdp.api.generate")
    async with running(enable_log_requests=True, max_log_len=2) as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": [[5, 6, 7], [8, 9]], "n": 2, "max_tokens": 1})
    assert r.status_code == 200, r.text
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "asyncdp.api.generate"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("Received request cmpl-") and lines[0].endswith(", prompt_token_ids: [5, 6].")
    assert "-0: params: SamplingParams(" in lines[0]
    assert "-1: params: SamplingParams(" in lines[1] and lines[1].endswith(", prompt_token_ids: [8, 9].")


async def test_requests_are_not_logged_without_enable_log_requests(caplog):
    caplog.set_level(logging.INFO, logger="asyncdp.api.generate")
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
    assert r.status_code == 200
    assert not [rec for rec in caplog.records if rec.getMessage().startswith("Received request")]


def generated_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("Generated response")]


async def test_enable_log_outputs_logs_each_choice_once_it_ends_with_max_log_len(caplog):
    caplog.set_level(logging.INFO, logger="asyncdp.api.generate")
    async with running(FakeEngineClient(replies=lambda _prompt, _seed: "hey"), enable_log_requests=True,
                       enable_log_outputs=True, max_log_len=2) as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "n": 2})
    assert r.status_code == 200, r.text
    lines = generated_lines(caplog)
    assert len(lines) == 2, lines
    for i, line in enumerate(lines):  # (the text and the ids cut at --max-log-len, as vLLM's request logger)
        assert re.fullmatch(rf"Generated response chatcmpl-\S+-0-{i}: output: 'he', output_token_ids: \[104, 101\], "
                            r"finish_reason: stop", line), line


async def test_enable_log_outputs_logs_a_streams_deltas_then_each_choice_complete(caplog):
    caplog.set_level(logging.INFO, logger="asyncdp.api.generate")
    async with running(FakeEngineClient(replies=lambda _prompt, _seed: "hey"), enable_log_requests=True,
                       enable_log_outputs=True) as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a", "stream": True})
    assert r.status_code == 200, r.text
    lines = [re.sub(r"cmpl-\S+-0-0", "ID", line) for line in generated_lines(caplog)]
    assert lines == [
        "Generated response ID (streaming delta): output: 'h', output_token_ids: [104], finish_reason: None",
        "Generated response ID (streaming delta): output: 'e', output_token_ids: [101], finish_reason: None",
        "Generated response ID (streaming delta): output: 'y', output_token_ids: [121], finish_reason: stop",
        "Generated response ID (streaming complete): output: 'hey', output_token_ids: None, "
        "finish_reason: streaming_complete",
    ]


async def test_outputs_are_logged_only_with_both_log_flags(caplog):
    """vLLM's request logger exists only with --enable-log-requests; --enable-log-outputs adds its output lines."""
    caplog.set_level(logging.INFO, logger="asyncdp.api.generate")
    for flags in ({"enable_log_outputs": True}, {"enable_log_requests": True}):
        async with running(**flags) as srv:
            r = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
            s = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "stream": True})
        assert (r.status_code, s.status_code) == (200, 200)
        assert generated_lines(caplog) == [], flags


@pytest.mark.parametrize(("name", "level"), [("critical", logging.CRITICAL), ("error", logging.ERROR),
                                             ("warning", logging.WARNING), ("info", logging.INFO),
                                             ("debug", logging.DEBUG), ("trace", logging.DEBUG)])
def test_uvicorn_log_levels_map_to_the_http_loggers_level(name, level):
    assert http_log_level(name) == level
