"""A hostile-input battery against one live ``asyncdp serve builtin:tiny-dense -dp 2`` (issue 12).

Every test sends one family of bad requests (malformed JSON, wrong types and out-of-range values for every field
of completions and chat, huge integers, deep nesting, invalid UTF-8, oversized bodies, ``n`` above the free
slots, streamed requests with bad values) and collects every answer that breaks the contract, then asserts the
list is empty, so one failure names every offending request at once. The contract for each request: no status
>= 500 and no transport failure; where the case says so, exactly the expected status (a 400 for a bad value);
every error has OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``. After each family every API
process is still attached to the coordinator and nothing is left in flight (``/server_info`` of each API process
and ``asyncdp:dp_inflight_requests`` in ``/metrics``, summed over engines); the last test serves a normal
completion and chat through the official ``openai`` client. The module fixture's teardown asserts a clean exit
with no traceback in the log.

Requests go out on fresh connections (``Connection: close``), so they land on both API processes. Each has a
client timeout, and each family a deadline after which the rest of it is not sent (and reported as such).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson
import pytest

from tests.e2e.conftest import MODEL, Server, serve
from tests.e2e.metrics_text import per_engine

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MAX_QUEUED = 8
API_COUNT = 2
REQUEST_TIMEOUT_S = 10.0
FAMILY_DEADLINE_S = 25.0
BIG_INTS = (10**30, 2**63, 2**64, -(2**63) - 1)
OVERSIZED_BYTES = 24 * 1024 * 1024  # over any body limit sized for --max-model-len 512
OVER_TRANSPORT_LIMIT_BYTES = 70 * 1024 * 1024  # over today's fixed 64 MiB limit too
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
BASE = {COMPLETIONS: {"model": MODEL, "prompt": "hi", "max_tokens": 1},
        CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}}
BAD_REQUEST = frozenset({400})


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp("hostile"), "-dp", "2", "--api-server-count", str(API_COUNT),
               "--max-queued-requests", str(MAX_QUEUED)) as server:
        yield server


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


def sse_problems(text: str) -> list[str]:
    """Every ``data:`` line of a stream must be one JSON object or ``[DONE]``; an error event is a problem."""
    out = []
    for line in text.split("\n"):
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        try:
            event = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            out.append(f"unparsable SSE line {line[:120]!r}")
            continue
        if isinstance(event, dict) and "error" in event:
            out.append(f"error event {line[:200]}")
    return out


def error_shape_problem(r: httpx.Response) -> str | None:
    try:
        body = r.json()
    except ValueError:
        return f"error body is not JSON: {r.text[:200]!r}"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not {"message", "type", "param", "code"} <= err.keys():
        return f"error body is not OpenAI-shaped: {r.text[:200]}"
    if not isinstance(err["message"], str) or not isinstance(err["type"], str):
        return f"error message/type are not strings: {r.text[:200]}"
    return None


async def check(http: httpx.AsyncClient, case: Case) -> str | None:
    """The problem with the server's answer to ``case``, or None when it keeps the contract."""
    headers = {"Connection": "close", **dict(case.headers)}
    try:
        r = await http.request(case.method, case.path, content=case.content, headers=headers)
    except httpx.TimeoutException:
        return f"{case.name}: no answer within {REQUEST_TIMEOUT_S} s"
    except httpx.TransportError as exc:
        return f"{case.name}: transport error {exc!r}"
    if r.status_code >= 500:
        return f"{case.name}: {r.status_code} {r.text[:300]}"
    if case.expect is not None and r.status_code not in case.expect:
        return f"{case.name}: expected {sorted(case.expect)}, got {r.status_code} {r.text[:200]}"
    if r.status_code >= 400:
        problem = error_shape_problem(r)
        return f"{case.name}: {r.status_code} {problem}" if problem else None
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        problems = sse_problems(r.text)
        return f"{case.name}: {problems}" if problems else None
    return None


async def api_views(server: Server) -> dict[int, dict[str, Any]]:
    """``/server_info`` of every API process (by ``api_process_rank``), from fresh connections (bounded)."""
    views: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 15.0  # a stuck process costs a 5 s timeout per connection that lands on it
    async with httpx.AsyncClient(base_url=server.base_url, timeout=5.0) as http:
        for _ in range(40):
            if time.monotonic() > deadline:
                break
            try:
                info = (await http.get("/server_info", headers={"Connection": "close"})).json()
            except httpx.HTTPError:
                continue  # an API process that does not answer is missing from the views
            views[info["api_process_rank"]] = info
            if len(views) == info["api_process_count"]:
                break
    return views


