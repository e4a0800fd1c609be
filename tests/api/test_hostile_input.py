"""A bounded hostile-input battery against the real HTTP stack over FakeEngineClient, on both backends.

Malformed JSON, wrong types and out-of-range values for every declared field, huge integers and ``n``, deep
nesting in every free-form field, invalid UTF-8, oversized bodies (with and without Content-Length). For each:
no status >= 500, every error in OpenAI's shape with ``param`` naming the field at fault, and afterwards the
server still serves and no admission slot is left in flight.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import orjson
import pytest

from asyncdp.api.schemas import ChatRequest, CompletionRequest
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

COMPLETION = {"prompt": "a", "max_tokens": 1}
CHAT = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}
ROUTES = (("/v1/completions", CompletionRequest, COMPLETION), ("/v1/chat/completions", ChatRequest, CHAT))
BIG_INTEGERS = (b"1" + b"0" * 30, str(2**63).encode(), str(2**64).encode(), b"-" + str(2**64).encode())
WRONG_VALUES: tuple[Any, ...] = ("abc", 1.5, True, -1, {"x": [1]}, [1, "a"], 10**30)
DEEP = 5000
OUT_OF_RANGE: dict[str, list[Any]] = {
    "n": [0, 129], "best_of": [0, 129], "temperature": [-0.1], "top_p": [0, 1.5], "top_k": [-2, 2**31],
    "min_p": [-0.1, 1.1], "presence_penalty": [-2.1, 2.1], "frequency_penalty": [-2.5, 3],
    "repetition_penalty": [0, 2.1], "min_tokens": [-1, 2**31], "prompt_logprobs": [-1, 21],
    "stop_token_ids": [[-1], [2**31]], "stop": [[""], ""], "seed": [2**63, -(2**63) - 1],
    "logit_bias": [{"1": 101}, {"1": -100.5}, {"-1": 1}, {"x": 1}, {"999999": 1}],
    "max_tokens": [-1, 2**31, 10**9],
}
NOT_FINITE = (b"1e400", b"-1e400", b"NaN", b"Infinity")
COMPLETION_ONLY = {"logprobs": [-1, 21], "max_tokens": [0]}
CHAT_ONLY = {"top_logprobs": [-1, 21], "max_completion_tokens": [0, 2**31], "max_tokens": [0]}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()  # the standard library writes integers of any size


def _field_types(kind: type[msgspec.Struct]) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(kind)}


def _invalid_for(field_type: Any, value: Any) -> bool:
    try:
        msgspec.convert(value, field_type, strict=True)
    except msgspec.ValidationError:
        return True
    return False


def _cases() -> list[tuple[str, bytes, str | None]]:
    """(path, body, the param the 400 must name, or None when no single field is at fault)."""
    cases: list[tuple[str, bytes, str | None]] = []
    for path, kind, base in ROUTES:
        for field, field_type in _field_types(kind).items():
            if field in ("prompt", "messages", "data_parallel_rank", "data_parallel_global_rank"):
                continue  # typed by their own checks, covered below
            for value in WRONG_VALUES:
                if _invalid_for(field_type, value):
                    cases.append((path, dumps({**base, field: value}), field))
            for literal in BIG_INTEGERS:
                if _invalid_for(field_type, 1) and _invalid_for(field_type, 1.0):
                    continue  # not a number field; wrong types above
                if field == "temperature" and not literal.startswith(b"-"):
                    continue  # any finite temperature >= 0 is valid (vLLM has no upper bound)
                body = dumps(base)[:-1] + b',"' + field.encode() + b'":' + literal + b"}"
                cases.append((path, body, field))
        extra = COMPLETION_ONLY if kind is CompletionRequest else CHAT_ONLY
        for field, values in {**OUT_OF_RANGE, **extra}.items():
            for value in values:
                cases.append((path, dumps({**base, field: value}), field))
                cases.append((path, dumps({**base, field: value, "stream": True}), field))
        for field in ("temperature", "top_p", "presence_penalty", "repetition_penalty"):
            for literal in NOT_FINITE:
                cases.append((path, dumps(base)[:-1] + b',"' + field.encode() + b'":' + literal + b"}",
                              field if literal.startswith((b"1", b"-")) else None))
        # Deep nesting in every free-form place, and as the body itself.
        deep = b"[" * DEEP + b"]" * DEEP
        for field in ("logit_bias", "response_format", "tools", "data_parallel_rank", "unknown_field",
                      "stop", "vllm_xargs"):
            cases.append((path, dumps(base)[:-1] + b',"' + field.encode() + b'":' + deep + b"}", None))
        cases.append((path, deep, None))
        cases.append((path, b'{"a":' * DEEP + b"1" + b"}" * DEEP, None))
        # Invalid UTF-8: in an unknown key, in a value, in a known key.
        cases.append((path, dumps(base)[:-1] + b',"\xff\xfe":1}', None))
        cases.append((path, dumps(base)[:-1] + b',"user":"\xc3"}', None))
        cases.append((path, b'{"mod\xe9l":"x",' + dumps(base)[1:], None))
        # Malformed JSON.
        for bad in (b"{", b'{"n": }', b"nul", b"[]", b'"text"', b"{}", b"\x00", b'{"n":1,}', b"NaN"):
            cases.append((path, bad, None))
    # Free-form fields with values of the wrong shape.
    cases += [
        ("/v1/completions", dumps({"prompt": [[1], ["a"]]}), "prompt"),
        ("/v1/completions", dumps({"prompt": [[]]}), "prompt"),
        ("/v1/completions", b'{"prompt": [' + BIG_INTEGERS[0] + b"]}", "prompt"),
        ("/v1/completions", b'{"prompt": [' + BIG_INTEGERS[1] + b"]}", "prompt"),
        ("/v1/completions", dumps({"prompt": "a", "data_parallel_rank": 10**30}), "data_parallel_rank"),
        ("/v1/completions", dumps({"prompt": "a", "data_parallel_rank": [1]}), None),
        ("/v1/completions", dumps({"prompt": ["a"] * 3, "n": 128}), "n"),
        ("/v1/completions", dumps({"prompt": "a", "n": 100, "best_of": 5}), "best_of"),
        ("/v1/chat/completions", dumps({"messages": []}), "messages"),
        ("/v1/chat/completions", dumps({"messages": [{"role": 1}]}), "messages[0].role"),
        ("/v1/chat/completions", dumps({"messages": [{"role": "user", "content": {"a": 1}}]}),
         "messages[0].content"),
        # a bias out of range: the field, not msgspec's "logit_bias[...]" (its placeholder for a dict's values)
        ("/v1/completions", b'{"prompt": "a", "logit_bias": {"5": 1e999}}', "logit_bias"),
        ("/v1/completions", b'{"prompt": "a", "logit_bias": {"5": "x"}}', "logit_bias"),
        ("/tokenize", dumps({"prompt": 5}), "prompt"),
        ("/tokenize", dumps({"messages": "x"}), "messages"),
        ("/detokenize", dumps({"tokens": [2**31]}), "tokens[0]"),
        ("/detokenize", dumps({"tokens": [99999]}), "tokens"),
        ("/detokenize", b'{"tokens": [' + BIG_INTEGERS[2] + b"]}", "tokens[0]"),
    ]
    return cases


CASES = _cases()


def _problem(path: str, body: bytes, param: str | None, status: int, payload: bytes, ctype: str) -> str | None:
    where = f"{path} {body[:120]!r}"
    if status >= 500:
        return f"{where}: {status}"
    if status < 400:
        return f"{where}: accepted with {status}"
    if not ctype.startswith("application/json"):
        return f"{where}: error with content-type {ctype}"
    try:
        err = orjson.loads(payload)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"{where}: error body not OpenAI-shaped: {payload[:200]!r}"
    if set(err) != {"message", "type", "param", "code"} or err["code"] != status:
        return f"{where}: error body not OpenAI-shaped: {err}"
    if "[...]" in (err["param"] or ""):  # msgspec's placeholder for a dict's values names no field a client sent
        return f"{where}: param {err['param']!r}"
    if param is not None and not (err["param"] or "").startswith(param):
        return f"{where}: param {err['param']!r}, expected {param!r} ({err['message']})"
    return None


async def test_hostile_bodies_are_4xx_openai_errors_naming_the_field_and_leave_nothing_in_flight() -> None:
    fake = FakeEngineClient(max_queued_requests=4)
    async with running(fake) as srv:
        problems = []
        for path, body, param in CASES:
            r = await srv.http.post(path, content=body, headers={"content-type": "application/json"})
            problems.append(_problem(path, body, param, r.status_code, r.content, r.headers["content-type"]))
        # digits past Python's int() limit (4 300) were a ValueError, a 500, in every hint form
        for name, value in [("X-data-parallel-rank", "1" + "0" * 30), ("X-data-parallel-rank", "9" * 5000),
                            ("X-data-parallel-global-rank", "-" + "9" * 5000)]:
            header = await srv.http.post("/v1/completions", json=COMPLETION, headers={name: value})
            param = "data_parallel_global_rank" if "global" in name else "data_parallel_rank"
            problems.append(_problem(f"header {name}", b"", param, header.status_code, header.content,
                                     header.headers["content-type"]))
        body = json.dumps({**COMPLETION, "data_parallel_rank": "9" * 5000}).encode()
        r = await srv.http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        problems.append(_problem("/v1/completions", body[:80], "data_parallel_rank", r.status_code, r.content,
                                 r.headers["content-type"]))
        still_serving = await srv.http.post("/v1/completions", json=COMPLETION)
        health = await srv.http.get("/health")
    assert [p for p in problems if p] == []
    assert still_serving.status_code == 200 and health.status_code == 200
    assert fake.num_in_flight == 0 and fake.num_active == 0
    assert len(fake.submitted) == 1  # only the final, valid request reached the engine


async def _chunks(total: int) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        piece = b" " * min(64 * 1024, total - sent)
        sent += len(piece)
        yield piece


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
async def test_oversized_body_is_413_openai_error_with_or_without_content_length(path: str) -> None:
    # Far over the limit, so the server is still receiving when it decides: the 413 must still arrive.
    async with running(max_request_body_bytes=4096) as srv:
        answers = []
        for size in (5000, 8 << 20):
            body = b'{"prompt": "' + b"x" * size + b'"}'
            answers.append(await srv.http.post(path, content=body, headers={"Connection": "close"}))
            answers.append(await srv.http.post(path, content=_chunks(size), headers={"Connection": "close"}))
        fits = await srv.http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "user": "u" * 3000})
    for r in answers:
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == 413
        assert "--max-request-body-bytes" in err["message"]
    assert fits.status_code == 200


async def test_huge_n_is_refused_before_anything_is_built_from_it() -> None:
    fake = FakeEngineClient()
    async with running(fake) as srv:
        huge = await srv.http.post("/v1/completions",
                                   content=b'{"prompt": "a", "max_tokens": 1, "n": 1' + b"0" * 30 + b"}")
        past_flag = await srv.http.post("/v1/completions", json={"prompt": ["a", "b", "c"], "n": 100})
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "n"
    assert past_flag.status_code == 400
    assert "--max-seqs-per-request" in past_flag.json()["error"]["message"]
    assert fake.submitted == []


async def test_max_seqs_per_request_flag_bounds_prompts_times_n() -> None:
    async with running(max_seqs_per_request=4) as srv:
        fits = await srv.http.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2, "max_tokens": 1})
        over = await srv.http.post("/v1/completions", json={"prompt": ["a", "b", "c"], "n": 2, "max_tokens": 1})
        over_best_of = await srv.http.post("/v1/completions",
                                           json={"prompt": "a", "n": 1, "best_of": 5, "max_tokens": 1})
    assert fits.status_code == 200 and len(fits.json()["choices"]) == 4
    assert over.status_code == 400 and over.json()["error"]["param"] == "n"
    assert over_best_of.status_code == 400 and over_best_of.json()["error"]["param"] == "best_of"
