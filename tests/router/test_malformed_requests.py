"""Requests an HTTP/1.1 parser refuses, and a target with leading slashes, sent byte for byte to a real ``asyncdp
route`` process (on each backend) in front of a real upstream.

Before the fix: the router answered ``Content-Length: abc`` and ``garbage`` with a bare ``400`` (no reason phrase,
empty body), a 70 kB header with a bare ``431`` and ``Transfer-Encoding: gzip`` with a bare ``501``, as ``asyncdp
serve`` did; and ``GET //v1/models``, which ``asyncdp serve`` serves as ``/v1/models``, was a 404 (not a route).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from asyncdp.router.target import request_target
from tests.api.malformed_requests import MALFORMED, problems, send_raw
from tests.router.upstream import echo_upstream, routed, stop


@pytest.mark.anyio
async def test_the_router_answers_what_serve_answers_to_malformed_requests_and_leading_slashes(
        tmp_path: Path) -> None:
    async with echo_upstream() as upstream, routed(tmp_path / "router.log", upstream.url) as router:
        found = {name: problems(await send_raw(router.port, request), status, word)
                 for name, (request, status, word) in MALFORMED.items()}
        assert {name: p for name, p in found.items() if p} == {}
        assert upstream.seen == []  # none of them reached the endpoint

        def get(target: bytes) -> bytes:
            return b"GET %s HTTP/1.1\r\nHost: router\r\nConnection: close\r\n\r\n" % target

        answer = await send_raw(router.port, get(b"//v1/models?x=1"))
        assert answer.status == 200, answer
        assert answer.json()["target"] == "/v1/models?x=1"  # forwarded as the path the router routed on
        for target in (b"//pause", b"///v1/../pause", b"//health/../pause"):
            answer = await send_raw(router.port, get(target))
            assert answer.status == 404, (target, answer)
            assert set(orjson.loads(answer.body)["error"]) == {"message", "type", "param", "code"}
        assert len(upstream.seen) == 1
        assert await stop(router) == 0
    assert "Traceback" not in router.log()


def test_a_run_of_leading_slashes_is_one_as_serve_reads_it() -> None:
    def target(raw: bytes, query: bytes = b"") -> tuple[str, bytes, int]:
        t = request_target({"path": raw.decode(), "raw_path": raw, "query_string": query})
        return t.path, t.raw, t.error

    assert target(b"//v1/models", b"a=1") == ("/v1/models", b"/v1/models?a=1", 0)
    assert target(b"///tokenize")[:2] == ("/tokenize", b"/tokenize")
    assert target(b"//v1/../pause")[2] == 404
    assert target(b"/v1//models")[:2] == ("/v1//models", b"/v1//models")  # further on: as it came
