"""Server-Sent Events framing: one JSON payload per ``data:`` line, never split by a line separator.

orjson escapes ``\\r`` and ``\\n`` (and every control character below U+0020) but writes U+0085 (NEL), U+2028 and
U+2029 raw. Line readers that follow ``str.splitlines`` (httpx's ``iter_lines``, used by guidellm and the
``openai`` client's SSE decoder) split there and the event no longer parses, so those three are written as
JSON escapes. In UTF-8 their byte sequences cannot occur inside another character, so a byte replace is exact.
"""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"

_RAW_SEPARATORS = ((b"\xc2\x85", b"\\u0085"), (b"\xe2\x80\xa8", b"\\u2028"), (b"\xe2\x80\xa9", b"\\u2029"))


def json_line_safe(payload: bytes) -> bytes:
    """``payload`` (orjson output) with every raw line separator escaped; the same JSON value."""
    if b"\xc2\x85" in payload or b"\xe2\x80" in payload:
        for raw, escaped in _RAW_SEPARATORS:
            payload = payload.replace(raw, escaped)
    return payload


def sse(obj: Any) -> bytes:
    """One ``data:`` event carrying ``obj`` as JSON."""
    return b"data: " + json_line_safe(orjson.dumps(obj)) + b"\n\n"
