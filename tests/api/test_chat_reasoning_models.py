"""The other models' reasoning parsers through the API (``--reasoning-parser mistral``, ``granite``, ``glm45``,
``kimi_k2``, ``minimax_m2``, ``seed_oss``, ``step3``, ``deepseek_v3``, ``ernie45``, ``hunyuan_a13b``, ``holo2``,
``minimax_m2_append_think``), through the official ``openai`` client: the thinking in
``message.reasoning``, the rest in ``content``, a stream accumulated into the whole answer, ``reasoning_tokens``
counted by each parser's tags, a constraint started after each parser's end tag, and the switches that turn the
thinking off. The fake generates one token per character (the byte tokenizer: tags as their bytes).

Before, these names were refused by ``create_app`` (``deepseek_v3``, ``ernie45`` and ``hunyuan_a13b`` until later,
``holo2`` and ``minimax_m2_append_think`` later still)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running, whole_and_streamed
from tests.api.test_chat_auto_tool_choice import STREAM_WARNING, scripted

pytestmark = pytest.mark.anyio

CHAT: Any = [{"role": "user", "content": "2+2?"}]

# parser: (reply, reasoning, content)
REPLIES: dict[str, tuple[str, str | None, str | None]] = {
    "mistral": ("[THINK]Two and two.[/THINK]It is 4.", "Two and two.", "It is 4."),
    "granite": ("Here is my thought process:\nTwo and two.\nHere is my response:\nIt is 4.", "\nTwo and two.\n",
                "\nIt is 4."),
    "glm45": ("<think>Two and two.</think>It is 4.", "Two and two.", "It is 4."),
    "kimi_k2": ("<think>Two and two.</think>(no content)", "Two and two.", None),
    "minimax_m2": ("Two and two.</think>It is 4.", "Two and two.", "It is 4."),
    "seed_oss": ("<seed:think>Two and two.</seed:think>It is 4.", "Two and two.", "It is 4."),
    "step3": ("Two and two.</think>It is 4.", "Two and two.", "It is 4."),
    "ernie45": ("Two and two.\n</think>\n\n<response>\nIt is 4.\n</response>\n", "Two and two.\n", "\nIt is 4.\n"),
    "hunyuan_a13b": ("<think>\nTwo and two.</think>\n<answer>\nIt is 4.\n</answer>", "Two and two.", "It is 4."),
    "holo2": ("Two and two.</think>It is 4.", "Two and two.", "It is 4."),
    "minimax_m2_append_think": ("Two and two.</think>It is 4.", None, "<think>Two and two.</think>It is 4."),
}


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize("name", REPLIES)
async def test_each_parser_splits_the_answer_whole_and_streamed(name: str) -> None:
    reply, reasoning, content = REPLIES[name]
    async with running(scripted(reply), reasoning_parser=name) as srv:
        client = srv.openai()
        whole, accumulated = await whole_and_streamed(client, {"model": "fake-model", "messages": CHAT, "max_tokens": 200})
        streamed = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=200,
                                                        stream=True, stream_options={"include_usage": True})
        last = [chunk async for chunk in streamed][-1]
    message = whole.choices[0].message
    assert (message.reasoning, message.content) == (reasoning, content)  # type: ignore[attr-defined]
    assert accumulated.choices[0].message.model_dump(exclude_none=True) == message.model_dump(exclude_none=True)
    for used in (whole.usage, last.usage):
        assert used is not None and used.completion_tokens_details is not None
        assert used.completion_tokens_details.reasoning_tokens == len(reasoning or "")


@pytest.mark.parametrize(("name", "reply"), [("mistral", "It is 4."), ("glm45", "It is 4."),
                                             ("granite", "It is 4. Here is my response: 4")])
async def test_an_answer_that_does_not_open_the_thinking_is_all_content(name: str, reply: str) -> None:
    async with running(scripted(reply), reasoning_parser=name) as srv:
        whole = await srv.openai().chat.completions.create(model="fake-model", messages=CHAT, max_tokens=200)
    assert whole.choices[0].message.content == reply
    assert whole.choices[0].message.reasoning is None  # type: ignore[attr-defined]
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize(("name", "kwargs"), [("glm45", {"enable_thinking": False}), ("kimi_k2", {"thinking": False})])
async def test_the_switch_turns_the_parse_off(name: str, kwargs: dict[str, Any]) -> None:
    reply = "<think>not parsed</think>x"
    async with running(scripted(reply), reasoning_parser=name) as srv:
        whole = await srv.openai().chat.completions.create(model="fake-model", messages=CHAT, max_tokens=200,
                                                           extra_body={"chat_template_kwargs": kwargs})
    assert whole.choices[0].message.content == reply
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == 0


@pytest.mark.parametrize(("name", "end"), [("mistral", "[/THINK]"), ("seed_oss", "</seed:think>"),
                                           ("granite", "Here is my response:"), ("step3", "</think>"),
                                           ("ernie45", "</think>"), ("hunyuan_a13b", "</think>\n<answer>\n"),
                                           ("holo2", "</think>"), ("minimax_m2_append_think", "</think>")])
async def test_a_constraint_starts_after_each_parsers_end_tag(name: str, end: str) -> None:
    fake = FakeEngineClient(replies=lambda _prompt, _seed: f"x{end}{{}}")
    body = {"messages": CHAT, "response_format": {"type": "json_object"}}
    async with running(fake, reasoning_parser=name) as srv:
        r = await srv.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    params = fake.submitted[0][2]
    assert params.structured is not None and params.structured.start_after == tuple(end.encode())


async def test_glm45_without_thinking_constrains_the_whole_answer() -> None:
    fake = FakeEngineClient(replies=lambda _prompt, _seed: "{}")
    body = {"messages": CHAT, "response_format": {"type": "json_object"},
            "chat_template_kwargs": {"enable_thinking": False}}
    async with running(fake, reasoning_parser="glm45") as srv:
        r = await srv.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    params = fake.submitted[0][2]
    assert params.structured is not None and params.structured.start_after == ()


HUNYUAN = "<think>\nTwo and two.\n</think>\n<answer>\nIt is 4.\n</answer>"


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize(("reply", "reasoning", "reasoning_tokens"), [
    (HUNYUAN, "Two and two.", len("Two and two.\n")),  # the newline before </think>: one token more
    ("<think>\n\n</think>\n<answer>\nIt is 4.\n</answer>", None, 1),  # (one token in Hunyuan's tokenizer: 0)
])
async def test_hunyuan_a13b_answers_whole_and_streamed(reply: str, reasoning: str | None,
                                                       reasoning_tokens: int) -> None:
    async with running(scripted(reply), reasoning_parser="hunyuan_a13b") as srv:
        client = srv.openai()
        whole, accumulated = await whole_and_streamed(client, {"model": "fake-model", "messages": CHAT, "max_tokens": 200})
    message = whole.choices[0].message
    assert (message.reasoning, message.content) == (reasoning, "It is 4.")  # type: ignore[attr-defined]
    assert accumulated.choices[0].message.model_dump(exclude_none=True) == message.model_dump(exclude_none=True)
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == reasoning_tokens


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize(("kwargs", "effort", "thinks"), [
    (None, None, False), ({"thinking": True}, None, True), ({"enable_thinking": True}, None, True),
    ({"thinking": False}, None, False), (None, "high", True), (None, "none", False),
])
async def test_deepseek_v3_thinks_only_when_asked(kwargs: dict[str, Any] | None, effort: str | None,
                                                 thinks: bool) -> None:
    await _thinks_by_the_switches("deepseek_v3", kwargs, effort, thinks)


@pytest.mark.filterwarnings(STREAM_WARNING)
@pytest.mark.parametrize(("kwargs", "effort", "thinks"), [
    (None, None, True), ({"thinking": True}, None, True), ({"thinking": None}, None, True),
    ({"thinking": False}, None, False), ({"enable_thinking": False}, None, False),
    ({"thinking": False, "enable_thinking": True}, None, True), (None, "high", True), (None, "none", False),
])
async def test_holo2_thinks_unless_told_not_to(kwargs: dict[str, Any] | None, effort: str | None,
                                               thinks: bool) -> None:
    await _thinks_by_the_switches("holo2", kwargs, effort, thinks)


async def _thinks_by_the_switches(name: str, kwargs: dict[str, Any] | None, effort: str | None,
                                  thinks: bool) -> None:
    """The parser named splits the answer, counts its thinking and constrains after it, or none of these."""
    reply = "<think>Two and two.</think>It is 4."
    extra: dict[str, Any] = {"chat_template_kwargs": kwargs} if kwargs is not None else {}
    if effort is not None:
        extra["reasoning_effort"] = effort
    fake = scripted(reply)
    async with running(fake, reasoning_parser=name) as srv:
        client = srv.openai()
        body: Any = {"model": "fake-model", "messages": CHAT, "max_tokens": 200, "extra_body": extra}
        whole, accumulated = await whole_and_streamed(client, body)
        r = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "response_format": {"type": "json_object"}, **extra})
    assert r.status_code == 200, r.text
    message = whole.choices[0].message
    expected = ("Two and two.", "It is 4.") if thinks else (None, reply)
    assert (message.reasoning, message.content) == expected  # type: ignore[attr-defined]
    assert accumulated.choices[0].message.model_dump(exclude_none=True) == message.model_dump(exclude_none=True)
    assert whole.usage is not None and whole.usage.completion_tokens_details is not None
    assert whole.usage.completion_tokens_details.reasoning_tokens == (len("Two and two.") if thinks else 0)
    constraint = fake.submitted[-1][2].structured
    assert constraint is not None and constraint.start_after == (tuple(b"</think>") if thinks else ())


@pytest.mark.filterwarnings(STREAM_WARNING)
async def test_minimax_m2_append_think_streams_the_thinking_as_content() -> None:
    reply = "Two and two.</think>It is 4."
    async with running(scripted(reply), reasoning_parser="minimax_m2_append_think") as srv:
        client = srv.openai()
        streamed = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=200,
                                                        stream=True, extra_body={"include_reasoning": False})
        deltas = [c.choices[0].delta for c in [chunk async for chunk in streamed] if c.choices]
        whole = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=200,
                                                     extra_body={"include_reasoning": False})
    texts = [d.content for d in deltas if d.content]
    assert texts[0] == "<think>T" and "".join(texts) == "<think>" + reply  # (one token per character)
    assert not any(getattr(d, "reasoning", None) for d in deltas)
    assert whole.choices[0].message.content == "<think>" + reply  # nothing is reasoning, so nothing is hidden
