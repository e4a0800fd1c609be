"""Every failure leaves as OpenAI error JSON with the status of ``asyncdp.api.errors``, on both backends."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from asyncdp.errors import QueueFullError
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running, sse_events

pytestmark = pytest.mark.anyio


def assert_openai_error(r, status: int, type_: str, param: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == type_
    assert err["code"] == status
    if param is not None:
        assert err["param"] == param
    return err


async def test_out_of_range_sampling_params_are_400_naming_the_field() -> None:
    async with running() as srv:
        for body, field in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                            ({"max_tokens": 0}, "max_tokens"), ({"n": 0}, "n"), ({"logprobs": 99}, "logprobs")]:
            r = await srv.http.post("/v1/completions", json={"prompt": "a", **body})
            err = assert_openai_error(r, 400, "BadRequestError", field)
            assert field in err["message"]
        with pytest.raises(openai.BadRequestError):
            await srv.openai().completions.create(model="fake-model", prompt="a", temperature=-0.5)
    assert srv.fake.submitted == []


async def test_wrong_field_types_and_malformed_json_are_400_not_500() -> None:
    async with running() as srv:
        wrong_type = await srv.http.post("/v1/completions", json={"prompt": "a", "temperature": "hot"})
        malformed = await srv.http.post("/v1/completions", content=b'{"prompt": ')
        not_object = await srv.http.post("/v1/chat/completions", content=b"[1, 2]")
        empty = await srv.http.post("/v1/completions", content=b"")
        bad_prompt = await srv.http.post("/v1/completions", json={"prompt": [1, "a"]})
        bad_content = await srv.http.post("/v1/chat/completions",
                                          json={"messages": [{"role": "user", "content": 5}]})
    assert_openai_error(wrong_type, 400, "BadRequestError", "temperature")
    assert_openai_error(malformed, 400, "BadRequestError")
    assert_openai_error(not_object, 400, "BadRequestError")
    assert_openai_error(empty, 400, "BadRequestError")
    assert_openai_error(bad_prompt, 400, "BadRequestError", "prompt")
    assert_openai_error(bad_content, 400, "BadRequestError", "messages[0].content")


async def test_prompt_or_max_tokens_beyond_max_model_len_is_400_before_generate() -> None:
    async with running(FakeEngineClient(max_model_len=16)) as srv:
        long_prompt = await srv.http.post("/v1/completions", json={"prompt": "x" * 16, "max_tokens": 1})
        too_many = await srv.http.post("/v1/completions", json={"prompt": "x" * 8, "max_tokens": 9})
        fits = await srv.http.post("/v1/completions", json={"prompt": "x" * 8, "max_tokens": 8})
    assert "max_model_len" in assert_openai_error(long_prompt, 400, "BadRequestError", "prompt")["message"]
    assert "max_model_len" in assert_openai_error(too_many, 400, "BadRequestError", "max_tokens")["message"]
    assert fits.status_code == 200
    assert len(srv.fake.submitted) == 1


async def test_chat_over_max_model_len_names_the_limit_the_request_gave() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    async with running(FakeEngineClient(max_model_len=64)) as srv:
        completion_tokens = await srv.http.post("/v1/chat/completions",
                                                json={"messages": msgs, "max_completion_tokens": 100000})
        max_tokens = await srv.http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 100000})
    err = assert_openai_error(completion_tokens, 400, "BadRequestError", "max_completion_tokens")
    assert "reduce the prompt or max_completion_tokens" in err["message"]
    assert_openai_error(max_tokens, 400, "BadRequestError", "max_tokens")


class _CountingServerInfo(FakeEngineClient):
    """A fake client that counts how often the ``/server_info`` document is built."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_server_info = 0

    def server_info(self) -> dict[str, Any]:
        self.num_server_info += 1
        return super().server_info()


async def test_a_request_with_local_and_global_hints_is_resolved_without_building_server_info() -> None:
    async with running(_CountingServerInfo(num_ranks=2, start_rank=4)) as srv:
        ok = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "data_parallel_rank": 1,
                                                           "data_parallel_global_rank": 5})
        conflict = await srv.http.post(
            "/v1/completions", json={"prompt": "a", "data_parallel_rank": 0, "data_parallel_global_rank": 5})
    assert ok.status_code == 200
    assert_openai_error(conflict, 400, "BadRequestError", "data_parallel_rank")
    assert srv.fake.num_server_info == 0


async def test_rank_hints_are_parsed_and_bad_ones_rejected() -> None:
    async with running(FakeEngineClient(num_ranks=2, start_rank=4)) as srv:
        ok_header = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1},
                                        headers={"x-Data-Parallel-Rank": "1"})
        ok_global = await srv.http.post("/v1/completions",
                                        json={"prompt": "a", "max_tokens": 1, "data_parallel_global_rank": 4})
        not_int = await srv.http.post("/v1/completions", json={"prompt": "a"},
                                      headers={"X-data-parallel-rank": "x"})
        float_body = await srv.http.post("/v1/completions", json={"prompt": "a", "data_parallel_rank": 1.5})
        conflict = await srv.http.post("/v1/completions", json={"prompt": "a", "data_parallel_rank": 0},
                                       headers={"X-data-parallel-rank": "1"})
        cross_conflict = await srv.http.post(
            "/v1/completions", json={"prompt": "a", "data_parallel_rank": 0, "data_parallel_global_rank": 5})
        out_of_range = await srv.http.post("/v1/completions", json={"prompt": "a", "data_parallel_rank": 2})
        not_served = await srv.http.post("/v1/completions",
                                         json={"prompt": "a"}, headers={"X-data-parallel-global-rank": "9"})
    assert ok_header.status_code == 200 and ok_global.status_code == 200
    hints = [h for (_, _, _, h) in srv.fake.submitted]
    assert [(h.local_index, h.global_rank) for h in hints] == [(1, None), (None, 4)]
    assert assert_openai_error(not_int, 400, "BadRequestError")["message"] == \
        "data_parallel_rank must be an integer (got 'x')."
    assert assert_openai_error(float_body, 400, "BadRequestError")["message"] == \
        "data_parallel_rank must be an integer (got 1.5)."
    assert_openai_error(conflict, 400, "BadRequestError", "data_parallel_rank")
    assert_openai_error(cross_conflict, 400, "BadRequestError", "data_parallel_rank")
    assert assert_openai_error(out_of_range, 400, "BadRequestError")["message"] == \
        "data_parallel_rank 2 is out of range [0, 2)."
    assert assert_openai_error(not_served, 400, "BadRequestError")["message"] == \
        "data_parallel_global_rank 9 is not served by this endpoint (ranks 4..5)."


