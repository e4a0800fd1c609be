"""``tool_choice: "auto"`` with ``--enable-auto-tool-choice --tool-call-parser hermes`` (``create_app``'s
``tool_call_parser``): the model writes freely and the calls in its text become ``tool_calls``, whole and
streamed, through the official ``openai`` client; without the flag it stays a 400 that names the flags.

Before, every request with tools and ``tool_choice`` "auto" (or none) was a 400 whatever the server's flags:
asyncdp had no tool-call parser, so a client of a Hermes or Qwen model could not let the model choose."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient, byte_tokenizer
from tests.api.conftest import running, sse_events, whole_and_streamed

pytestmark = pytest.mark.anyio

CHAT: Any = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time"}},
]
TEMPLATE = ("{% if tools %}TOOLS={{ tools | map(attribute='function') | map(attribute='name') | join(',') }};"
            "{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
CALLS = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n')
# the openai client's stream leaves httpcore's generator to the collector (trio)
STREAM_WARNING = "ignore:Exception ignored in. <async_generator object:pytest.PytestUnraisableExceptionWarning"


def scripted(reply: str | dict[int, str]) -> FakeEngineClient:
    """A fake whose every sequence writes ``reply`` (or, per seed, ``reply[seed]``), with the tools template."""
    fake = FakeEngineClient(replies=lambda _prompt, seed: reply if isinstance(reply, str) else reply[seed or 0])
    fake.tokenizer.chat_template = TEMPLATE
    return fake



def without_ids(message: Any) -> dict[str, Any]:
    doc = message.model_dump(exclude_none=True)
    for call in doc.get("tool_calls", []):
        assert call.pop("id").startswith("chatcmpl-tool-")
        call.pop("index", None)  # (a streamed call's index stays in the accumulated snapshot)
    return doc


@pytest.mark.filterwarnings(STREAM_WARNING)
async def test_auto_turns_the_hermes_blocks_into_tool_calls_whole_and_streamed() -> None:
    fake = scripted(CALLS)
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "max_tokens": 200}
    async with running(fake, tool_call_parser="hermes") as srv:
        client = srv.openai()
        whole = await client.chat.completions.create(**body, tool_choice="auto")
        absent = await client.chat.completions.create(**body)  # tools without a tool_choice: "auto"
        async with client.chat.completions.stream(**body) as stream:
            accumulated = await stream.get_final_completion()
        raw = await srv.http.post("/v1/chat/completions", json={**body, "stream": True})
    prompt = fake.tokenizer.decode(fake.submitted[0][1])
    assert prompt.startswith("TOOLS=get_weather,get_time;<user>"), prompt
    assert fake.submitted[0][2].structured is None and fake.submitted[0][2].skip_special_tokens
    message = whole.choices[0].message
    assert message.content == "Checking." and whole.choices[0].finish_reason == "tool_calls"
    calls = message.tool_calls or []
    assert [(c.type, c.function.name, c.function.arguments) for c in calls] == [
        ("function", "get_weather", '{"city": "Zürich"}'), ("function", "get_time", "{}")]
    assert len({c.id for c in calls}) == 2
    assert without_ids(absent.choices[0].message) == without_ids(message)
    assert without_ids(accumulated.choices[0].message) == without_ids(message)
    assert accumulated.choices[0].finish_reason == "tool_calls"
    chunks = [json.loads(e) for e in sse_events(raw.text) if e != "[DONE]"]
    deltas = [ch["delta"] for c in chunks for ch in c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": None}  # null, not "": an accumulated stream's content
    sent = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert sent == [[{"index": 0, "id": sent[0][0]["id"], "type": "function",
                      "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}],
                    [{"index": 1, "id": sent[1][0]["id"], "type": "function",
                      "function": {"name": "get_time", "arguments": "{}"}}]]  # each whole, when its block closed
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    assert not any("<tool" in (d.get("content") or "") for d in deltas)
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == ["tool_calls"]


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize(("parser", "reply"), [
    ("llama3_json", 'Checking.\n<|python_tag|>{"name": "get_weather", "parameters": {"city": "Zürich"}}; '
                    '{"name": "get_time", "parameters": {}}'),
    ("pythonic", '[get_weather(city="Zürich"), get_time()]\nChecking.'),
], ids=["llama3_json", "pythonic"])
async def test_auto_turns_llama3_json_and_pythonic_calls_into_tool_calls_whole_and_streamed(parser: str,
                                                                                          reply: str) -> None:
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|python_tag|>"]})  # as Llama 3's tokenizer marks it
    fake = FakeEngineClient(tokenizer=tok, replies=lambda _prompt, _seed: reply)
    fake.tokenizer.chat_template = TEMPLATE
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "max_tokens": 200}
    async with running(fake, tool_call_parser=parser) as srv:
        client = srv.openai()
        whole, accumulated = await whole_and_streamed(client, body)
        raw = await srv.http.post("/v1/chat/completions", json={**body, "stream": True})
    # the tag survives detokenizing only for the parser that needs it
    assert [s[2].skip_special_tokens for s in fake.submitted] == [parser != "llama3_json"] * 3
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert message.content == ("Checking." if parser == "llama3_json" else "\nChecking.")
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
        ("get_weather", '{"city": "Zürich"}'), ("get_time", "{}")]
    assert without_ids(accumulated.choices[0].message) == without_ids(message)
    assert accumulated.choices[0].finish_reason == "tool_calls"
    deltas = [ch["delta"] for c in (json.loads(e) for e in sse_events(raw.text) if e != "[DONE]")
              for ch in c["choices"]]
    assert [tc["index"] for d in deltas for tc in d.get("tool_calls", [])] == [0, 1]
    assert not any("<|python_tag|>" in (d.get("content") or "") for d in deltas)


@pytest.mark.filterwarnings(STREAM_WARNING)
async def test_an_answer_without_calls_is_text_and_a_bad_block_stays_in_it() -> None:
    bad = 'Sure. <tool_call>{"name": "launch", "arguments": {}}</tool_call> Done.'
    async with running(scripted(bad), tool_call_parser="hermes") as srv:
        client = srv.openai()
        whole = await client.chat.completions.create(model="fake-model", messages=CHAT, tools=TOOLS,
                                                     max_tokens=200)
        async with client.chat.completions.stream(model="fake-model", messages=CHAT, tools=TOOLS,
                                                  max_tokens=200) as stream:
            accumulated = await stream.get_final_completion()
    assert whole.choices[0].message.content == bad and not whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "stop"
    assert accumulated.choices[0].message.content == bad and not accumulated.choices[0].message.tool_calls


async def test_a_call_before_max_tokens_cut_the_answer_keeps_finish_reason_length() -> None:
    first = '<tool_call>{"name": "get_time"}</tool_call>'
    async with running(scripted(first + " and then more"), tool_call_parser="hermes") as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "tools": TOOLS,
                                                              "max_tokens": len(first) + 4})
        s = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "tools": TOOLS, "stream": True,
                                                              "max_tokens": len(first) + 4})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] == " and"
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_time"]
    chunks = [json.loads(e) for e in sse_events(s.text) if e != "[DONE]"]
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]] == ["length"]


async def test_each_of_n_choices_is_parsed_on_its_own() -> None:
    replies = {7: CALLS, 8: "No tools needed."}  # the second choice's seed is seed + 1
    async with running(scripted(replies), tool_call_parser="hermes") as srv:
        body = {"messages": CHAT, "tools": TOOLS, "n": 2, "seed": 7, "max_tokens": 200}
        whole = await srv.http.post("/v1/chat/completions", json=body)
        streamed = await srv.http.post("/v1/chat/completions", json={**body, "stream": True})
    first, second = whole.json()["choices"]
    assert first["finish_reason"] == "tool_calls" and len(first["message"]["tool_calls"]) == 2
    assert second["finish_reason"] == "stop" and second["message"]["content"] == "No tools needed."
    assert "tool_calls" not in second["message"]
    chunks = [json.loads(e) for e in sse_events(streamed.text) if e != "[DONE]"]
    for index, reason, num_calls in ((0, "tool_calls", 2), (1, "stop", 0)):
        mine = [ch for c in chunks for ch in c["choices"] if ch["index"] == index]
        assert [ch["finish_reason"] for ch in mine if ch["finish_reason"]] == [reason]
        assert [tc["index"] for ch in mine for tc in ch["delta"].get("tool_calls", [])] == list(range(num_calls))


async def test_without_the_flag_auto_is_a_400_that_names_the_flags() -> None:
    async with running(scripted(CALLS)) as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    assert "--enable-auto-tool-choice and --tool-call-parser" in r.json()["error"]["message"]
    assert srv.fake.submitted == []


async def test_echo_is_refused_with_auto() -> None:
    messages = [*CHAT, {"role": "assistant", "content": "Calling"}]
    async with running(scripted(CALLS), tool_call_parser="hermes") as srv:
        r = await srv.http.post("/v1/chat/completions", json={
            "messages": messages, "tools": TOOLS, "echo": True, "continue_final_message": True,
            "add_generation_prompt": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo", r.text


async def test_tags_a_tokenizer_marks_special_are_kept_in_the_text_unless_the_request_says() -> None:
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    fake = FakeEngineClient(tokenizer=tok, replies=lambda _prompt, _seed: CALLS)
    async with running(fake, tool_call_parser="hermes") as srv:
        for extra in ({}, {"skip_special_tokens": True}, {"tool_choice": "none"}):
            r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "tools": TOOLS, **extra})
            assert r.status_code == 200, r.text
    assert [s[2].skip_special_tokens for s in fake.submitted] == [False, True, True]


def test_an_unknown_parser_is_refused_by_create_app() -> None:
    from asyncdp.api import create_app

    with pytest.raises(ValueError, match="tool_call_parser must be one of hermes, llama3_json, llama4_pythonic, "
                                         "mistral, openai, pythonic, qwen3_coder"):
        create_app(FakeEngineClient(), tool_call_parser="granite")


async def test_a_scripted_fake_ends_its_reply_as_an_end_of_sequence_and_keeps_letters_by_default() -> None:
    async with running(FakeEngineClient(replies=lambda prompt, _seed: "ok" if "hi" in prompt else None)) as srv:
        client = srv.openai()
        hi = await client.completions.create(model="fake-model", prompt="hi", max_tokens=10)
        cut = await client.completions.create(model="fake-model", prompt="hi", max_tokens=1)
        other = await client.completions.create(model="fake-model", prompt="yo", max_tokens=3)
    assert (hi.choices[0].text, hi.choices[0].finish_reason) == ("ok", "stop")
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == ("o", "length")
    assert other.choices[0].text.isalpha() and other.choices[0].finish_reason == "length"


async def test_the_first_chunk_of_other_tool_choices_keeps_its_empty_content() -> None:
    async with running(scripted("text"), tool_call_parser="hermes") as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "tools": TOOLS, "stream": True,
                                                              "tool_choice": "none"})
    assert r.status_code == 200, r.text
    first = json.loads(sse_events(r.text)[0])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize("parser", ["hermes", "llama3_json", "pythonic"])
async def test_an_empty_answer_is_null_content_whole_as_streamed(parser: str) -> None:
    """An answer with no text (a stop string first, or an end of sequence at once) has ``content: null``, as a
    stream of it accumulates from its first chunk's ``null``. Before, the whole answer said ``""`` and the stream
    ``null``, without a reasoning parser (with one, both were already null)."""
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "max_tokens": 200, "stop": ["x"]}
    async with running(scripted("xyz"), tool_call_parser=parser) as srv:
        client = srv.openai()
        whole, accumulated = await whole_and_streamed(client, body)
    for answer in (whole, accumulated):
        (choice,) = answer.choices
        assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (None, None, "stop")


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize(("parser", "reply", "content"), [
    ("hermes", CALLS + "Done.", "Checking.\n\n\nDone."),
    ("pythonic", '[get_weather(city="Zürich"), get_time()]\nChecking.', "\nChecking."),
], ids=["hermes", "pythonic"])
@pytest.mark.parametrize("parallel", [False, True, None], ids=["false", "true", "absent"])
async def test_parallel_tool_calls_false_keeps_only_the_first_call_whole_and_streamed(
        parser: str, reply: str, content: str, parallel: bool | None) -> None:
    """As vLLM (PR 26233): the calls after the first are dropped, not made content; the stream never sends one."""
    body: Any = {"model": "fake-model", "messages": CHAT, "tools": TOOLS, "max_tokens": 200}
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    async with running(scripted(reply), tool_call_parser=parser) as srv:
        whole, accumulated = await whole_and_streamed(srv.openai(), body)
        raw = await srv.http.post("/v1/chat/completions", json={**body, "stream": True})
    expected = [("get_weather", '{"city": "Zürich"}'), ("get_time", "{}")][:1 if parallel is False else 2]
    message = whole.choices[0].message
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == expected
    assert message.content == content and whole.choices[0].finish_reason == "tool_calls"
    assert without_ids(accumulated.choices[0].message) == without_ids(message)
    assert accumulated.choices[0].finish_reason == "tool_calls"
    deltas = [ch["delta"] for c in (json.loads(e) for e in sse_events(raw.text) if e != "[DONE]")
              for ch in c["choices"]]
    sent = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert [(tc["index"], tc["function"]["name"], tc["function"]["arguments"]) for tc in sent] == [
        (i, *call) for i, call in enumerate(expected)]
    assert "".join(d.get("content") or "" for d in deltas) == content
