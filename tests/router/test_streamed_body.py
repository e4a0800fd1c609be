"""A body larger than ``--replay-buffer-bytes`` goes to the endpoint as it arrives, not after it arrived whole; one
over ``--max-request-body-bytes`` is a 413 the client reads (not a reset), chunked or not. Through a real router
process in front of a real upstream (:mod:`tests.router.upstream`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.router.upstream import EchoUpstream, echo_upstream, header_values, routed, stop

pytestmark = pytest.mark.anyio

REPLAY = 64 * 1024
LIMIT = 1024 * 1024
ARGS = ("--replay-buffer-bytes", str(REPLAY), "--max-request-body-bytes", str(LIMIT))


def in_parts(upstream: EchoUpstream, first: bytes, last: bytes) -> AsyncIterator[bytes]:
    """A chunked body whose ``last`` part is sent only once the upstream received the start of the body: a router
    that holds the whole body before it forwards it never gets there."""
    async def parts() -> AsyncIterator[bytes]:
        yield first
        with anyio.fail_after(10):
            await upstream.body_started.wait()
        yield last

    return parts()


async def test_a_large_body_reaches_the_endpoint_while_the_client_still_sends_it(tmp_path: Path) -> None:
    first, last = os.urandom(4 * REPLAY), os.urandom(REPLAY)
    async with echo_upstream() as upstream, routed(tmp_path / "router.log", upstream.url, args=ARGS) as router:
        with anyio.fail_after(30):
            async with httpx.AsyncClient(base_url=router.base_url, timeout=20) as http:
                chunked = await http.post("/v1/completions", content=in_parts(upstream, first, last))
                whole = os.urandom(8 * REPLAY)
                sized = await http.post("/v1/completions", content=whole)
        assert chunked.status_code == 200, chunked.text
        seen = chunked.json()
        assert seen["body_bytes"] == len(first + last)
        assert seen["body_sha256"] == hashlib.sha256(first + last).hexdigest()
        assert header_values(seen, "transfer-encoding") == ["chunked"]
        assert sized.status_code == 200 and sized.json()["body_sha256"] == hashlib.sha256(whole).hexdigest()
        assert header_values(sized.json(), "content-length") == [str(len(whole))]  # the client's, kept
        assert sized.json()["body_events"] > 1
        assert await stop(router) == 0


async def test_a_body_over_the_limit_is_a_413_the_client_reads_chunked_or_sized(tmp_path: Path) -> None:
    async def chunked_over() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b"x" * (LIMIT // 2)

    async with echo_upstream() as upstream, routed(tmp_path / "router.log", upstream.url, args=ARGS) as router:
        with anyio.fail_after(30):
            async with httpx.AsyncClient(base_url=router.base_url, timeout=20) as http:
                streamed = await http.post("/v1/completions", content=chunked_over())
                sized = await http.post("/v1/completions", content=b"y" * (LIMIT + 1))
                after = await http.post("/v1/completions", content=b"{}")  # the router is fine, connection too
        for r in (streamed, sized):
            assert r.status_code == 413, r.text
            error = r.json()["error"]
            assert error["code"] == 413 and f"limit of {LIMIT} bytes (--max-request-body-bytes)" in error["message"]
        assert after.status_code == 200
        # the chunked one had started to stream and was cut off: no request over the limit reached the upstream
        assert [s["body_bytes"] for s in upstream.seen] == [2]
        assert await stop(router) == 0
        assert "Traceback" not in router.log()
