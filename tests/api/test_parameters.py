"""OpenAI/vLLM parameters: each one implemented (and reaching SamplingParams or the response) or refused by name;
null is "the default" for every nullable field."""

from __future__ import annotations

import orjson
import pytest

from asyncdp.api.params import REFUSED
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running, sse_events

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "hi"}]


async def test_penalties_and_logit_bias_reach_the_sampling_params() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={
            "prompt": "a", "max_tokens": 1, "presence_penalty": 0.5, "frequency_penalty": -1.5,
            "repetition_penalty": 1.2, "logit_bias": {"66": 5, "10": -100, "65": 100}})
        c = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "max_tokens": 1, "presence_penalty": 2, "logit_bias": {"1": 1.5}})
    assert r.status_code == 200 and c.status_code == 200
    params = srv.fake.submitted[0][2]
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -1.5, 1.2)
    assert params.logit_bias == ((10, -100.0), (65, 100.0), (66, 5.0))
    chat_params = srv.fake.submitted[1][2]
    assert chat_params.presence_penalty == 2.0 and chat_params.logit_bias == ((1, 1.5),)


@pytest.mark.parametrize("bias", [{"100000": 1}, {"1": 100.5}, {"a": 1}, {"1": 1, "01": 2}, {"1": "x"}])
async def test_bad_logit_bias_is_400_naming_it(bias: dict) -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a", "logit_bias": bias})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("logit_bias")


async def test_best_of_returns_the_n_most_likely_of_best_of_sequences_renumbered() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={
            "prompt": ["a", "b"], "n": 2, "best_of": 4, "max_tokens": 4, "seed": 1, "logprobs": 0})
        stream = await srv.http.post("/v1/completions", json={"prompt": "a", "best_of": 2, "stream": True})
        fewer = await srv.http.post("/v1/completions", json={"prompt": "a", "n": 3, "best_of": 2})
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert len(srv.fake.submitted) == 8 and all(p.logprobs == 0 for _, _, p, _ in srv.fake.submitted)
    sums = [sum(c["logprobs"]["token_logprobs"]) for c in choices]
    assert sums[0] >= sums[1] and sums[2] >= sums[3]
    assert r.json()["usage"]["completion_tokens"] == 16  # the returned choices' tokens
    assert stream.status_code == 400 and stream.json()["error"]["param"] == "best_of"
    assert fewer.status_code == 400 and fewer.json()["error"]["param"] == "best_of"


async def test_best_of_without_logprobs_returns_no_logprobs() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a", "best_of": 3, "max_tokens": 2})
    assert r.status_code == 200 and [c["logprobs"] for c in r.json()["choices"]] == [None]


async def test_echo_prepends_the_prompt_and_its_token_logprobs_as_lm_eval_reads_them() -> None:
    fake = FakeEngineClient()
    async with running(fake) as srv:
        # lm-evaluation-harness local-completions loglikelihood request, batched, text and token-id prompts.
        r = await srv.http.post("/v1/completions", json={
            "prompt": [[72, 105, 33], [98, 121]], "max_tokens": 1, "logprobs": 1, "echo": True,
            "temperature": 0, "seed": 1234})
        text = await srv.http.post("/v1/completions", json={
            "prompt": "Hi!", "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0})
    assert r.status_code == 200, r.text
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    for choice, ids in zip(choices, [[72, 105, 33], [98, 121]], strict=True):
        lp = choice["logprobs"]
        assert choice["text"].startswith(bytes(ids).decode())
        assert len(lp["tokens"]) == len(ids) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
        # What lm-eval computes: the continuation's logprobs over [ctxlen:-1], and greediness.
        for token, top, logprob in zip(lp["tokens"][1:], lp["top_logprobs"][1:], lp["token_logprobs"][1:],
                                       strict=True):
            assert top[token] == logprob and max(top.values()) >= logprob
        assert lp["text_offset"][: len(ids)] == list(range(len(ids)))
    assert text.json()["choices"][0]["logprobs"]["tokens"][:3] == ["H", "i", "!"]
    assert fake.submitted[0][2].prompt_logprobs == 1


async def test_echo_with_max_tokens_0_returns_only_the_prompt() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 0, "echo": True,
                                                         "logprobs": 0})
        streamed = await srv.http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 0, "echo": True,
                                                                "stream": True})
        no_echo = await srv.http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 0})
    choice = r.json()["choices"][0]
    assert choice["text"] == "abc" and choice["logprobs"]["tokens"] == ["a", "b", "c"]
    assert r.json()["usage"]["completion_tokens"] == 0
    assert srv.fake.submitted[0][2].max_tokens == 1
    assert "abc" in streamed.text and streamed.text.count('"text":"') >= 1
    assert no_echo.status_code == 400 and no_echo.json()["error"]["param"] == "max_tokens"