async def settle_problems(server: Server) -> list[str]:
    """What is wrong with the deployment's state after a family: in flight left, a detached API process."""
    deadline = time.monotonic() + 10.0
    while True:
        problems = []
        views = await api_views(server)
        if len(views) != API_COUNT:
            problems.append(f"reached API processes {sorted(views)} of {API_COUNT}")
        for rank, info in sorted(views.items()):
            if info["coordinator"]["state"] != "alive":
                problems.append(f"API process {rank} sees the coordinator {info['coordinator']}")
            inflight = {r["dp_rank"]: r["inflight"] for r in info["managed_ranks"]}
            if any(inflight.values()):
                problems.append(f"API process {rank} has in flight {inflight}")
        async with httpx.AsyncClient(base_url=server.base_url, timeout=5.0) as http:
            for _ in range(4):
                try:
                    text = (await http.get("/metrics", headers={"Connection": "close"})).text
                except httpx.HTTPError as exc:
                    problems.append(f"GET /metrics failed: {exc!r}")
                    continue
                gauge = per_engine(text, "asyncdp:dp_inflight_requests")  # no series yet: nothing admitted
                if sum(gauge.values()):
                    problems.append(f"asyncdp:dp_inflight_requests = {gauge}")
        if not problems or time.monotonic() > deadline:
            return problems
        await anyio.sleep(0.2)  # poll: a slot is released just after the response is sent


