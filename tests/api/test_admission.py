"""A request's sequences are admitted all or nothing, and every way out of a request gives its slots back."""

from __future__ import annotations

import anyio
import orjson
import pytest

from asyncdp.errors import ShuttingDownError
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running, sse_events

pytestmark = pytest.mark.anyio


async def test_request_with_more_sequences_than_the_queue_ever_admits_is_400_and_reserves_nothing() -> None:
    # More than --max-queued-requests even with nothing in flight: a 400 naming n, not a 429 (the openai client
    # retries a 429, and this request could never be admitted).
    fake = FakeEngineClient(max_queued_requests=8)
    async with running(fake) as srv:
        too_many = await srv.http.post("/v1/completions", json={"prompt": "a", "n": 9, "max_tokens": 1})
        again = await srv.http.post("/v1/completions", json={"prompt": "a", "n": 9, "max_tokens": 1})
        after = fake.num_in_flight
        fits = await srv.http.post("/v1/completions", json={"prompt": "a", "n": 8, "max_tokens": 1})
    assert too_many.status_code == 400 and again.status_code == 400
    assert too_many.json()["error"]["param"] == "n" and "--max-queued-requests 8" in too_many.json()["error"]["message"]
    assert after == 0 and len(fake.submitted) == 8
    assert fits.status_code == 200 and len(fits.json()["choices"]) == 8
    assert fake.num_in_flight == 0


async def test_admission_counts_a_running_request_against_later_ones() -> None:
    fake = FakeEngineClient(max_queued_requests=3, token_delay_s=0.05)
    async with running(fake) as srv, anyio.create_task_group() as tg:
        results: dict[str, int] = {}

        async def long() -> None:
            r = await srv.http.post("/v1/completions", json={"prompt": "a", "n": 2, "max_tokens": 40})
            results["long"] = r.status_code

        tg.start_soon(long)
        await fake.wait_until(lambda: fake.num_active == 2)
        refused = await srv.http.post("/v1/completions", json={"prompt": "a", "n": 2, "max_tokens": 1})
        one_fits = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
    assert refused.status_code == 429 and one_fits.status_code == 200 and results["long"] == 200
    assert fake.num_in_flight == 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("n", [1, 3])
async def test_in_flight_returns_to_zero_after_every_kind_of_error(stream: bool, n: int) -> None:
    fake = FakeEngineClient(max_queued_requests=8, num_ranks=2)
    body = {"prompt": "a", "max_tokens": 4, "n": n, "stream": stream}
    async with running(fake) as srv:
        statuses = []
        # The client refuses the hint after admission (E2).
        statuses.append((await srv.http.post("/v1/completions", json={**body, "data_parallel_rank": 5})).status_code)
        # The engine dies mid-request; then the server abandons a request (shutdown deadline).
        fake.fail_after_tokens = 2
        statuses.append((await srv.http.post("/v1/completions", json=body)).status_code)
        fake.fail_after_tokens_with = ShuttingDownError("the shutdown deadline passed")
        statuses.append((await srv.http.post("/v1/completions", json=body)).status_code)
        fake.fail_after_tokens = fake.fail_after_tokens_with = None
        # A bug in the engine client.
        fake.fail_with = RuntimeError("boom")
        statuses.append((await srv.http.post("/v1/completions", json=body)).status_code)
        fake.fail_with = None
        # The client leaves in the middle.
        fake.token_delay_s = 0.05
        with anyio.move_on_after(0.1):
            await srv.http.post("/v1/completions", json={**body, "max_tokens": 100})
        await fake.wait_until(lambda: fake.num_active == 0)
        fake.token_delay_s = 0.0
        ok = await srv.http.post("/v1/completions", json={**body, "n": 8, "stream": False})
    assert statuses[0] == 400
    assert statuses[1:3] == ([200, 200] if stream else [503, 503])
    assert statuses[3] == 500
    assert ok.status_code == 200
    assert fake.num_in_flight == 0


async def test_server_abandoning_a_request_is_503_naming_the_cause_and_an_error_event_when_streaming() -> None:
    fake = FakeEngineClient()
    fake.fail_after_tokens = 2
    fake.fail_after_tokens_with = ShuttingDownError("the server is shutting down (drain deadline)")
    async with running(fake) as srv:
        whole = await srv.http.post("/v1/chat/completions",
                                    json={"messages": [{"role": "user", "content": "a"}], "max_tokens": 5})
        streamed = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 5, "stream": True})
    assert whole.status_code == 503
    assert "drain deadline" in whole.json()["error"]["message"]
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    error = orjson.loads(events[-2])["error"]
    assert error["code"] == 503 and "drain deadline" in error["message"]
    assert all("finish_reason" not in e or orjson.loads(e)["choices"][0]["finish_reason"] != "abort"
               for e in events[:-2])
    assert fake.num_in_flight == 0