async def test_prompt_logprobs_field_lists_none_then_token_id_dicts() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "abc", "max_tokens": 1, "prompt_logprobs": 2})
        chat = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1,
                                                                 "prompt_logprobs": 0})
    field = r.json()["choices"][0]["prompt_logprobs"]
    assert field[0] is None and len(field) == 3
    entry = field[1][str(ord("b"))]
    assert set(entry) == {"logprob", "rank", "decoded_token"} and entry["decoded_token"] == "b"
    chat_field = chat.json()["prompt_logprobs"]
    assert chat_field[0] is None and all(len(e) == 1 for e in chat_field[1:])


async def test_logprobs_0_returns_the_sampled_tokens_logprob_only() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 3, "logprobs": 0})
        chat = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3,
                                                                 "logprobs": True, "top_logprobs": 0})
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == 3 and all(len(top) == 1 for top in lp["top_logprobs"])
    content = chat.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(c["top_logprobs"] == [] for c in content)


async def test_chat_template_options_follow_vllm() -> None:
    fake = FakeEngineClient()
    fake.tokenizer.chat_template = (
        "{{ greeting | default('') }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
        "{% if not (loop.last and continue_final_message) %}</{{ m['role'] }}>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}]
    async with running(fake) as srv:
        default = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1})
        no_gen = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "max_tokens": 1, "add_generation_prompt": False})
        cont = await srv.http.post("/v1/chat/completions", json={
            "messages": msgs, "max_tokens": 2, "continue_final_message": True, "echo": True})
        kwargs = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "max_tokens": 1, "chat_template_kwargs": {"greeting": "HELLO"}})
        both = await srv.http.post("/v1/chat/completions", json={
            "messages": msgs, "continue_final_message": True, "add_generation_prompt": True})
        reserved = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "chat_template_kwargs": {"tokenize": True}})
    assert all(r.status_code == 200 for r in (default, no_gen, cont, kwargs))
    rendered = [fake.tokenizer.decode(ids) for _, ids, _, _ in fake.submitted]
    assert rendered[0] == "<user>hi</user><assistant>"
    assert rendered[1] == "<user>hi</user>"
    assert rendered[2] == "<user>q</user><assistant>The answer is"
    assert rendered[3].startswith("HELLO<user>")
    assert cont.json()["choices"][0]["message"]["content"].startswith("The answer is")
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    assert reserved.status_code == 400 and reserved.json()["error"]["param"] == "chat_template_kwargs"


async def test_chat_echo_prepends_only_an_assistant_final_message() -> None:
    async with running() as srv:
        user_last = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2,
                                                                      "echo": True})
        streamed = await srv.http.post("/v1/chat/completions", json={
            "messages": [*CHAT, {"role": "assistant", "content": "Sure:"}], "max_tokens": 2, "echo": True,
            "stream": True})
    assert not user_last.json()["choices"][0]["message"]["content"].startswith("hi")
    assert '"content":"Sure:"' in streamed.text


REFUSED_EXAMPLES = {
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "required", "functions": [{"name": "f"}], "function_call": {"name": "f"}, "suffix": "x",
    "guided_decoding_backend": "xgrammar",
    "store": True, "service_tier": "flex",
}


@pytest.mark.parametrize("name", sorted(REFUSED_EXAMPLES))
async def test_unimplemented_parameter_is_400_naming_it(name: str) -> None:
    async with running() as srv:
        completion = await srv.http.post("/v1/completions", json={"prompt": "a", name: REFUSED_EXAMPLES[name]})
        if name != "suffix":  # a completions-only parameter
            chat = await srv.http.post("/v1/chat/completions",
                                       json={"messages": CHAT, name: REFUSED_EXAMPLES[name]})
            assert chat.status_code == 400 and chat.json()["error"]["param"] == name
    assert completion.status_code == 400 and completion.json()["error"]["param"] == name
    assert srv.fake.submitted == []