async def run_family(server: Server, cases: list[Case], *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
    problems: list[str] = []
    deadline = time.monotonic() + FAMILY_DEADLINE_S
    async with httpx.AsyncClient(base_url=server.base_url, timeout=timeout_s) as http:
        for i, case in enumerate(cases):
            if time.monotonic() > deadline:
                problems.append(f"deadline: {len(cases) - i} cases not sent")
                break
            if (problem := await check(http, case)) is not None:
                problems.append(problem)
                if "no answer" in problem or "transport error" in problem:
                    problems.append(f"stopped after a lost request: {len(cases) - i - 1} cases not sent")
                    break
    problems += await settle_problems(server)
    assert not problems, f"{len(problems)} problems of {len(cases)} requests:\n" + "\n".join(problems)


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


def test_cases_encode_big_integers_and_raw_fragments_verbatim() -> None:
    assert encode({"n": 2**64, "t": Raw("1e400"), "d": nested(2)}) == b'{"n": 18446744073709551616, "t": 1e400, "d": [[1]]}'


async def test_wrong_types_for_every_field_are_400s(hostile: Server) -> None:
    await run_family(hostile, wrong_type_cases())


async def test_out_of_range_values_for_every_field_are_400s(hostile: Server) -> None:
    await run_family(hostile, out_of_range_cases())


# OpenAI marks these nullable: null means "the default" (a 200).
NULLABLE = {COMPLETIONS: ("n", "stream", "presence_penalty", "frequency_penalty", "logprobs", "max_tokens",
                          "temperature", "top_p", "seed", "stop", "stream_options", "user", "best_of",
                          "logit_bias", "echo", "suffix"),
            CHAT: ("n", "stream", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs",
                   "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
                   "stream_options", "user", "logit_bias", "response_format", "tools", "tool_choice")}


async def test_null_for_a_nullable_field_is_the_default(hostile: Server) -> None:
    cases = []
    for path, fields in NULLABLE.items():
        cases += [Case(c.name, c.path, c.content, frozenset({200})) for c in (with_field(path, f, None) for f in fields)]
    cases.append(Case("logprobs=0 is the sampled token's logprob", COMPLETIONS,
                      encode({**BASE[COMPLETIONS], "logprobs": 0}), frozenset({200})))
    await run_family(hostile, cases)


def raw_case(name: str, content: bytes, path: str = COMPLETIONS, expect: frozenset[int] | None = BAD_REQUEST,
             **kwargs: Any) -> Case:
    return Case(name, path, content, expect, **kwargs)


async def test_malformed_json_and_wrong_routes_are_openai_shaped_errors(hostile: Server) -> None:
    good = b'{"model": "%s", "prompt": "hi", "max_tokens": 1}' % MODEL.encode()
    cases = [raw_case(f"body {body[:40]!r}", body, path) for path in (COMPLETIONS, CHAT) for body in (
        b"", b" ", b"{", b"}", b"[]", b"null", b'"str"', b"123", b"true", b'{"prompt": "hi",}',
        b'{"prompt": "hi"} trailing', b'{"prompt": NaN}', b'{"prompt": "hi", "n": Infinity}', b'{prompt: "hi"}',
        b"{'prompt': 'hi'}", b'{"prompt": "hi"', b'{"prompt": "hi", "max_tokens": 01}', b"\x00" * 16)]
    cases += [
        raw_case("lone surrogate escape", b'{"prompt": "\\ud800", "max_tokens": 1}', expect=None),
        raw_case("NUL escape in the prompt", b'{"prompt": "a\\u0000b", "max_tokens": 1}', expect=None),
        raw_case("duplicate keys", b'{"prompt": "hi", "prompt": 5, "max_tokens": 1}', expect=None),
        raw_case("UTF-8 BOM", b"\xef\xbb\xbf" + good, expect=None),
        raw_case("100k unknown keys", encode({**BASE[COMPLETIONS], **{f"k{i}": i for i in range(100_000)}}),
                 expect=None),
        raw_case("text/plain body", good, expect=None, headers=(("content-type", "text/plain"),)),
        raw_case("no content-type", good, expect=None, headers=()),
        raw_case("form body", b"prompt=hi&max_tokens=1", expect=None,
                 headers=(("content-type", "application/x-www-form-urlencoded"),)),
        raw_case("GET completions", b"", expect=frozenset({405}), method="GET"),
        raw_case("POST models", good, "/v1/models", expect=frozenset({405})),
        raw_case("unknown route", good, "/v1/no-such-route", expect=frozenset({404})),
        raw_case("unknown model", encode({**BASE[COMPLETIONS], "model": "no-such-model"}), expect=frozenset({404})),
        raw_case("tokenize garbage", b"{", "/tokenize", expect=frozenset({400, 404})),
        raw_case("tokenize wrong type", b'{"prompt": 5}', "/tokenize", expect=frozenset({400, 404})),
        raw_case("detokenize bad ids", b'{"tokens": [18446744073709551616]}', "/detokenize",
                 expect=frozenset({400, 404})),
    ]
    await run_family(hostile, cases)


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


async def test_invalid_utf8_anywhere_in_the_body_is_a_400(hostile: Server) -> None:
    await run_family(hostile, invalid_utf8_cases())


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


async def test_deeply_nested_json_in_any_field_is_a_400(hostile: Server) -> None:
    await run_family(hostile, deep_cases())


def streamed(path: str, **fields: Any) -> Case:
    body = {**BASE[path], "stream": True, **fields}
    return Case(f"stream {path} {json.dumps(fields)[:80]}", path, encode(body))


async def test_streamed_requests_with_bad_values_are_400s_before_the_stream(hostile: Server) -> None:
    cases = []
    for path in (COMPLETIONS, CHAT):
        cases += [streamed(path, top_k=10**30), streamed(path, n=10**30), streamed(path, stop_token_ids=[2**64]),
                  streamed(path, seed=2**64), streamed(path, max_tokens=2**63), streamed(path, logit_bias={"-1": 1}),
                  streamed(path, presence_penalty=3), streamed(path, temperature=-1), streamed(path, best_of=0),
                  streamed(path, stream_options={"include_usage": "abc"}), streamed(path, data_parallel_rank=7),
                  streamed(path, unknown_key=nested(5_000)), Case(f"stream {path} unknown model", path, encode(
                      {**BASE[path], "stream": True, "model": "no-such-model"}), frozenset({404}))]
    cases.append(streamed(COMPLETIONS, prompt=[2**64]))
    cases.append(streamed(COMPLETIONS, prompt="x" * 2000))
    # Good streams with line separators in the text: every data: line must still be one JSON event.
    for prompt in ("a\u2028b\u2029c\u0085d\re\nf", "\u2028" * 20):
        cases.append(Case(f"echoed separators {prompt[:6]!r}", COMPLETIONS, encode(
            {**BASE[COMPLETIONS], "prompt": prompt, "stream": True, "echo": True, "max_tokens": 4}),
            frozenset({200})))
    cases.append(Case("stream with usage", CHAT, encode({**BASE[CHAT], "stream": True, "max_tokens": 4,
                                                         "stream_options": {"include_usage": True}}),
                      frozenset({200})))
    await run_family(hostile, cases)


async def test_guidellms_stream_gets_usage_in_every_chunk(hostile: Server) -> None:
    """guidellm streams with ``stream_options: {"include_usage": true, "continuous_usage_stats": true}`` (vLLM's
    extension), ``stop: null`` and ``ignore_eos``: a 200 stream whose every chunk carries the usage so far."""
    problems = []
    async with httpx.AsyncClient(base_url=hostile.base_url, timeout=REQUEST_TIMEOUT_S) as http:
        for path, length in ((COMPLETIONS, {"max_tokens": 4}), (CHAT, {"max_completion_tokens": 4})):
            base = {k: v for k, v in BASE[path].items() if k != "max_tokens"}
            body = {**base, **length, "stream": True, "stop": None, "ignore_eos": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
            r = await http.post(path, content=encode(body), headers={"content-type": "application/json"})
            if r.status_code != 200:
                problems.append(f"{path}: {r.status_code} {r.text[:300]}")
                continue
            events = [orjson.loads(line[5:]) for line in r.text.split("\n")
                      if line.startswith("data:") and line != "data: [DONE]"]
            without = [e for e in events if not isinstance(e.get("usage"), dict)]
            if not events or without:
                problems.append(f"{path}: {len(without)} of {len(events)} chunks without usage: {without[:2]}")
    problems += await settle_problems(hostile)
    assert not problems, "\n".join(problems)


async def test_n_above_the_free_slots_is_refused_and_releases_every_slot(hostile: Server) -> None:
    """``n`` above every slot of the node (``--max-queued-requests`` per API process, pooled or not) is refused
    whole; the slots it took are released, so ``n`` equal to one process's cap then succeeds on every API process
    (4 fresh connections each time), twice."""
    too_many = MAX_QUEUED * API_COUNT + 1
    cases = []
    for _ in range(2):
        cases += [Case(f"n={too_many}", path, encode({**BASE[path], "n": too_many}), frozenset({400, 429}))
                  for path in (COMPLETIONS, CHAT)]
        cases += [Case(f"n={MAX_QUEUED} after a refusal", COMPLETIONS,
                       encode({**BASE[COMPLETIONS], "n": MAX_QUEUED}), frozenset({200})) for _ in range(4)]
    await run_family(hostile, cases)


async def test_huge_n_and_best_of_are_400s_and_no_api_process_is_lost(hostile: Server) -> None:
    """Last of the families: before the fix these took an API server down (n = 1e30) or hung it."""
    cases = []
    for path in (COMPLETIONS, CHAT):
        for value in (129, 100_000, 2**31, *BIG_INTS):
            cases.append(with_field(path, "n", value))
            cases.append(with_field(path, "best_of", value))
        cases.append(with_field(path, "n", 100, max_tokens=2**31 - 1))
    cases.append(with_field(COMPLETIONS, "prompt", ["hi"] * 1000, n=128))  # prompts x n over the per-request cap
    cases.append(with_field(COMPLETIONS, "prompt", [[5]] * 100_000))
    await run_family(hostile, cases)


async def test_oversized_bodies_are_refused_with_413(hostile: Server) -> None:
    def big(size: int) -> bytes:
        return b'{"model": "%s", "max_tokens": 1, "prompt": "' % MODEL.encode() + b"a" * size + b'"}'

    def chunks(data: bytes) -> Any:
        async def gen() -> Any:
            for i in range(0, len(data), 1 << 20):
                yield data[i:i + (1 << 20)]
        return gen()

    problems: list[str] = []
    async with httpx.AsyncClient(base_url=hostile.base_url, timeout=REQUEST_TIMEOUT_S) as http:
        for size in (OVERSIZED_BYTES, OVER_TRANSPORT_LIMIT_BYTES):
            for framing in ("content-length", "chunked"):
                body = big(size)
                content = body if framing == "content-length" else chunks(body)
                name = f"{size >> 20} MiB body, {framing}"
                try:
                    r = await http.post(COMPLETIONS, content=content, headers={
                        "content-type": "application/json", "Connection": "close"})
                except httpx.TimeoutException:
                    problems.append(f"{name}: no answer within {REQUEST_TIMEOUT_S} s")
                    continue
                except httpx.TransportError as exc:  # the server may close once it has answered 413
                    problems.append(f"{name}: transport error {exc!r}")
                    continue
                if r.status_code != 413 or error_shape_problem(r):
                    problems.append(f"{name}: {r.status_code} {r.text[:200]}")
    problems += await settle_problems(hostile)
    assert not problems, "\n".join(problems)


async def test_after_the_battery_the_server_serves_through_the_openai_client(hostile: Server) -> None:
    with anyio.fail_after(30):
        async with hostile.openai() as client:
            for _ in range(4):
                r = await client.completions.create(model=MODEL, prompt="still serving", max_tokens=2)
                assert r.choices[0].finish_reason in ("length", "stop")
                c = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "still serving"}], max_tokens=2)
                assert c.choices[0].finish_reason in ("length", "stop")
    assert not await settle_problems(hostile)
