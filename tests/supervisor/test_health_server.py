"""The supervisor's HTTP endpoints (spec §11.3 "Endpoints") and its listening socket."""

from __future__ import annotations

import functools
import socket

import anyio
import httpx
import pytest

from asyncdp.errors import StartupError
from asyncdp.supervisor.health_server import create_health_app, ensure_port_free, listen_socket, serve_health


@pytest.mark.anyio
async def test_health_routes_follow_readiness_at_once_and_nothing_else_is_served(anyio_backend):
    serving = [False]
    app = create_health_app(lambda: serving[0], backend=anyio_backend)
    client = app.test_client()
    assert [(await client.get(p)).status_code for p in ("/health", "/ready", "/readyz")] == [503, 503, 503]
    serving[0] = True
    response = await client.get("/health")
    assert (response.status_code, await response.get_json()) == (200, {"status": "ready"})
    assert [(await client.get(p)).status_code for p in ("/ready", "/readyz")] == [200, 200]
    for path in ("/", "/v1/models", "/metrics", "/server_info", "/load"):
        assert (await client.get(path)).status_code == 404
    assert (await client.post("/health")).status_code == 405
    serving[0] = False
    assert (await client.get("/readyz")).status_code == 503


@pytest.mark.anyio
async def test_an_unknown_route_or_method_is_an_openai_style_json_error_as_on_the_children(anyio_backend):
    client = create_health_app(lambda: True, backend=anyio_backend).test_client()
    missing, method = await client.get("/v1/models"), await client.post("/health")
    assert missing.status_code == 404 and (await missing.get_json())["error"]["code"] == 404
    assert method.status_code == 405 and (await method.get_json())["error"]["code"] == 405
    assert "GET" in method.headers["Allow"]


def test_a_busy_port_is_a_startup_error_naming_what_and_the_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for check in (listen_socket, ensure_port_free):
            with pytest.raises(StartupError, match=f"cannot listen on the supervisor port 127.0.0.1:{port}: "):
                check("127.0.0.1", port, what="the supervisor port")


def test_ensure_port_free_leaves_the_port_free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ensure_port_free("127.0.0.1", port, what="x")
    listen_socket("127.0.0.1", port, what="x").close()


@pytest.mark.anyio
async def test_served_health_answers_on_the_socket_and_the_port_closes_when_it_stops(anyio_backend):
    sock = listen_socket("127.0.0.1", 0, what="the supervisor port")
    port = sock.getsockname()[1]
    stop = anyio.Event()
    app = create_health_app(lambda: True, backend=anyio_backend)
    url = f"http://127.0.0.1:{port}/health"
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(serve_health, app, sock, backend=anyio_backend, ssl=None,
                                             shutdown_trigger=stop.wait))
            sock.close()  # Hypercorn serves its own duplicate
            async with httpx.AsyncClient(timeout=5) as http:
                assert (await http.get(url)).status_code == 200
            stop.set()
        async with httpx.AsyncClient(timeout=5) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(url)
