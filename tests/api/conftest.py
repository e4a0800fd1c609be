"""Helpers for HTTP tests: a real Hypercorn server on 127.0.0.1, port 0, over a FakeEngineClient.

Tests are marked ``@pytest.mark.anyio`` and run on both backends through the ``anyio_backend`` fixture below:
asyncio serves the ``Quart`` app, trio the ``QuartTrio`` app. ``GrammarFake`` writes its reply as the engine
samples under the request's grammar (the engine's own matchers), for tests of where a constraint applies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import httpx
import openai
import pytest
import sniffio

from asyncdp.api import create_app, serve_http
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import FakeEngineClient


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@dataclass
class Server:
    fake: FakeEngineClient
    app: Any
    base_url: str
    http: httpx.AsyncClient
    stop: anyio.Event

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0,
                                  http_client=self.http)


@asynccontextmanager
async def running(
    fake: FakeEngineClient | None = None, *, shutdown_timeout_s: float = 2.0, **app_kwargs: Any,
) -> AsyncIterator[Server]:
    """Serve a fresh app until the block ends (then cancel the server)."""
    fake = fake if fake is not None else FakeEngineClient()
    backend = sniffio.current_async_library()
    app = create_app(fake, backend=backend, metrics=fake.metrics, **app_kwargs)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(partial(serve_http, app, shutdown_timeout_s=shutdown_timeout_s,
                                            shutdown_trigger=stop.wait))
        base_url = f"http://{host}:{port}"
        async with httpx.AsyncClient(base_url=base_url, timeout=10.0) as http:
            yield Server(fake, app, base_url, http, stop)
        tg.cancel_scope.cancel()


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [block[len("data: "):] for block in text.split("\n\n") if block.startswith("data: ")]


async def whole_and_streamed(client: Any, body: dict[str, Any]) -> tuple[Any, Any]:
    """The answer to ``body`` whole, and streamed as the ``openai`` library's stream helper accumulates it."""
    whole = await client.chat.completions.create(**body)
    async with client.chat.completions.stream(**body) as stream:
        return whole, await stream.get_final_completion()


class GrammarFake(FakeEngineClient):
    """A fake that writes ``reply`` (one id per character, as ``replies``) the way the engine samples it under
    the request's ``structured`` constraint: the engine's ``GrammarMatchers`` see every id; while the grammar waits
    for its start the ids pass as written, after it an id the grammar forbids becomes the lowest one it allows (as
    the engine tests' masking executor), and the reply ends where the grammar completes. One request at a time."""

    def __init__(self, reply: str, **kwargs: Any) -> None:
        super().__init__(replies=self._reply, **kwargs)
        self.reply = reply
        self._params: list[SamplingParams] = []  # generate()'s, in order: each taken by the reply it asks for

    def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 **kwargs: Any) -> Any:
        self._params.append(params)
        return super().generate(request_id, prompt_token_ids, params, **kwargs)

    def _reply(self, _prompt: str, _seed: int | None) -> str:
        from asyncdp.engine.executor import ScheduledChunk
        from asyncdp.engine.structured import GrammarMatchers

        params = self._params.pop(0)
        if params.structured is None:
            return self.reply
        eos = self.tokenizer.eos_token_id
        matchers = GrammarMatchers(self.tokenizer, len(self.tokenizer), {eos})
        matchers.add("r", params.structured)
        chunk = ScheduledChunk("r", [], 0, [], True, params, 0)
        written = []
        for token in map(ord, self.reply):
            masks = matchers.token_masks([chunk])
            if masks is not None and not masks.allowed(matchers.vocab_size)[0, token]:
                token = int(masks.allowed(matchers.vocab_size)[0].argmax())  # the lowest allowed
                if token == eos:
                    break
            written.append(chr(token))
            if matchers.advance("r", token):
                break
        return "".join(written)
