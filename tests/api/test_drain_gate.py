"""While an API process drains (its client's ``begin_shutdown``, the ``--shutdown-timeout`` window), a new request
gets the drain gate's 503 "The server is shutting down." before it is read, as once HTTP itself stops.

``asyncdp route`` fails a request over to another endpoint on exactly that answer (docs/howto/external-lb.md,
"a rolling restart loses nothing"). The defect: during the drain the gate was open, so the request was read and
admission refused it with "the server is shutting down", a 503 the router handed to the client; and ``/load``
still answered 200, so the router kept choosing the draining endpoint.
"""

from __future__ import annotations

import pytest

from asyncdp.api.context import DRAINING_MESSAGE
from tests.api.conftest import running

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "a", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 2}),
])
async def test_a_new_request_during_the_drain_gets_the_drain_gates_503_unread(path, body) -> None:
    async with running() as srv:
        srv.fake.shutting_down = True  # the API process began to drain; HTTP still serves
        r = await srv.http.post(path, json=body)
    assert r.status_code == 503 and r.json()["error"]["message"] == DRAINING_MESSAGE, r.text
    assert srv.fake.submitted == []


async def test_load_is_refused_during_the_drain_so_a_router_stops_choosing_the_endpoint() -> None:
    async with running() as srv:
        before = await srv.http.get("/load")
        srv.fake.shutting_down = True
        during = await srv.http.get("/load")
        info = await srv.http.get("/server_info")
    assert before.status_code == 200
    assert during.status_code == 503 and during.json()["error"]["message"] == DRAINING_MESSAGE
    assert info.status_code == 200  # observation stays open
