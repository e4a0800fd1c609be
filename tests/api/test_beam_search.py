"""``use_beam_search`` (``asyncdp.api.beam_search``): the bookkeeping against a scripted toy model, and the routes
over a ``FakeEngineClient``: the choices, chat's stream of them, the refusals, and a client that leaves mid-search.

The toy model (max_tokens 2, no EOS): "A" 0.6 then "C"/"D" 0.5 each; "B" 0.4 then "C" 0.9. Greedy takes "A"
and ends at 0.30; beam search with two beams keeps "B" and finds "BC" at 0.36.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import anyio
import orjson
import pytest
from openai.types.chat import ChatCompletionChunk

from asyncdp.api.beam_search import Beam, BeamRules, BeamSearch
from asyncdp.messages import Logprob, TokenLogprobs
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running, sse_events

A, B, C, D, EOS = 1, 2, 3, 4, 0
TOY = {(): {A: 0.6, B: 0.4}, (A,): {C: 0.5, D: 0.5}, (B,): {C: 0.9, D: 0.1}}
CHAT = [{"role": "user", "content": "hi"}]


def _next(prefix: tuple[int, ...], num_top: int) -> TokenLogprobs:
    dist = sorted(TOY.get(prefix, {EOS: 1.0}).items(), key=lambda kv: -kv[1])
    top = tuple(Logprob(token_id=t, logprob=math.log(p)) for t, p in dist[:num_top])
    return TokenLogprobs(token_id=top[0].token_id, logprob=top[0].logprob, top=top)


def _search(width: int, steps: int = 2, **rules: object) -> list[Beam]:
    search = BeamSearch(BeamRules(width, num_prompt_tokens=1, eos_token_id=EOS, length_penalty=0.0,
                                  **rules))  # type: ignore[arg-type]
    for _ in range(steps):
        search.step([_next(b.token_ids, 2 * width) for b in search.live])
        if search.settled:
            break
    return search.result()


def test_beam_search_finds_the_likelier_sequence_that_greedy_misses() -> None:
    greedy, beams = _search(1), _search(2)
    assert greedy[0].token_ids == (A, C) and math.isclose(math.exp(greedy[0].cum_logprob), 0.30)
    assert [b.token_ids for b in beams] == [(B, C), (A, C)]
    assert math.isclose(math.exp(beams[0].cum_logprob), 0.36)
    assert [b.finish_reason for b in beams] == ["length", "length"]


def test_eos_finishes_a_beam_without_taking_a_place_and_ignore_eos_keeps_going() -> None:
    beams = _search(2, steps=3)  # after two tokens only EOS is left: every beam finishes
    assert all(b.finish_reason == "stop" and b.stop_reason == EOS and len(b.token_ids) == 2 for b in beams)
    assert beams[0].token_ids == (B, C) and math.isclose(math.exp(beams[0].cum_logprob), 0.36)
    kept = _search(2, steps=3, ignore_eos=True)
    assert all(b.finish_reason == "length" and b.token_ids[-1] == EOS for b in kept)


def test_the_score_is_vllms_length_penalised_cumulative_logprob() -> None:
    rules = BeamRules(2, num_prompt_tokens=3, eos_token_id=EOS, length_penalty=2.0)
    assert rules.score(Beam((A, B), cum_logprob=-5.0)) == -5.0 / 5 ** 2  # the prompt counts
    assert rules.score(Beam((A, EOS), cum_logprob=-5.0)) == -5.0 / 4 ** 2  # a trailing EOS does not


def test_a_stop_string_finishes_the_beam_cut_before_it() -> None:
    text = {A: "a", B: "b", C: "c", D: "d"}
    beams = _search(2, stop=("bc",), decode=lambda ids: "".join(text[t] for t in ids))
    assert beams[0] == Beam((B, C), beams[0].logprobs, beams[0].cum_logprob, "stop", "bc", "")


def test_min_tokens_keeps_eos_out_until_reached() -> None:
    assert all(b.finish_reason == "length" and len(b.token_ids) == 3 for b in _search(2, steps=3, min_tokens=3))


@pytest.mark.anyio
async def test_completions_return_n_distinct_beams_best_first_with_usage() -> None:
    async with running() as srv, srv.openai() as client:
        out = await client.completions.create(model="fake-model", prompt="abc", n=3, max_tokens=4, logprobs=0,
                                              extra_body={"use_beam_search": True, "length_penalty": 0.5})
        chat = await client.chat.completions.create(model="fake-model", messages=CHAT, n=2,  # type: ignore[arg-type]
                                                    max_tokens=3, extra_body={"use_beam_search": True})
    texts = [c.text for c in out.choices]
    assert [c.index for c in out.choices] == [0, 1, 2] and len(set(texts)) == 3
    sums = [sum(c.logprobs.token_logprobs) for c in out.choices]  # type: ignore[arg-type, union-attr]
    assert sums == sorted(sums, reverse=True)
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (3, 12)
    assert len({c.message.content for c in chat.choices}) == 2
    assert chat.usage is not None and chat.usage.completion_tokens == 6
    assert srv.fake.num_in_flight == 0 and all(p.max_tokens == 1 and p.logprobs in (6, 4)
                                               for _, _, p, _ in srv.fake.submitted)


@pytest.mark.anyio
@pytest.mark.parametrize(("extra", "param"), [
    ({"n": 11}, "n"), ({"temperature": 0.7}, "temperature"), ({"top_p": 0.5}, "top_p"),
    ({"n": 2, "best_of": 3}, "best_of"), ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"use_beam_search": False, "length_penalty": 1.0}, "length_penalty"),
])
async def test_what_beam_search_would_ignore_is_a_400_naming_it(extra: dict, param: str) -> None:
    async with running() as srv:
        for route, body in (("/v1/completions", {"prompt": "a"}), ("/v1/chat/completions", {"messages": CHAT})):
            r = await srv.http.post(route, json={**body, "use_beam_search": True, **extra})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert srv.fake.submitted == []


@pytest.mark.anyio
async def test_completions_refuse_stream_with_beam_search_as_vllm_does() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a", "use_beam_search": True, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream", r.text
    assert srv.fake.submitted == []


@pytest.mark.anyio
async def test_chat_streams_the_finished_beams_at_the_end_as_the_whole_answer() -> None:
    """vLLM's chat route streams a beam search: each choice's role chunk, then each beam whole in one chunk with
    its finish reason, the usage chunk, ``[DONE]``; the text is the non-streamed answer's."""
    body = {"model": "fake-model", "messages": CHAT, "n": 2, "max_tokens": 3, "logprobs": True, "top_logprobs": 1,
            "use_beam_search": True}
    async with running() as srv:
        whole = (await srv.http.post("/v1/chat/completions", json=body)).json()
        r = await srv.http.post("/v1/chat/completions", json={**body, "stream": True,
                                                              "stream_options": {"include_usage": True}})
        per_chunk = await srv.http.post("/v1/chat/completions", json={
            **body, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
        assert srv.fake.num_in_flight == 0
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks: list[dict[str, Any]] = [orjson.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert len(chunks) == 5, chunks  # a role chunk per choice, a beam per choice, the usage
    roles, beams, final = chunks[:2], chunks[2:4], chunks[4]
    assert [c["choices"] for c in roles] == [[{"index": i, "delta": {"role": "assistant", "content": ""},
                                               "logprobs": None, "finish_reason": None, "stop_reason": None}]
                                             for i in (0, 1)]
    assert all(c["usage"] is None for c in roles + beams)
    for chunk, choice in zip(beams, whole["choices"], strict=True):
        assert chunk["choices"] == [{"index": choice["index"], "delta": {"content": choice["message"]["content"]},
                                     "logprobs": choice["logprobs"], "finish_reason": choice["finish_reason"],
                                     "stop_reason": choice["stop_reason"]}]
    texts = ["", ""]  # accumulated as the official client reads the chunks
    for chunk in map(ChatCompletionChunk.model_validate, chunks):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert [c["message"]["content"] for c in whole["choices"]] == texts and len(set(texts)) == 2
    assert final["choices"] == [] and final["usage"] == whole["usage"]
    continuous = [orjson.loads(e) for e in sse_events(per_chunk.text)[:-1]]
    assert [c["usage"]["completion_tokens"] for c in continuous] == [0, 0, 3, 3, 6]


@pytest.mark.anyio
@pytest.mark.parametrize(("route", "body"), [
    ("/v1/completions", {"prompt": "abc"}), ("/v1/chat/completions", {"messages": CHAT, "stream": True}),
])
async def test_a_client_that_leaves_mid_search_leaves_no_engine_request(route: str, body: dict) -> None:
    fake = FakeEngineClient()
    fake.token_delay_s = 3600.0  # each step request waits until cancelled
    async with running(fake) as srv:
        async with anyio.create_task_group() as tg:
            tg.start_soon(partial(srv.http.post, route,
                                  json={**body, "n": 2, "max_tokens": 8, "use_beam_search": True}))
            with anyio.fail_after(5):
                await fake.wait_until(lambda: fake.num_active == 1)
            tg.cancel_scope.cancel()  # the client goes away
        with anyio.fail_after(5):
            await fake.wait_until(lambda: fake.num_active == 0 and fake.num_in_flight == 0)
    assert len(fake.aborted) == 1 and fake.finished == []
