"""Requests no HTTP/1.1 parser accepts, as raw bytes, and a reader of the raw answers, shared by the served app's
tests (``tests/api/test_protocol_errors.py``) and the router's (``tests/router/test_malformed_requests.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import orjson

# name -> (request, expected status, a word the error message must hold)
MALFORMED: dict[str, tuple[bytes, int, str]] = {
    "bad-content-length": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400,
                           "Content-Length"),
    "oversized-headers": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431,
                          "too large"),
    "transfer-encoding-gzip": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400,
                               "'gzip'"),
    "garbage": (b"garbage\r\n\r\n", 400, "malformed HTTP request"),
}


@dataclass
class Answer:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


async def send_raw(port: int, request: bytes) -> Answer:
    """Send ``request`` as it is to 127.0.0.1:``port`` and read until the server closes (10 s at most)."""
    data = b""
    with anyio.fail_after(10):
        async with await anyio.connect_tcp("127.0.0.1", port) as conn:
            try:
                await conn.send(request)
            except (anyio.BrokenResourceError, ConnectionError):
                pass  # the server answered and closed before it read everything (the 70 kB head)
            try:
                while chunk := await conn.receive():
                    data += chunk
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                pass
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    _, status, reason = (status_line.split(" ", 2) + [""])[:3]
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return Answer(int(status), reason, headers, body)


def problems(answer: Answer, status: int, word: str) -> list[str]:
    """What breaks the contract for a malformed request's answer (empty when it holds)."""
    found = []
    if answer.status != status:
        found.append(f"status {answer.status}, wanted {status}")
    if not answer.reason:
        found.append("no reason phrase")
    if answer.headers.get("content-type") != "application/json":
        found.append(f"content-type {answer.headers.get('content-type')!r}")
    if answer.headers.get("connection", "").lower() != "close":
        found.append("no connection: close")
    try:
        error = answer.json()["error"]
    except (ValueError, KeyError, TypeError):
        return [*found, f"body {answer.body[:200]!r} is no OpenAI error"]
    if set(error) != {"message", "type", "param", "code"} or error["code"] != status or error["param"] is not None:
        found.append(f"error {error!r} is not OpenAI's shape with code {status}")
    if word not in error["message"]:
        found.append(f"message {error['message']!r} does not say {word!r}")
    return found
