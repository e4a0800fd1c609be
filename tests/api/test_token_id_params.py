"""vLLM's ``return_token_ids``, ``return_tokens_as_token_ids`` and ``truncate_prompt_tokens``, on both routes,
whole and streamed, through the ``openai`` client's ``extra_body`` as clients send them.

Before, all three were refused with a 400 naming them (``asyncdp.api.params.REFUSED``).
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running, sse_events
from tests.api.test_openai_compat import openai_stream_cleanup

pytestmark = pytest.mark.anyio

CHAT: Any = [{"role": "user", "content": "hello there"}]


def chunks(text: str) -> list[dict[str, Any]]:
    return [json.loads(d) for d in sse_events(text) if d != "[DONE]"]


def submitted(fake: FakeEngineClient) -> list[int]:
    return fake.submitted[-1][1]


# ---------------------------------------------------------------------- return_token_ids


async def test_completions_return_the_prompt_ids_and_each_choices_ids() -> None:
    async with running() as srv:
        tok = srv.fake.tokenizer
        r = await srv.openai().completions.create(model="fake-model", prompt=["ab", "cde"], max_tokens=4, n=2,
                                                  seed=7, extra_body={"return_token_ids": True})
        doc = r.model_dump()
        prompts = [ids for _, ids, _, _ in srv.fake.submitted]
    assert [c["prompt_token_ids"] for c in doc["choices"]] == [tok.encode("ab")] * 2 + [tok.encode("cde")] * 2
    assert {tuple(p) for p in prompts} == {tuple(tok.encode("ab")), tuple(tok.encode("cde"))}
    for c in doc["choices"]:
        assert len(c["token_ids"]) == 4 and tok.decode(c["token_ids"]) == c["text"]
    assert "prompt_token_ids" not in doc  # (completions: on each choice, as vLLM)


async def test_completions_echo_with_token_ids_sends_the_prompt_as_ids_only() -> None:
    async with running() as srv:
        plain = await srv.http.post("/v1/completions", json={"prompt": "xyz", "max_tokens": 3, "echo": True})
        ids = await srv.http.post("/v1/completions", json={"prompt": "xyz", "max_tokens": 3, "echo": True,
                                                           "return_token_ids": True})
    assert plain.json()["choices"][0]["text"].startswith("xyz")
    choice = ids.json()["choices"][0]
    assert choice["text"] == plain.json()["choices"][0]["text"][3:]  # as vLLM: the prompt's text left out
    assert srv.fake.tokenizer.decode(choice["prompt_token_ids"]) == "xyz" and len(choice["token_ids"]) == 3


@openai_stream_cleanup
async def test_streamed_completions_carry_the_prompt_ids_first_and_each_chunks_new_ids() -> None:
    async with running() as srv:
        stream = await srv.openai().completions.create(model="fake-model", prompt="hi", max_tokens=5, n=2,
                                                       stream=True, extra_body={"return_token_ids": True})
        got = [c.model_dump() async for c in stream]
    tok = srv.fake.tokenizer
    for index in (0, 1):
        mine = [c["choices"][0] for c in got if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[0]["prompt_token_ids"] == tok.encode("hi")
        assert all("prompt_token_ids" not in c for c in mine[1:])
        ids = [t for c in mine for t in c["token_ids"]]
        assert len(ids) == 5 and tok.decode(ids) == "".join(c["text"] for c in mine)


async def test_chat_returns_the_prompt_ids_top_level_and_each_choices_ids() -> None:
    async with running() as srv:
        r = await srv.openai().chat.completions.create(model="fake-model", messages=CHAT, max_tokens=4, n=2,
                                                       extra_body={"return_token_ids": True})
        doc = r.model_dump()
        prompt = submitted(srv.fake)
        plain = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2})
    assert doc["prompt_token_ids"] == prompt
    for c in doc["choices"]:
        assert len(c["token_ids"]) == 4 and srv.fake.tokenizer.decode(c["token_ids"]) == c["message"]["content"]
    assert "prompt_token_ids" not in plain.json() and "token_ids" not in plain.json()["choices"][0]


@openai_stream_cleanup
async def test_streamed_chat_sends_the_prompt_ids_in_each_role_chunk_and_every_tokens_ids() -> None:
    """A token whose text a stop string holds back still sends its id, in a chunk of its own."""
    async with running() as srv:
        stream = await srv.openai().chat.completions.create(
            model="fake-model", messages=CHAT, max_tokens=6, n=2, stop=["zzz"], stream=True,
            extra_body={"return_token_ids": True})
        got = [c.model_dump() async for c in stream]
        prompt = submitted(srv.fake)
    tok = srv.fake.tokenizer
    for index in (0, 1):
        mine = [c for c in got if c["choices"][0]["index"] == index]
        assert mine[0]["choices"][0]["delta"]["role"] == "assistant" and mine[0]["prompt_token_ids"] == prompt
        assert all(c.get("prompt_token_ids") is None for c in mine[1:])
        ids = [t for c in mine[1:] for t in c["choices"][0]["token_ids"]]
        assert len(ids) == 6 == len(mine) - 1  # one chunk per token, the held-back ones included
        assert tok.decode(ids) == "".join(c["choices"][0]["delta"]["content"] or "" for c in mine)


async def test_chat_token_ids_are_withheld_with_the_hidden_thinking() -> None:
    fake = FakeEngineClient(replies=lambda _prompt, _seed: "<think>secret</think>Answer.")
    async with running(fake, reasoning_parser="qwen3") as srv:
        body = {"messages": CHAT, "include_reasoning": False, "return_token_ids": True}
        whole = await srv.http.post("/v1/chat/completions", json=body)
        streamed = await srv.http.post("/v1/chat/completions", json={**body, "stream": True})
    assert whole.json()["choices"][0]["token_ids"] is None and whole.json()["prompt_token_ids"]
    assert all("token_ids" not in c["choices"][0] for c in chunks(streamed.text))


# ---------------------------------------------------------------------- return_tokens_as_token_ids


async def test_completions_logprobs_name_tokens_by_id() -> None:
    async with running() as srv:
        r = await srv.openai().completions.create(model="fake-model", prompt="ab", max_tokens=3, logprobs=1,
                                                  echo=True, extra_body={"return_tokens_as_token_ids": True})
        prompt = submitted(srv.fake)
        streamed = await srv.http.post("/v1/completions", json={
            "prompt": "ab", "max_tokens": 3, "logprobs": 1, "stream": True, "return_tokens_as_token_ids": True})
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.top_logprobs is not None
    generated = srv.fake.expected_token_ids(prompt, None, 3)
    assert lp.tokens == [f"token_id:{t}" for t in [*prompt, *generated]]
    assert lp.top_logprobs[0] is None  # (the first prompt token has no context)
    assert all(set(top) <= {f"token_id:{t}" for t in range(256)} for top in lp.top_logprobs[1:])
    assert f"token_id:{generated[0]}" in lp.top_logprobs[len(prompt)]
    assert r.choices[0].text.startswith("ab")  # the text is the text
    sent = [t for c in chunks(streamed.text) for t in c["choices"][0]["logprobs"]["tokens"]]
    assert sent == [f"token_id:{t}" for t in generated]


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_logprobs_name_tokens_by_id_with_vllms_bytes(stream: bool) -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "max_tokens": 3, "logprobs": True, "top_logprobs": 2, "stream": stream,
            "return_tokens_as_token_ids": True})
        generated = srv.fake.expected_token_ids(submitted(srv.fake), None, 3)
    content = [e for c in chunks(r.text) if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"][
        "content"]] if stream else r.json()["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{t}" for t in generated]
    assert [e["bytes"] for e in content] == [[t] for t in generated]  # the chosen token's own bytes
    for e, t in zip(content, generated, strict=True):
        top = e["top_logprobs"]
        assert top[0] == {"token": f"token_id:{t}", "logprob": e["logprob"], "bytes": list(f"token_id:{t}".encode())}
        assert top[1]["token"].startswith("token_id:") and bytes(top[1]["bytes"]).decode() == top[1]["token"]


# ---------------------------------------------------------------------- truncate_prompt_tokens


async def test_completions_keep_the_prompts_last_tokens_and_count_them() -> None:
    async with running() as srv:
        r = await srv.openai().completions.create(model="fake-model", prompt=[list(range(65, 75)), [66, 67]],
                                                  max_tokens=2, echo=True,
                                                  extra_body={"truncate_prompt_tokens": 4})
        prompts = sorted(ids for _, ids, _, _ in srv.fake.submitted)
        text = await srv.http.post("/v1/completions", json={"prompt": "abcdefgh", "max_tokens": 1, "echo": True,
                                                            "truncate_prompt_tokens": 3})
        text_prompt = submitted(srv.fake)
    assert prompts == [[66, 67], [71, 72, 73, 74]]
    assert r.usage is not None and r.usage.prompt_tokens == 6
    assert r.choices[0].text.startswith("GHIJ")  # the echo is the prompt that ran
    assert text_prompt == srv.fake.tokenizer.encode("fgh")
    assert text.json()["choices"][0]["text"].startswith("fgh") and text.json()["usage"]["prompt_tokens"] == 3


async def test_minus_one_keeps_what_the_context_holds_besides_max_tokens() -> None:
    async with running(FakeEngineClient(max_model_len=32)) as srv:
        too_long = await srv.http.post("/v1/completions", json={"prompt": list(range(65, 115)), "max_tokens": 4})
        r = await srv.http.post("/v1/completions", json={"prompt": list(range(65, 115)), "max_tokens": 4,
                                                         "truncate_prompt_tokens": -1})
        cut = submitted(srv.fake)
    assert too_long.status_code == 400
    assert r.status_code == 200 and cut == list(range(65, 115))[-28:] and r.json()["usage"]["prompt_tokens"] == 28


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_truncates_the_rendered_prompt(stream: bool) -> None:
    async with running() as srv:
        whole = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1})
        rendered = submitted(srv.fake)
        r = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "max_tokens": 2, "truncate_prompt_tokens": 5, "stream": stream,
            "stream_options": {"include_usage": True} if stream else None})
        cut = submitted(srv.fake)
    assert whole.json()["usage"]["prompt_tokens"] == len(rendered) > 5
    assert cut == rendered[-5:]
    usage = chunks(r.text)[-1]["usage"] if stream else r.json()["usage"]
    assert usage["prompt_tokens"] == 5


@pytest.mark.parametrize(("value", "message"), [
    (0, "empty prompt"), (-2, None), (1.5, None), ("3", None), (True, None),
    (253, "truncate_prompt_tokens=253 cannot be greater than max_model_len - max_tokens = 252"),
])
async def test_bad_truncation_sizes_are_400s_naming_the_parameter(value: Any, message: str | None) -> None:
    async with running() as srv:
        client = srv.openai()
        for create in (
            lambda: client.completions.create(model="fake-model", prompt="a", max_tokens=4,
                                              extra_body={"truncate_prompt_tokens": value}),
            lambda: client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=4,
                                                   extra_body={"truncate_prompt_tokens": value}),
        ):
            with pytest.raises(openai.BadRequestError) as info:
                await create()
            error = info.value.response.json()["error"]
            assert error["param"] == "truncate_prompt_tokens" and error["code"] == 400
            assert "not supported" not in error["message"]  # (refused outright before)
            assert message is None or message in error["message"]
    assert srv.fake.submitted == []


async def test_chat_without_max_tokens_may_keep_the_whole_context() -> None:
    """As vLLM: ``max_tokens`` absent counts as 0, so k may be ``max_model_len`` (which leaves no room: a 400
    naming the messages, as an over-long prompt is)."""
    async with running(FakeEngineClient(max_model_len=16)) as srv:
        over = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "truncate_prompt_tokens": 17})
        full = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "truncate_prompt_tokens": 16})
        fits = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "truncate_prompt_tokens": 15})
    assert over.status_code == 400 and over.json()["error"]["param"] == "truncate_prompt_tokens"
    assert full.status_code == 400 and full.json()["error"]["param"] == "messages"
    assert fits.status_code == 200 and fits.json()["usage"] == {"prompt_tokens": 15, "completion_tokens": 1,
                                                                "total_tokens": 16}


@pytest.mark.parametrize("name", ["return_token_ids", "return_tokens_as_token_ids"])
async def test_a_non_boolean_is_a_400_naming_it(name: str) -> None:
    async with running() as srv:
        chat = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, name: "yes"})
        completion = await srv.http.post("/v1/completions", json={"prompt": "a", name: 1})
    for r in (chat, completion):
        assert r.status_code == 400 and r.json()["error"]["param"] == name
        assert "not supported" not in r.json()["error"]["message"]  # a type error, no longer a refusal


async def test_the_document_publishes_the_parameters_and_the_answers_fields() -> None:
    async with running() as srv:
        doc = (await srv.http.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    for request in ("ChatRequest", "CompletionRequest"):
        props = schemas[request]["properties"]
        assert {"type": "integer", "minimum": 1, "maximum": 2**31 - 1} in props["truncate_prompt_tokens"]["anyOf"]
        assert {"const": -1} in props["truncate_prompt_tokens"]["anyOf"]
        for name in ("return_token_ids", "return_tokens_as_token_ids"):
            assert "Not supported" not in json.dumps(props[name])
    assert "prompt_token_ids" in schemas["ChatCompletion"]["properties"]
    assert "token_ids" in schemas["ChatCompletionChunk"]["properties"]["choices"]["items"]["properties"]
