"""A hostile-input battery against one live ``asyncdp serve builtin:tiny-dense -dp 2`` (issue 12), started with the
output parsers' flags (``--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3``), so every
chat answer of every family passes through them, and one family aims at them (tools whose names are the parsers'
tags, many or huge tools, ``enable_thinking`` and ``include_reasoning`` of every type, constraints that start after
``</think>``, ``skip_special_tokens`` with each parser; each 200 answer must also match the served document, so
a grammar-masked alternative's ``"logprob": null`` is caught), at no cost of a second server. Requests are decoded and
checked the same way with or without the flags.

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
client timeout, and each family a deadline after which the rest of it is not sent (and reported as such). The
cases are built in ``tests/e2e/hostile_cases.py``; ``tests/e2e/hostile_checks.py`` sends them and judges the
answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import jsonschema_rs
import orjson
import pytest

from tests.e2e.conftest import MODEL, Server, serve
from tests.e2e.hostile_cases import (
    BASE,
    BIG_INTS,
    CHAT,
    COMPLETIONS,
    NULLABLE,
    PARSER_FLAGS,
    Case,
    Raw,
    deep_cases,
    encode,
    invalid_utf8_cases,
    nested,
    out_of_range_cases,
    parser_cases,
    raw_case,
    streamed,
    with_field,
    wrong_type_cases,
)
from tests.e2e.hostile_checks import (
    API_COUNT,
    MAX_QUEUED,
    REQUEST_TIMEOUT_S,
    error_shape_problem,
    run_family,
    settle_problems,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

OVERSIZED_BYTES = 24 * 1024 * 1024  # over any body limit sized for --max-model-len 512
OVER_TRANSPORT_LIMIT_BYTES = 70 * 1024 * 1024  # over today's fixed 64 MiB limit too


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp("hostile"), "-dp", "2", "--api-server-count", str(API_COUNT),
               "--max-queued-requests", str(MAX_QUEUED), *PARSER_FLAGS) as server:
        yield server


def test_cases_encode_big_integers_and_raw_fragments_verbatim() -> None:
    assert encode({"n": 2**64, "t": Raw("1e400"), "d": nested(2)}) == b'{"n": 18446744073709551616, "t": 1e400, "d": [[1]]}'


async def test_wrong_types_for_every_field_are_400s(hostile: Server) -> None:
    await run_family(hostile, wrong_type_cases())


async def test_out_of_range_values_for_every_field_are_400s(hostile: Server) -> None:
    await run_family(hostile, out_of_range_cases())


async def test_null_for_a_nullable_field_is_the_default(hostile: Server) -> None:
    cases = []
    for path, fields in NULLABLE.items():
        cases += [Case(c.name, c.path, c.content, frozenset({200})) for c in (with_field(path, f, None) for f in fields)]
    cases.append(Case("logprobs=0 is the sampled token's logprob", COMPLETIONS,
                      encode({**BASE[COMPLETIONS], "logprobs": 0}), frozenset({200})))
    await run_family(hostile, cases)


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


async def test_invalid_utf8_anywhere_in_the_body_is_a_400(hostile: Server) -> None:
    await run_family(hostile, invalid_utf8_cases())


async def test_requests_that_reach_the_output_parsers_are_200s_or_400s(hostile: Server) -> None:
    """Each 200 answer, whole or every event of a stream, also matches the server's own document."""
    async with httpx.AsyncClient(base_url=hostile.base_url, timeout=REQUEST_TIMEOUT_S) as http:
        doc = (await http.get("/openapi.json")).json()
    # (an event's schema says its data holds a chunk as contentSchema, which a plain validator leaves unchecked)
    whole, chunk = (jsonschema_rs.Draft202012Validator({"$ref": f"#/components/schemas/{name}",
                                                         "components": doc["components"]})
                    for name in ("ChatCompletion", "ChatCompletionChunk"))

    def validate(r: httpx.Response) -> list[str]:
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            return [e.message[:300] for e in whole.iter_errors(r.json())]
        events = [line[len("data: "):] for line in r.text.split("\n") if line.startswith("data: ")]
        return [e.message[:300] for data in events if data != "[DONE]" for e in chunk.iter_errors(orjson.loads(data))]

    await run_family(hostile, parser_cases(), validate=validate)


async def test_deeply_nested_json_in_any_field_is_a_400(hostile: Server) -> None:
    await run_family(hostile, deep_cases())


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