@pytest.mark.parametrize(("name", "value"), [("best_of", "abc"), ("tools", 5), ("response_format", True),
                                             ("tool_choice", 3), ("suffix", 1), ("guided_choice", "x")])
async def test_wrong_type_for_an_unimplemented_parameter_is_400(name: str, value: object) -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "a", name: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == name


async def test_values_that_ask_for_nothing_are_accepted_and_stream_options_need_stream() -> None:
    async with running() as srv:
        ok = await srv.http.post("/v1/chat/completions", json={
            "messages": CHAT, "max_tokens": 1, "response_format": {"type": "text"}, "tool_choice": "none",
            "tools": [], "use_beam_search": False})
        no_stream = await srv.http.post("/v1/completions", json={
            "prompt": "a", "stream_options": {"include_usage": True}})
        with_stream = await srv.http.post("/v1/completions", json={
            "prompt": "a", "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True}})
    assert ok.status_code == 200
    assert no_stream.status_code == 400 and no_stream.json()["error"]["param"] == "stream_options"
    assert with_stream.status_code == 200 and '"usage":{"prompt_tokens"' in with_stream.text


def test_every_refused_parameter_has_an_example_or_a_harmless_only_value() -> None:
    assert set(REFUSED_EXAMPLES) <= set(REFUSED)


NULLABLE = ["n", "best_of", "stream", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs",
            "temperature", "top_p", "top_k", "min_p", "stop", "seed", "max_tokens", "user", "logit_bias",
            "stop_token_ids", "min_tokens", "ignore_eos", "echo", "prompt_logprobs", "stream_options", "model",
            "skip_special_tokens", "include_stop_str_in_output", "suffix", "tools", "response_format"]
CHAT_NULLABLE = [*[f for f in NULLABLE if f not in ("logprobs", "suffix")], "logprobs", "top_logprobs",
                 "max_completion_tokens", "add_generation_prompt", "continue_final_message",
                 "chat_template_kwargs"]


async def test_null_means_the_default_for_every_nullable_field() -> None:
    async with running() as srv:
        completion = await srv.http.post("/v1/completions", json={"prompt": "a", **dict.fromkeys(NULLABLE)})
        chat = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, **dict.fromkeys(CHAT_NULLABLE)})
    assert completion.status_code == 200, completion.text
    assert chat.status_code == 200, chat.text
    params = srv.fake.submitted[0][2]
    assert (params.n, params.temperature, params.max_tokens, params.logprobs) == (1, 1.0, 16, None)


async def test_integral_floats_are_the_integers_json_schema_says_they_are() -> None:
    async with running() as srv:
        ok = await srv.http.post("/v1/completions", content=b'{"prompt": [65.0, 66], "n": 2.0, "max_tokens": 1.0}')
        fractional = await srv.http.post("/v1/completions", content=b'{"prompt": "a", "n": 1.5}')
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["choices"]) == 2 and srv.fake.submitted[0][1] == [65, 66]
    assert fractional.status_code == 400 and fractional.json()["error"]["param"] == "n"


async def test_wrong_method_is_405_with_allow_header() -> None:
    async with running() as srv:
        r = await srv.http.request("TRACE", "/v1/completions")
    assert r.status_code == 405 and "POST" in r.headers["allow"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(path: str) -> None:
    body = {"prompt": "a"} if path == "/v1/completions" else {"messages": CHAT}
    options = {"include_usage": True, "continuous_usage_stats": True}
    async with running() as srv:
        r = await srv.http.post(path, json={**body, "max_tokens": 3, "stream": True, "stream_options": options,
                                            "stop": None, "ignore_eos": True})
        alone = await srv.http.post(path, json={**body, "stream": True,
                                                "stream_options": {"continuous_usage_stats": True}})
    chunks = [orjson.loads(e) for e in sse_events(r.text)[:-1]]
    assert chunks and all(isinstance(c.get("usage"), dict) for c in chunks)
    completion_tokens = [c["usage"]["completion_tokens"] for c in chunks]
    assert completion_tokens == sorted(completion_tokens) and completion_tokens[-1] == 3
    assert alone.status_code == 400 and alone.json()["error"]["param"] == "stream_options"
