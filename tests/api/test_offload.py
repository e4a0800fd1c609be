"""Big request preparation (tokenization, templates, detokenization for echo) runs in a worker thread; small
requests stay on the event loop, where the thread hop would cost more than the work."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from asyncdp.api.offload import INLINE_BODY_BYTES
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = pytest.mark.anyio


class ThreadRecordingTokenizer:
    """The fake's tokenizer, noting the thread of every encode/decode/template call."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.threads: list[int] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name in ("encode", "decode", "apply_chat_template"):
            def recorded(*args: Any, **kwargs: Any) -> Any:
                self.threads.append(threading.get_ident())
                return attr(*args, **kwargs)
            return recorded
        return attr

    def __len__(self) -> int:
        return len(self._inner)


def recording_fake(max_model_len: int) -> tuple[FakeEngineClient, ThreadRecordingTokenizer]:
    fake = FakeEngineClient(max_model_len=max_model_len)
    tok = ThreadRecordingTokenizer(fake.tokenizer)
    fake._tokenizer = tok
    return fake, tok


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
async def test_large_prompt_is_tokenized_off_the_event_loop_and_a_small_one_inline(path: str) -> None:
    fake, tok = recording_fake(max_model_len=4 * INLINE_BODY_BYTES)
    loop_thread = threading.get_ident()

    def body(text: str) -> dict[str, Any]:
        if path == "/v1/chat/completions":
            return {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
        return {"prompt": text, "max_tokens": 1} if path == "/v1/completions" else {"prompt": text}

    async with running(fake) as srv:
        small = await srv.http.post(path, json=body("hi"))
        small_threads = list(tok.threads)
        tok.threads.clear()
        large = await srv.http.post(path, json=body("x" * (2 * INLINE_BODY_BYTES)))
    assert small.status_code == 200 and large.status_code == 200, large.text
    assert small_threads and set(small_threads) == {loop_thread}
    assert tok.threads and loop_thread not in tok.threads


async def test_echo_of_a_long_prompt_is_detokenized_off_the_event_loop() -> None:
    fake, tok = recording_fake(max_model_len=16384)
    loop_thread = threading.get_ident()
    async with running(fake) as srv:
        tok.threads.clear()  # (the app renders the chat template once at startup, to check its content format)
        r = await srv.http.post("/v1/completions", json={"prompt": list(range(97, 123)) * 400, "max_tokens": 1,
                                                         "echo": True, "logprobs": 1})
    assert r.status_code == 200
    assert len(r.json()["choices"][0]["logprobs"]["tokens"]) == 10401
    assert tok.threads and loop_thread not in tok.threads


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_small_request_with_a_grammar_is_checked_off_the_event_loop(path: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling and probing a new grammar takes up to ~0.1 s: never on the event loop, however small the body."""
    pytest.importorskip("llguidance", reason="structured outputs need llguidance")
    import asyncdp.sampling_params.structured as sp

    threads: list[int] = []
    check = sp.check_grammar

    def recorded(kind: str, text: str, whitespace_pattern: str | None = None) -> str:
        threads.append(threading.get_ident())
        return check(kind, text, whitespace_pattern)

    monkeypatch.setattr(sp, "check_grammar", recorded)
    fake, tok = recording_fake(max_model_len=256)
    loop_thread = threading.get_ident()
    body: dict[str, Any] = {"prompt": "hi"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "hi"}]}
    async with running(fake) as srv:
        plain = await srv.http.post(path, json={**body, "max_tokens": 1})
        plain_threads = list(tok.threads)
        tok.threads.clear()
        refused = await srv.http.post(path, json={**body, "max_tokens": 1, "guided_regex": "a{99999999}"})
    assert plain.status_code == 200 and set(plain_threads) == {loop_thread}
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "guided_regex"
    assert threads and loop_thread not in threads
