"""``serve_http`` (what ``asyncdp serve`` and ``asyncdp route`` serve HTTP with) holds asyncio's flood of
``socket.send() raised exception.`` lines back while it serves, and only then.

The end-to-end test of the flood (``tests/e2e/test_process_lifecycle.py``, 100 streams reset at once) no longer
makes the server write to a reset connection more than five times, so it passes without the limiter too; this
test holds that the server installs it, with writes to reset connections made while it serves."""

from __future__ import annotations

import logging

import pytest

from tests.api.conftest import running
from tests.transport.test_send_warnings import send_warnings, writes_after_a_reset


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_send_warnings_are_limited_while_the_server_serves_and_not_after(
        caplog: pytest.LogCaptureFixture, anyio_backend: str) -> None:
    caplog.set_level(logging.WARNING, logger="asyncio")
    async with running() as server:
        assert (await server.http.get("/v1/models")).status_code == 200
        await writes_after_a_reset(num_connections=20, writes_each=12)
        assert len(send_warnings(caplog)) == 1  # without the limiter: 20 x (12 - 5) lines
    caplog.clear()
    await writes_after_a_reset(num_connections=2, writes_each=8)
    assert len(send_warnings(caplog)) > 1  # the server stopped: asyncio's own behaviour again
