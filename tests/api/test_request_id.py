"""vLLM's ``request_id`` and ``X-Request-Id``: the response's id; never an engine's key; bounded; and
``spaces_between_special_tokens`` reaching the sampling parameters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import openai
import pytest

from asyncdp.api.request_ids import MAX_REQUEST_ID_CHARS
from asyncdp.messages import RequestOutput
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running
from tests.api.test_chat_auto_tool_choice import STREAM_WARNING

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.filterwarnings(STREAM_WARNING)
async def test_request_id_names_the_response_as_vllm_does() -> None:
    async with running() as srv:
        client = srv.openai()
        chat = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=2,  # type: ignore[arg-type]
                                                    extra_body={"request_id": "my-req.1"})
        completion = await client.completions.create(model="fake-model", prompt="a", max_tokens=2, n=2,
                                                     extra_body={"request_id": "my-req.1"})
        stream = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=3,  # type: ignore[arg-type]
                                                      stream=True, extra_body={"request_id": "s-1"})
        chunk_ids = {chunk.id async for chunk in stream}
        plain = await client.completions.create(model="fake-model", prompt="a", max_tokens=1)
    assert chat.id == "chatcmpl-my-req.1" and completion.id == "cmpl-my-req.1"
    assert chunk_ids == {"chatcmpl-s-1"}
    assert plain.id.startswith("cmpl-") and len(plain.id) == len("cmpl-") + 32
    engine_ids = [rid for rid, *_ in srv.fake.submitted]
    assert len(set(engine_ids)) == len(engine_ids)  # the engines' keys are the server's own
    assert not any("my-req" in rid or "s-1" in rid for rid in engine_ids)


async def test_x_request_id_header_wins_over_the_body_field() -> None:
    async with running() as srv:
        client = srv.openai()
        chat = await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=1,  # type: ignore[arg-type]
                                                    extra_headers={"X-Request-Id": "from-header"},
                                                    extra_body={"request_id": "from-body"})
        completion = await client.completions.create(model="fake-model", prompt="a", max_tokens=1,
                                                     extra_headers={"X-Request-Id": "from-header"})
    assert chat.id == "chatcmpl-from-header" and completion.id == "cmpl-from-header"


class GatedClient(FakeEngineClient):
    """Holds every request until ``num_requests`` have been submitted, so they are all in flight together."""

    def __init__(self, num_requests: int) -> None:
        super().__init__()
        self._num_waiting = num_requests
        self._all_in = anyio.Event()

    def generate(self, request_id: str, *args: Any, **kwargs: Any) -> AsyncIterator[RequestOutput]:
        inner = super().generate(request_id, *args, **kwargs)

        async def gated() -> AsyncIterator[RequestOutput]:
            self._num_waiting -= 1
            if self._num_waiting == 0:
                self._all_in.set()
            await self._all_in.wait()
            async for out in inner:
                yield out

        return gated()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_two_requests_in_flight_with_one_request_id_both_complete(path: str) -> None:
    fake = GatedClient(num_requests=2)
    results: dict[str, Any] = {}
    async with running(fake) as srv:
        client = srv.openai()

        async def one(prompt: str) -> None:
            if path == "/v1/completions":
                r: Any = await client.completions.create(model="fake-model", prompt=prompt, max_tokens=8,
                                                         extra_body={"request_id": "same"})
                results[prompt] = (r.id, r.choices[0].text)
            else:
                r = await client.chat.completions.create(
                    model="fake-model", messages=[{"role": "user", "content": prompt}], max_tokens=8,
                    extra_body={"request_id": "same"})
                results[prompt] = (r.id, r.choices[0].message.content)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "first prompt")
            tg.start_soon(one, "second, longer prompt")
    expected = {}
    for _, ids, params, _ in fake.submitted:
        expected[fake.tokenizer.decode(ids)] = bytes(fake.expected_token_ids(ids, params.seed, 8)).decode()
    prefix = "cmpl-" if path == "/v1/completions" else "chatcmpl-"
    assert {rid for rid, _ in results.values()} == {prefix + "same"}
    assert sorted(text for _, text in results.values()) == sorted(expected.values())
    assert len({text for _, text in results.values()}) == 2  # each got its own answer
    assert len(fake.finished) == 2 and fake.aborted == []


@pytest.mark.parametrize("value", ["", "has space", "new\nline", "caf\u00e9", "x" * (MAX_REQUEST_ID_CHARS + 1), 5])
async def test_a_bad_request_id_is_400_naming_it(value: object) -> None:
    async with running() as srv:
        client = srv.openai()
        with pytest.raises(openai.BadRequestError) as chat:
            await client.chat.completions.create(model="fake-model", messages=CHAT,  # type: ignore[arg-type]
                                                 extra_body={"request_id": value})
        with pytest.raises(openai.BadRequestError) as completion:
            await client.completions.create(model="fake-model", prompt="a", extra_body={"request_id": value})
        header = await srv.http.post("/v1/completions", json={"prompt": "a"},
                                     headers={"X-Request-Id": "a b"})
        longest = await srv.http.post("/v1/completions", json={
            "prompt": "a", "max_tokens": 1, "request_id": "x" * MAX_REQUEST_ID_CHARS})
    for exc in (chat.value, completion.value):
        assert exc.status_code == 400 and exc.body["param"] == "request_id"  # type: ignore[index]
    assert header.status_code == 400 and header.json()["error"]["param"] == "request_id"
    assert "X-Request-Id" in header.json()["error"]["message"]
    assert longest.status_code == 200 and longest.json()["id"] == "cmpl-" + "x" * MAX_REQUEST_ID_CHARS
    assert srv.fake.submitted[:-1] == []


async def test_spaces_between_special_tokens_reaches_the_sampling_params() -> None:
    async with running() as srv:
        client = srv.openai()
        await client.completions.create(model="fake-model", prompt="a", max_tokens=1,
                                        extra_body={"spaces_between_special_tokens": False,
                                                    "skip_special_tokens": False})
        await client.chat.completions.create(model="fake-model", messages=CHAT, max_tokens=1,  # type: ignore[arg-type]
                                             extra_body={"spaces_between_special_tokens": False})
        await client.completions.create(model="fake-model", prompt="a", max_tokens=1)
        wrong = await srv.http.post("/v1/completions", json={"prompt": "a", "spaces_between_special_tokens": "no"})
    flags = [params.spaces_between_special_tokens for _, _, params, _ in srv.fake.submitted]
    assert flags == [False, False, True]
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "spaces_between_special_tokens"
