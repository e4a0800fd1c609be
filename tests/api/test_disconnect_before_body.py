"""A client that disconnects while a stream's response headers are being written: the request's sequences are
aborted and its admission released. Quart sends ``http.response.start`` before it enters the body, so the
handler task is cancelled inside that ``send`` and the body generator (whose ``finally`` closed the fanout)
never starts; the fanout is closed when the request's ASGI call ends instead (``asyncdp.api.request_close``).

In-process, under both backends: the real app over a FakeEngineClient, and an ASGI server stub whose header
write discovers the closed connection (as Hypercorn's ``drain()`` -> ``ConnectionResetError`` -> disconnect
does) and suspends a few scheduler turns."""

from __future__ import annotations

import json

import anyio
import anyio.lowlevel
import pytest
import sniffio

from asyncdp.api import create_app
from asyncdp.testing import FakeEngineClient

pytestmark = pytest.mark.anyio


async def _call(app: object, path: str, payload: dict, yields: int) -> list[dict]:
    send_in, receive_from = anyio.create_memory_object_stream[dict](8)
    await send_in.send({"type": "http.request", "body": json.dumps(payload).encode(), "more_body": False})
    sent: list[dict] = []

    async def receive() -> dict:
        return await receive_from.receive()

    async def send(message: dict) -> None:
        sent.append(message)
        if message["type"] == "http.response.start":
            await send_in.send({"type": "http.disconnect"})  # the write found the peer gone
            for _ in range(yields):  # the server notices (wait_closed() and such)
                await anyio.lowlevel.checkpoint()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"x"), (b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2), "extensions": {}}
    with send_in, receive_from:
        await app(scope, receive, send)  # type: ignore[operator]
    return sent


@pytest.mark.parametrize(("path", "payload"), [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2000, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000,
                              "stream": True, "n": 2}),
])
@pytest.mark.parametrize("yields", [5, 20])
async def test_a_disconnect_during_the_header_write_aborts_the_request(path: str, payload: dict,
                                                                       yields: int) -> None:
    fake = FakeEngineClient(max_model_len=4096)
    app = create_app(fake, backend=sniffio.current_async_library())
    async with app.test_app():
        sent = await _call(app, path, payload, yields)
        assert [m["type"] for m in sent] == ["http.response.start"]  # the body never started
        with anyio.move_on_after(5):  # only reached when the request leaked (it then never settles)
            await fake.wait_until(lambda: fake.num_in_flight == 0 and fake.num_active == 0)
        assert (fake.num_in_flight, fake.num_active) == (0, 0)
        assert len(fake.aborted) == payload.get("n", 1) and not fake.finished


async def test_a_stream_read_to_its_end_closes_once_and_finishes() -> None:
    fake = FakeEngineClient()
    app = create_app(fake, backend=sniffio.current_async_library())
    async with app.test_app():
        r = await app.test_client().post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": True})
        body = await r.get_data(as_text=True)
    assert r.status_code == 200 and body.endswith("data: [DONE]\n\n")
    assert len(fake.finished) == 1 and not fake.aborted and fake.num_in_flight == 0