async def test_unknown_model_is_404_not_found_error() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"model": "other", "prompt": "a"})
        with pytest.raises(openai.NotFoundError):
            await srv.openai().chat.completions.create(model="other", messages=[{"role": "user", "content": "a"}])
    assert "other" in assert_openai_error(r, 404, "NotFoundError", "model")["message"]


async def test_unknown_route_is_404_and_wrong_method_405_in_openai_shape() -> None:
    async with running() as srv:
        unknown = await srv.http.get("/v1/nothing")
        wrong_method = await srv.http.get("/v1/completions")
    assert_openai_error(unknown, 404, "NotFoundError")
    assert_openai_error(wrong_method, 405, "MethodNotAllowedError")


async def test_full_queue_is_429_rate_limit() -> None:
    fake = FakeEngineClient()
    fake.queue_full = True
    async with running(fake) as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a", "stream": True})
        with pytest.raises(openai.RateLimitError):
            await srv.openai().completions.create(model="fake-model", prompt="a")
    assert_openai_error(r, 429, "RateLimitError")


async def test_unhealthy_client_gives_503_for_requests_and_health() -> None:
    fake = FakeEngineClient()
    fake.healthy = False
    async with running(fake) as srv:
        r = await srv.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a"}]})
        health = await srv.http.get("/health")
    assert_openai_error(r, 503, "ServiceUnavailableError")
    assert health.status_code == 503


async def test_engine_death_is_503_whole_and_error_event_then_done_when_streaming() -> None:
    fake = FakeEngineClient()
    fake.fail_after_tokens = 2
    async with running(fake) as srv:
        whole = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 5})
        streamed = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 5, "stream": True})
    assert_openai_error(whole, 503, "ServiceUnavailableError")
    events = sse_events(streamed.text)
    assert streamed.status_code == 200
    assert events[-1] == "[DONE]"
    assert orjson.loads(events[-2])["error"]["code"] == 503
    assert ["".join(orjson.loads(e)["choices"][0]["text"] for e in events[:-2])] == ["".join(
        chr(t) for t in fake.expected_token_ids(fake.tokenizer.encode("a"), None, 2))]


async def test_unexpected_exception_is_500_without_traceback(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeEngineClient()
    fake.fail_with = RuntimeError("secret internals")
    async with running(fake) as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a"})
    err = assert_openai_error(r, 500, "InternalServerError")
    assert "secret" not in r.text and "Traceback" not in r.text
    assert err["message"] == "internal server error"
    assert any(rec.exc_info and "secret internals" in str(rec.exc_info[1]) for rec in caplog.records)


async def test_api_key_is_required_on_v1_routes_only() -> None:
    async with running(api_key="sekrit") as srv:
        missing = await srv.http.post("/v1/completions", json={"prompt": "a"})
        good = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1},
                                   headers={"Authorization": "Bearer sekrit"})
        health = await srv.http.get("/health")
    assert_openai_error(missing, 401, "AuthenticationError")
    assert good.status_code == 200 and health.status_code == 200


async def test_queue_full_error_maps_through_the_single_table() -> None:
    from asyncdp.api.errors import status_and_body

    status, body = status_and_body(QueueFullError("busy"))
    assert (status, body["error"]["type"], body["error"]["message"]) == (429, "RateLimitError", "busy")


async def test_prompt_token_ids_outside_the_vocabulary_are_400_before_generate() -> None:
    async with running(FakeEngineClient()) as srv:
        vocab = len(srv.fake.tokenizer)
        outside = await srv.http.post("/v1/completions", json={"prompt": [65, vocab], "max_tokens": 1})
        negative = await srv.http.post("/v1/completions", json={"prompt": [[65], [-1]], "max_tokens": 1})
        inside = await srv.http.post("/v1/completions", json={"prompt": [65, vocab - 1], "max_tokens": 1})
    assert "vocabulary" in assert_openai_error(outside, 400, "BadRequestError", "prompt")["message"]
    assert_openai_error(negative, 400, "BadRequestError", "prompt")
    assert inside.status_code == 200
    assert len(srv.fake.submitted) == 1


def test_an_engine_that_misses_its_deadline_is_a_503_naming_the_rank_and_the_wait() -> None:
    from asyncdp.api.errors import status_and_body
    from asyncdp.errors import EngineTimeoutError

    status, body = status_and_body(EngineTimeoutError(
        "pause did not complete on every rank within 30 s; no answer from engine rank(s) [1]"))
    assert status == 503 and body["error"]["type"] == "ServiceUnavailableError"
    assert "engine rank(s) [1]" in body["error"]["message"] and "within 30 s" in body["error"]["message"]
