"""The hostile-input battery's requests (tests/e2e/test_hostile_input.py): a ``Case`` is one request and the
statuses it may get; ``encode`` writes JSON with huge integers and verbatim fragments; the tables of
wrong-type, out-of-range and nullable values for every field of completions and chat, and the builders of each
family's cases (wrong types, out of range, raw bodies, invalid UTF-8, deep nesting, streamed)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.e2e.conftest import MODEL

BIG_INTS = (10**30, 2**63, 2**64, -(2**63) - 1)
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
BASE = {COMPLETIONS: {"model": MODEL, "prompt": "hi", "max_tokens": 1},
        CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}}
BAD_REQUEST = frozenset({400})


class Raw(str):
    """A JSON fragment inserted verbatim (``1e400``, ``NaN``), where ``json.dumps`` cannot write it."""


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    content: bytes | None
    expect: frozenset[int] | None = BAD_REQUEST  # None: any status below 500
    headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),)
    method: str = "POST"


def encode(obj: Any) -> bytes:
    """JSON with arbitrary-size integers (stdlib json) and ``Raw`` fragments spliced in."""
    raws: list[str] = []

    def mark(value: Any) -> Any:
        if isinstance(value, Raw):
            raws.append(value)
            return f"\x00raw{len(raws) - 1}\x00"
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v) for v in value]
        return value

    text = json.dumps(mark(obj))
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00raw{i}\x00"), raw)
    return text.encode()


def with_field(path: str, field: str, value: Any, **extra: Any) -> Case:
    body = {**BASE[path], **extra, field: value}
    shown = (value if isinstance(value, Raw) else json.dumps(value))[:60]
    return Case(f"{path} {field}={shown}{' ' + json.dumps(extra) if extra else ''}", path, encode(body))


# Fields of both endpoints, by kind, with values of a wrong type (all 400).
INT_FIELDS = ("max_tokens", "n", "seed", "top_k", "min_tokens", "best_of", "prompt_logprobs",
              "data_parallel_rank", "data_parallel_global_rank")
FLOAT_FIELDS = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "repetition_penalty")
BOOL_FIELDS = ("stream", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "echo")
STR_FIELDS = ("model", "user")
WRONG = {
    "int": ["abc", 1.5, True, {}, [1], Raw("1e30")],
    "float": ["abc", True, {}, [1.0]],
    "bool": ["abc", 2, {}, [True]],
    "str": [5, {}, [1], True],
    "stop": [5, {}, [1], [["a"]], True],
    "stop_token_ids": ["abc", 5, [1.5], ["a"], {}, [True]],
    "stream_options": [5, "abc", [], {"include_usage": "abc"}],
    "logit_bias": [5, "abc", [], {"abc": 1}, {"5": "abc"}, {"5": {}}],
    "response_format": [True, 5, "json", {"type": 5}, {"type": "no-such-format"}],
    "tools": [5, "abc", {}, [5]],
    "tool_choice": [5, [], {}],
    "functions": [5, "abc"],
}
COMMON_OTHER = ("stop", "stop_token_ids", "stream_options", "logit_bias", "response_format")
COMPLETION_WRONG = {
    "prompt": [5, True, {}, [], [[]], [1.5], [True], [{}], [["a"]], [1, "a"], None],
    "logprobs": WRONG["int"], "suffix": WRONG["str"],
}
CHAT_WRONG = {
    "messages": [5, "abc", {}, [], [5], [{}], [{"role": 5, "content": "hi"}], [{"role": "user", "content": 5}],
                 [{"role": "user", "content": [5]}], [{"role": "user", "content": {"a": 1}}],
                 [{"role": "user", "content": "hi", "name": 5}],
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///x"}}]}]],
    "logprobs": ["abc", 2, {}], "top_logprobs": WRONG["int"], "max_completion_tokens": WRONG["int"],
    "tools": WRONG["tools"], "tool_choice": WRONG["tool_choice"], "functions": WRONG["functions"],
    "add_generation_prompt": WRONG["bool"], "continue_final_message": WRONG["bool"],
    "chat_template_kwargs": [5, "abc", []],
}


def wrong_type_cases() -> list[Case]:
    cases = []
    for path, own in ((COMPLETIONS, COMPLETION_WRONG), (CHAT, CHAT_WRONG)):
        fields = {**{f: WRONG["int"] for f in INT_FIELDS}, **{f: WRONG["float"] for f in FLOAT_FIELDS},
                  **{f: WRONG["bool"] for f in BOOL_FIELDS}, **{f: WRONG["str"] for f in STR_FIELDS},
                  **{f: WRONG[f] for f in COMMON_OTHER}, **own}
        for field, values in fields.items():
            cases += [with_field(path, field, v) for v in values]
    return cases


# Values of the right type outside the field's range (all 400).
OUT_OF_RANGE: dict[str, list[Any]] = {
    "max_tokens": [-1, 2**31, *BIG_INTS], "seed": [2**64, -(2**63) - 1, 10**30],
    "top_k": [-2, 2**31, *BIG_INTS], "min_tokens": [-1, 2, *BIG_INTS],
    "best_of": [0, -1, 129, *BIG_INTS], "prompt_logprobs": [-1, 21, *BIG_INTS],
    "temperature": [-0.1, Raw("1e400"), Raw("-1e400")], "top_p": [0, -0.5, 1.5, Raw("1e400")],
    "presence_penalty": [2.5, -2.5, 10**30, Raw("1e400")], "frequency_penalty": [2.5, -2.5, 10**30, Raw("-1e400")],
    "repetition_penalty": [0, -1, Raw("1e400")], "min_p": [-0.1, 1.5],
    "stop": ["", [""]], "stop_token_ids": [[-1], [2**31], [2**64], [10**30]],
    "logit_bias": [{"-1": 1}, {str(2**64): 1}, {"5": 101}, {"5": -101}, {"5": Raw("1e400")}, {"259": 1},
                   {"99999999": 1}],
    "data_parallel_rank": [2, -1, 10**30, 2**64], "data_parallel_global_rank": [5, -1, 10**30],
}
COMPLETION_OUT_OF_RANGE = {
    "prompt": [[-1], [259], [2**31], [2**64], [10**30], [[5], [-1]], "x" * 2000, [7] * 600],
    "logprobs": [-1, 21, *BIG_INTS],
}
CHAT_OUT_OF_RANGE = {
    "top_logprobs": [-1, 21, *BIG_INTS], "max_completion_tokens": [-1, 2**31, *BIG_INTS],
    "messages": [[{"role": "user", "content": "x" * 2000}]],
}


def out_of_range_cases() -> list[Case]:
    cases = []
    for path, own in ((COMPLETIONS, COMPLETION_OUT_OF_RANGE), (CHAT, CHAT_OUT_OF_RANGE)):
        for field, values in {**OUT_OF_RANGE, **own}.items():
            cases += [with_field(path, field, v) for v in values]
    cases.append(with_field(CHAT, "top_logprobs", 5))  # top_logprobs without logprobs: true
    cases.append(with_field(CHAT, "top_logprobs", 21, logprobs=True))
    return cases


# OpenAI marks these nullable: null means "the default" (a 200).
NULLABLE = {COMPLETIONS: ("n", "stream", "presence_penalty", "frequency_penalty", "logprobs", "max_tokens",
                          "temperature", "top_p", "seed", "stop", "stream_options", "user", "best_of",
                          "logit_bias", "echo", "suffix"),
            CHAT: ("n", "stream", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs",
                   "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
                   "stream_options", "user", "logit_bias", "response_format", "tools", "tool_choice")}


def raw_case(name: str, content: bytes, path: str = COMPLETIONS, expect: frozenset[int] | None = BAD_REQUEST,
             **kwargs: Any) -> Case:
    return Case(name, path, content, expect, **kwargs)


def invalid_utf8_cases() -> list[Case]:
    bad = (b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82")  # stray, overlong, surrogate, truncated
    cases = []
    for seq in bad:
        cases += [
            raw_case(f"{seq!r} in the prompt", b'{"prompt": "a' + seq + b'b", "max_tokens": 1}'),
            raw_case(f"{seq!r} in an unknown key", b'{"prompt": "hi", "max_tokens": 1, "k' + seq + b'": 1}'),
            raw_case(f"{seq!r} in an unknown value", b'{"prompt": "hi", "max_tokens": 1, "k": "' + seq + b'"}'),
            raw_case(f"{seq!r} in a nested unknown key", b'{"prompt": "hi", "x": {"k' + seq + b'": [1]}}'),
            raw_case(f"{seq!r} in the model", b'{"prompt": "hi", "max_tokens": 1, "model": "' + seq + b'"}'),
            raw_case(f"{seq!r} in stop", b'{"prompt": "hi", "max_tokens": 1, "stop": ["' + seq + b'"]}'),
            raw_case(f"{seq!r} in a chat message", b'{"messages": [{"role": "user", "content": "' + seq + b'"}]}',
                     CHAT),
            raw_case(f"{seq!r} in a chat role", b'{"messages": [{"role": "u' + seq + b'", "content": "hi"}]}', CHAT),
        ]
    return cases


def nested(depth: int, open_: str = "[", close: str = "]") -> Raw:
    return Raw(open_ * depth + "1" + close * depth)


def deep_cases() -> list[Case]:
    cases = []
    for depth in (1_000, 5_000, 100_000):
        arrays, objects = nested(depth), nested(depth, '{"a":', "}")
        for path in (COMPLETIONS, CHAT):
            for field in ("prompt" if path == COMPLETIONS else "messages", "stop", "logit_bias", "unknown_key",
                          "tools", "response_format", "stream_options"):
                cases.append(with_field(path, field, arrays))
            cases.append(with_field(path, "unknown_key", objects))
        cases.append(with_field(CHAT, "messages", Raw('[{"role": "user", "content": ' + arrays + '}]')))
        cases.append(with_field(CHAT, "chat_template_kwargs", Raw('{"a": ' + arrays + '}')))
        cases.append(raw_case(f"unclosed depth {depth}", b'{"prompt": ' + b"[" * depth))
    return cases


def streamed(path: str, **fields: Any) -> Case:
    body = {**BASE[path], "stream": True, **fields}
    return Case(f"stream {path} {json.dumps(fields)[:80]}", path, encode(body))


# The output parsers' flags: requests that reach them (tools with tool_choice "auto", the thinking split, a
# constraint that starts after </think>) get 200s or 400s on a server started with these.
PARSER_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3")
OK = frozenset({200})
PARSER_TAGS = ("<tool_call>", "</tool_call>", "<think>", "</think>", '{"name": "f", "arguments": {}}', "<|im_end|>")


def tool(name: str, parameters: Any = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def chat(name: str, expect: frozenset[int] | None = OK, **fields: Any) -> Case:
    """A chat request with ``fields``; ``expect`` None: any status below 500."""
    return Case(f"parsers: {name}", CHAT, encode({**BASE[CHAT], "max_tokens": 8, **fields}), expect)


def parser_cases() -> list[Case]:
    cases = [chat(f"a tool named {tag!r}", tools=[tool(tag)], tool_choice="auto") for tag in PARSER_TAGS]
    cases += [chat(f"a tool named {tag!r}, streamed", tools=[tool(tag)], stream=True) for tag in PARSER_TAGS]
    cases += [
        chat("a tool named with control characters", tools=[tool("a\u0000b\n\u2028c\ud7ff")]),
        chat("an empty tool name", BAD_REQUEST, tools=[tool("")]),
        # (a 400 where the chat template renders the tools into a prompt over --max-model-len; the built-in
        # model's does not)
        chat("a 100 kB tool name", None, tools=[tool("x" * 100_000)], tool_choice="auto"),
        chat("2000 tools", None, tools=[tool(f"f{i}") for i in range(2000)], tool_choice="auto"),
        chat("the same tool twice", tools=[tool("f"), tool("f")], tool_choice="auto"),
        chat("auto with no tools", tools=[], tool_choice="auto"),
        chat("odd parameters", tools=[tool("f", {"$defs": 5, "type": "nonsense"})], tool_choice="auto"),
        chat("parameters that are not an object", BAD_REQUEST, tools=[tool("f", [1])]),
        chat("auto and n=2 streamed with usage", tools=[tool("f")], n=2, stream=True,
             stream_options={"include_usage": True}),
        chat("auto with json_object", tools=[tool("f")], response_format={"type": "json_object"}),
        chat("auto with echo", BAD_REQUEST, tools=[tool("f")], echo=True, messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": '<tool_call>{"name": "f"'}]),
        chat("required with a tag for a name", tools=[tool("</think>")], tool_choice="required"),
        chat("named with a tag for a name", tools=[tool("<tool_call>")],
             tool_choice={"type": "function", "function": {"name": "<tool_call>"}}, stream=True),
        chat("an assistant turn's reasoning of a wrong type", BAD_REQUEST,
             messages=[{"role": "assistant", "content": "x", "reasoning": 5}, {"role": "user", "content": "hi"}]),
        chat("an assistant turn's thinking with tags", messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "</think><tool_call>", "reasoning_content": "<think></think>"},
            {"role": "user", "content": "again"}]),
    ]
    for value in ("abc", 5, 0, [], {}, None, "false", [False]):
        cases.append(chat(f"enable_thinking={json.dumps(value)}", chat_template_kwargs={"enable_thinking": value}))
    cases += [chat(f"include_reasoning={json.dumps(v)}", BAD_REQUEST, include_reasoning=v)
              for v in ("abc", 2, [], {}, "false")]
    cases += [chat("include_reasoning=null", frozenset({200}), include_reasoning=None),
              chat("include_reasoning=false with logprobs, streamed", frozenset({200}), include_reasoning=False,
                   logprobs=True, top_logprobs=2, stream=True)]
    structured: list[dict[str, Any]] = [
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}},
        {"guided_choice": ["</think>", "<think>"]}, {"structured_outputs": {"regex": "</think>[a-z]+"}},
        {"tools": [tool("f")], "tool_choice": "required"},
    ]
    for fields in structured:
        for extra in ({}, {"stream": True}, {"chat_template_kwargs": {"enable_thinking": False}},
                      {"include_reasoning": False, "n": 2}):
            cases.append(chat(f"{json.dumps(fields)[:60]} {json.dumps(extra)}", **fields, **extra))
    # a grammar masks all but one alternative of top_logprobs: their logprob (-inf) must still be a number
    no_thinking = {"chat_template_kwargs": {"enable_thinking": False}}
    cases += [chat("masked alternatives in top_logprobs", guided_choice=["yes", "no"], logprobs=True, top_logprobs=3,
                   **no_thinking),
              chat("masked alternatives in top_logprobs, streamed", guided_choice=["yes", "no"], logprobs=True,
                   top_logprobs=3, stream=True, **no_thinking)]
    for skip in (True, False, None):
        for fields in ({"tools": [tool("f")]}, {"chat_template_kwargs": {"enable_thinking": False}}, {}):
            cases.append(chat(f"skip_special_tokens={skip} {json.dumps(fields)}", skip_special_tokens=skip, **fields))
            cases.append(chat(f"skip_special_tokens={skip} {json.dumps(fields)}, streamed", skip_special_tokens=skip,
                              stream=True, **fields))
    cases.append(chat("skip_special_tokens of a wrong type", BAD_REQUEST, skip_special_tokens="no", tools=[tool("f")]))
    return cases
