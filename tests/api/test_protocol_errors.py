"""Requests Hypercorn's HTTP/1.1 parser refuses get an OpenAI-style JSON error from ``asyncdp serve``'s HTTP layer
(real Hypercorn on 127.0.0.1, port 0, raw sockets; both backends).

Before the fix: ``Content-Length: abc`` and ``garbage`` were a ``400`` with no reason phrase and an empty body, a
70 kB header a bare ``431``, and ``Transfer-Encoding: gzip`` a bare ``501`` (a 5xx for bad client input).
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from urllib.parse import urlsplit

import h11
import hypercorn.protocol
import pytest
from hypercorn.protocol.h11 import H11Protocol

from asyncdp.api.protocol_errors import (
    TESTED_HYPERCORN,
    JsonErrorH11Protocol,
    hook_fits,
    protocol_error_answer,
)
from tests.api.conftest import running
from tests.api.malformed_requests import MALFORMED, problems, send_raw


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_a_request_hypercorn_cannot_parse_gets_an_openai_error(name: str) -> None:
    request, status, word = MALFORMED[name]
    async with running() as server:
        port = urlsplit(server.base_url).port
        assert port is not None
        answer = await send_raw(port, request)
        assert problems(answer, status, word) == [], answer
        assert (await server.http.get("/v1/models")).status_code == 200  # the server is none the worse


def test_the_override_fits_the_installed_hypercorn() -> None:
    """Fails when Hypercorn changes: re-read hypercorn/protocol/h11.py against asyncdp/api/protocol_errors.py."""
    assert version("hypercorn") in TESTED_HYPERCORN
    assert hook_fits() == ""
    handler = inspect.getsource(H11Protocol._handle_events)
    assert "except h11.RemoteProtocolError as error:" in handler
    assert "await self._send_error_response(error.error_status_hint)" in handler
    assert "H11Protocol(" in inspect.getsource(hypercorn.protocol.ProtocolWrapper.__init__)
    assert issubclass(JsonErrorH11Protocol, H11Protocol)


def test_the_answer_names_the_refused_transfer_coding_and_is_never_a_5xx() -> None:
    te = h11.RemoteProtocolError("Only Transfer-Encoding: chunked is supported", 501)
    head = b"POST / HTTP/1.1\r\nHost: x\r\ntransfer-encoding:  Br \r\n\r\nbody"
    assert protocol_error_answer(501, te, head, 16384) == (
        400, "unsupported Transfer-Encoding 'Br': only 'chunked' is supported (or send Content-Length)")
    assert protocol_error_answer(501, te, b"", 16384)[0] == 400
    twice = h11.RemoteProtocolError("multiple Transfer-Encoding headers", 501)
    assert protocol_error_answer(501, twice, head, 16384)[0] == 400
    assert protocol_error_answer(431, h11.RemoteProtocolError("Receive buffer too long", 431), b"", 100) == (
        431, "the request's head (request line and headers) is too large: keep it under 100 bytes")
    assert protocol_error_answer(400, h11.RemoteProtocolError("bad Content-Length", 400), b"", 1) == (
        400, "malformed HTTP request: bad Content-Length")
    assert protocol_error_answer(505, None, b"", 1) == (400, "malformed HTTP request: HTTP Version Not Supported")


def test_a_refused_line_is_quoted_as_text_not_as_a_python_bytearray() -> None:
    for raw, line in ((b"GARBAGE LINE\r\n\r\n", "illegal request line: 'GARBAGE LINE'"),
                      (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", "illegal header line: 'Bad Header'"),
                      (b"it's \"x\" \xff\r\n\r\n", "illegal request line: 'it\\'s \"x\" \xff'")):
        parser = h11.Connection(h11.SERVER)
        parser.receive_data(raw)
        with pytest.raises(h11.RemoteProtocolError) as refused:
            parser.next_event()
        assert "bytearray" in str(refused.value)  # what h11 says
        assert protocol_error_answer(400, refused.value, raw, 16384) == (400, f"malformed HTTP request: {line}")
