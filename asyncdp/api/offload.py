"""Run CPU-heavy request preparation (decoding big bodies, tokenization, chat templates, detokenization for
echo and logprobs) off the event loop, in worker threads bounded by one ``CapacityLimiter`` per app.

Small inputs stay inline: below ``INLINE_BODY_BYTES`` of body (or ``INLINE_TOKENS`` tokens to detokenize) the work
costs about what the hop to a thread and back costs, so the single-request fast path does not pay for it (see
``bench/frontend_overhead.py``). Measured on the 2-core CI box (loaded): a thread hop ~0.1-0.3 ms; the byte-level
test tokenizer encodes ~1 us/byte and decodes ~14 us/token, so the thresholds keep inline work near 1 ms at most.
Above them, the event loop only waits: heartbeats, other requests and streams go on while a 10 MB prompt is
tokenized. A small body that may carry a structured-output constraint (``may_constrain``) is prepared in a thread
too: compiling and probing a grammar it has not seen takes up to ~0.1 s (``asyncdp.sampling_params``), and the
llguidance calls release the GIL. The test is a byte scan for the parameters' names, so a false positive costs
only the thread hop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")

INLINE_BODY_BYTES = 1024
INLINE_TOKENS = 64
# The request parameters that carry a grammar (asyncdp.api.structured), as they appear in a JSON body.
_CONSTRAINT_KEYS = (b'"guided_json"', b'"guided_regex"', b'"guided_choice"', b'"guided_grammar"',
                    b'"structured_outputs"', b'"response_format"', b'"tool_choice"')  # a named or "required" one


def may_constrain(body: bytes | str) -> bool:
    """Whether a request body may name a structured-output constraint (a grammar to compile before it runs)."""
    raw = body.encode() if isinstance(body, str) else body
    return any(key in raw for key in _CONSTRAINT_KEYS)


def heavy_body(body: bytes | str) -> bool:
    """Whether preparing this request body belongs in a worker thread: a large body, or a grammar to check."""
    return len(body) > INLINE_BODY_BYTES or may_constrain(body)


class Offload:
    def __init__(self, num_threads: int | None = None) -> None:
        self.num_threads = num_threads or max(1, min(4, (os.cpu_count() or 1)))
        self._limiter: anyio.CapacityLimiter | None = None  # made on first use: it belongs to the running loop

    async def run(self, heavy: bool, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``: in a worker thread when ``heavy``, inline otherwise."""
        if not heavy:
            return fn(*args)
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.num_threads)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)
