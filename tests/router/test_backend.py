"""``asyncdp route --backend``: the router runs on asyncio (the default) or trio, as ``asyncdp serve`` does, and
behaves the same on both: it proxies a stream, drains it on SIGTERM, cuts it on a second signal, exits 0. The
tests run the router process on the test's own backend (``anyio_backend``, both by default), in front of a
streaming upstream served in the test's event loop. Why an upstream failure says nothing on trio is shown by
:func:`test_an_upstream_failure_is_described_by_the_first_cause_that_says_something`."""

from __future__ import annotations

import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
import sniffio

from asyncdp.api.serve import serve_http
from asyncdp.cli import build_parser, main
from asyncdp.router.command import settings_from
from asyncdp.router.poller import error_text
from tests.router.route_process import RouterProcess
from tests.router.upstream import IDLE_LOAD, routed

pytestmark = pytest.mark.anyio

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
VERIFY_FAILED = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate (_ssl.c:1006)"


def test_the_backend_is_asyncio_unless_given_and_trio_can_be() -> None:
    parse = build_parser().parse_args
    assert settings_from(parse(["route", "--endpoint", "http://h:1"])).backend == "asyncio"
    assert settings_from(parse(["route", "--endpoint", "http://h:1", "--backend", "trio"])).backend == "trio"


def test_an_unknown_backend_is_one_error_line_and_exit_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["route", "--endpoint", "http://h:1", "--backend", "curio"]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == ["asyncdp: error: --backend must be one of asyncio, trio, got 'curio'"]


def test_an_upstream_failure_is_described_by_the_first_cause_that_says_something() -> None:
    """httpx on trio raises a ConnectError with no message for a certificate that does not verify; the reason is
    its cause's cause. The router names it (``/health``, its log) instead of ``ConnectError: ``."""
    try:
        try:
            try:
                raise ssl.SSLCertVerificationError(1, VERIFY_FAILED)
            except ssl.SSLError as exc:
                raise anyio.BrokenResourceError from exc
        except anyio.BrokenResourceError as exc:
            raise httpx.ConnectError("") from exc
    except httpx.ConnectError as exc:
        assert error_text(exc) == f"ConnectError: {VERIFY_FAILED}"
    assert error_text(httpx.ConnectError("refused")) == "ConnectError: refused"
    assert error_text(httpx.ReadError("")) == "ReadError"


@dataclass
class HeldStream:
    """An upstream whose ``POST /v1/completions`` streams ``data: 1``, then waits for :attr:`release` before
    ``data: 2`` and the end; it records whether the request ended early (its client went away)."""

    url: str = ""
    started: anyio.Event = field(default_factory=anyio.Event)
    release: anyio.Event = field(default_factory=anyio.Event)
    cut: anyio.Event = field(default_factory=anyio.Event)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/load":
            data = orjson.dumps(IDLE_LOAD)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": data})
            return
        while (await receive()).get("more_body", False):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        self.started.set()
        async with anyio.create_task_group() as tg:
            async def watch_client() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                if not self.release.is_set():  # (a disconnect after the answer is no cut)
                    self.cut.set()
                tg.cancel_scope.cancel()

            tg.start_soon(watch_client)
            await self.release.wait()
            await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            tg.cancel_scope.cancel()


@asynccontextmanager
async def held_stream() -> AsyncIterator[HeldStream]:
    app = HeldStream()
    async with anyio.create_task_group() as tg:
        host, port = (await tg.start(lambda task_status: serve_http(app, host="127.0.0.1", port=0,
                                                                    shutdown_timeout_s=0.0,
                                                                    task_status=task_status)))[:2]
        app.url = f"http://{host}:{port}"
        yield app
        tg.cancel_scope.cancel()


async def signal_and_wait_logged(router: RouterProcess, sig: signal.Signals, line: str) -> None:
    """Send ``sig``, then wait until the router's log shows ``line`` (polling a real process's log; the callers'
    deadlines bound it)."""
    router.process.send_signal(sig)
    while line not in router.log():  # noqa: ASYNC110 - another process's log
        await anyio.sleep(0.02)


async def test_sigterm_drains_a_stream_in_flight_on_the_backend_given(tmp_path: Path) -> None:
    backend = sniffio.current_async_library()
    async with held_stream() as upstream, routed(tmp_path / "router.log", upstream.url,
                                                 args=("--shutdown-timeout", "20")) as router:
        assert f"(1 usable now); backend {backend}" in router.log()
        with anyio.fail_after(20):
            async with (httpx.AsyncClient(base_url=router.base_url, timeout=10) as http,
                        http.stream("POST", "/v1/completions", json={"stream": True}) as r):
                events = r.aiter_raw()
                assert await events.__anext__() == b"data: 1\n\n"
                await signal_and_wait_logged(router, signal.SIGTERM, "received SIGTERM: draining")
                upstream.release.set()  # in flight during the drain: it finishes
                rest = b"".join([chunk async for chunk in events])
            assert rest == b"data: 2\n\n"
            assert await anyio.to_thread.run_sync(router.wait_exit) == 0
    log = router.log()
    assert "received SIGTERM: draining" in log and "router stopped; exit status 0" in log and "Traceback" not in log


async def test_a_second_signal_cuts_the_stream_in_flight_and_its_upstream_sees_it_end(tmp_path: Path) -> None:
    async with held_stream() as upstream, routed(tmp_path / "router.log", upstream.url,
                                                 args=("--shutdown-timeout", "20")) as router:
        with anyio.fail_after(20):
            async with (httpx.AsyncClient(base_url=router.base_url, timeout=10) as http,
                        http.stream("POST", "/v1/completions", json={"stream": True}) as r):
                events = r.aiter_raw()
                assert await events.__anext__() == b"data: 1\n\n"
                await signal_and_wait_logged(router, signal.SIGTERM, "received SIGTERM: draining")
                router.process.send_signal(signal.SIGINT)
                with pytest.raises(httpx.RemoteProtocolError):  # cut off: no end of the chunked body
                    async for _ in events:
                        pass
            await upstream.cut.wait()
            assert await anyio.to_thread.run_sync(router.wait_exit) == 0
    log = router.log()
    assert "received SIGINT again: cancelling the 1 requests in flight now" in log and "Traceback" not in log
