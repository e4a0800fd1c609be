"""One streamed completion on the wire, as the HTTP replay (``bench/http_replay.py``) sends and reads it: the
request body of a record (token-id prompt, exactly ``output_length`` tokens, streamed with continuous usage), the
check that it goes to 127.0.0.1 only, and the reading of its SSE lines: a chunk, the ``[DONE]`` marker, the tokens
so far, an error event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from asyncdp.errors import ConfigError

LOOPBACK = "127.0.0.1"


def completion_body(model: str, prompt: Sequence[int], output_length: int) -> dict[str, Any]:
    """The request of one record: token-id prompt, exactly ``output_length`` tokens, streamed with usage."""
    return {"model": model, "prompt": list(prompt), "max_tokens": output_length, "min_tokens": output_length,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def check_loopback(base_url: str) -> None:
    if urlsplit(base_url).hostname != LOOPBACK:
        raise ConfigError(f"http_replay only sends to {LOOPBACK}, not {base_url!r}.")


DONE = "[DONE]"


def parse_sse_line(line: str) -> dict[str, Any] | str | None:
    """One SSE line: the chunk's JSON object, :data:`DONE` for the end marker, None for anything else."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == DONE:
        return DONE
    chunk = json.loads(data)
    return chunk if isinstance(chunk, dict) else None


def chunk_tokens(chunk: Mapping[str, Any]) -> int | None:
    """Tokens so far by a choice chunk's continuous usage; None for the final usage-only chunk (no choices)."""
    usage = chunk.get("usage")
    if not chunk.get("choices") or not isinstance(usage, dict):
        return None
    return int(usage.get("completion_tokens", 0))


def error_text(chunk: Mapping[str, Any]) -> str | None:
    err = chunk.get("error")
    if err is None:
        return None
    return str(err.get("message", err)) if isinstance(err, dict) else str(err)
