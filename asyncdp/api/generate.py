"""``POST /v1/completions`` and ``POST /v1/chat/completions``.

A request becomes ``len(prompts) * n`` sequences (choice index ``prompt_index * n + i``; sample ``i`` gets
``seed + i`` so samples differ under a fixed seed). Everything that can be refused is checked before any
sequence starts: body types and ranges, the model name, prompt and ``max_tokens`` against ``max_model_len``,
and the rank hint's syntax. The first item of the merged output is awaited before the response starts, so
errors the client raises before its first yield (E2/E3, 429, 503) keep their HTTP status even for streams.
After that, a failure in a stream is an SSE error event followed by ``data: [DONE]``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import orjson
from quart import Quart, Response, request

from asyncdp.api.app import AppState, json_response
from asyncdp.api.errors import HTTPError, status_and_body
from asyncdp.api.fanout import Fanout, Item, Sequence, collect_one
from asyncdp.api.openai_format import (
    Choice,
    chat_chunk,
    chat_logprobs,
    chat_response,
    completion_chunk,
    completion_logprobs,
    completion_response,
    usage_chunk,
)
from asyncdp.api.schemas import (
    ChatRequest,
    CompletionRequest,
    chat_messages,
    decode_body,
    parse_rank_hint,
    prompts,
    sampling_params,
)
from asyncdp.errors import InvalidRequestError
from asyncdp.messages import RequestOutput
from asyncdp.sampling_params import SamplingParams

DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _check_length(num_prompt: int, max_tokens: int | None, max_model_len: int) -> None:
    if num_prompt + 1 > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length (max_model_len) is {max_model_len} tokens, but the prompt "
            f"has {num_prompt} tokens, which leaves no room for a generated token.", field="prompt")
    if max_tokens is not None and num_prompt + max_tokens > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length (max_model_len) is {max_model_len} tokens. However, you "
            f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the prompt, {max_tokens} for the "
            f"completion). Please reduce the prompt or max_tokens.", field="max_tokens")


def _sequences(base_id: str, prompt_ids: list[list[int]], params: SamplingParams) -> list[Sequence]:
    seqs = []
    for p, ids in enumerate(prompt_ids):
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            # n == 1: the sequence's params are the request's (seed + 0); frozen, so shared safely.
            one = params if params.n == 1 else msgspec.structs.replace(params, n=1, seed=seed)
            seqs.append(Sequence(p * params.n + i, f"{base_id}-{p}-{i}", ids, one))
    return seqs


async def _start(state: AppState, seqs: list[Sequence], hint: Any) -> tuple[Fanout, Item]:
    """Start the producers and wait for the first item; raise (and stop everything) if it is an error."""
    fan = Fanout(state.producers(), state.client, seqs, hint)
    try:
        first = await fan.receive()
        if first is None:
            raise RuntimeError("every sequence ended without output")
        if isinstance(first[1], Exception):
            raise first[1]
    except BaseException:
        fan.close()
        raise
    return fan, first


async def _collect_all(state: AppState, seqs: list[Sequence], hint: Any) -> list[Choice]:
    """Every sequence's outputs, accumulated per choice, for a non-streamed response."""
    if len(seqs) == 1:  # no fan-out to merge: the handler iterates the one sequence itself
        state.producers()  # the same 503s as a fan-out: draining, or not serving yet
        choice = Choice(seqs[0].index)
        if not await collect_one(state.client, seqs[0], hint, choice.add):
            raise RuntimeError("every sequence ended without output")
        return [choice]
    fan, first = await _start(state, seqs, hint)
    return await _collect(fan, first, len(seqs))


async def _collect(fan: Fanout, first: Item, num_choices: int) -> list[Choice]:
    choices = [Choice(i) for i in range(num_choices)]
    try:
        item: Item | None = first
        while item is not None:
            index, out = item
            if isinstance(out, Exception):
                raise out
            choices[index].add(out)
            item = await fan.receive()
    finally:
        fan.close()
    return choices


def _stream(
    fan: Fanout, first: Item, to_events: Callable[[int, RequestOutput], list[bytes]], prologue: list[bytes],
    epilogue: Callable[[], list[bytes]],
) -> Response:
    async def body() -> AsyncIterator[bytes]:
        try:
            for event in prologue:
                yield event
            item: Item | None = first
            while item is not None:
                index, out = item
                if isinstance(out, Exception):
                    _, error = status_and_body(out)
                    yield sse(error)
                    yield DONE
                    return
                for event in to_events(index, out):
                    yield event
                item = await fan.receive()
            for event in epilogue():
                yield event
            yield DONE
        finally:
            fan.close()  # on disconnect too: cancels the producers, which aborts their requests

    response = Response(body(), content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.timeout = None
    return response


def register_generation_routes(app: Quart, state: AppState) -> None:
    client = state.client

    @app.post("/v1/completions")
    async def completions() -> Response:
        req: CompletionRequest = decode_body(await request.get_data(as_text=False), CompletionRequest)
        model = state.check_model(req.model)
        if req.echo:
            raise HTTPError(400, "echo is not supported.", param="echo")
        if req.suffix:
            raise HTTPError(400, "suffix is not supported.", param="suffix")
        tok = client.tokenizer
        prompt_ids = [p if isinstance(p, list) else tok.encode(p) for p in prompts(req)]
        max_tokens = 16 if req.max_tokens is None else req.max_tokens
        params = sampling_params(req, max_tokens=max_tokens, logprobs=req.logprobs)
        vocab = len(tok)
        for ids in prompt_ids:
            _check_length(len(ids), max_tokens, client.max_model_len)
            if any(not 0 <= t < vocab for t in ids):
                raise HTTPError(400, f"prompt token ids must be in [0, {vocab}) for this model's vocabulary.",
                                param="prompt")
        hint = parse_rank_hint(request.headers, req, lambda: _managed(state))
        request_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        seqs = _sequences(request_id, prompt_ids, params)
        num_prompt_tokens = sum(len(ids) for ids in prompt_ids)
        if not req.stream:
            choices = await _collect_all(state, seqs, hint)
            return json_response(completion_response(request_id, created, model, choices, num_prompt_tokens, tok,
                                                     req.logprobs is not None))

        fan, first = await _start(state, seqs, hint)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        offsets = [0] * len(seqs)
        generated = [0] * len(seqs)

        def events(index: int, out: RequestOutput) -> list[bytes]:
            generated[index] += len(out.new_token_ids)
            lps = None
            if req.logprobs is not None:
                lps = completion_logprobs(tok, out.logprobs or [], offsets[index])
            offsets[index] += len(out.new_text)
            return [sse(completion_chunk(request_id, created, model, index, out, lps, include_usage))]

        def epilogue() -> list[bytes]:
            if not include_usage:
                return []
            return [sse(usage_chunk(request_id, created, model, "text_completion", num_prompt_tokens,
                                    sum(generated)))]

        return _stream(fan, first, events, [], epilogue)

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        req: ChatRequest = decode_body(await request.get_data(as_text=False), ChatRequest)
        model = state.check_model(req.model)
        messages = chat_messages(req)
        tok = client.tokenizer
        try:
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # a template that rejects these messages (roles, order) is the caller's error
            raise HTTPError(400, f"The chat template rejected the messages: {exc}", param="messages") from None
        prompt_ids = tok.encode(text, add_special_tokens=False)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if req.top_logprobs is not None and not req.logprobs:
            raise HTTPError(400, "top_logprobs requires logprobs to be true.", param="top_logprobs")
        top_logprobs = (req.top_logprobs or 0) if req.logprobs else None
        field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        try:
            params = sampling_params(req, max_tokens=max_tokens, logprobs=top_logprobs)
        except InvalidRequestError as exc:
            if exc.field == "logprobs":
                exc.field = "top_logprobs"
            elif exc.field == "max_tokens":
                exc.field = field
            raise
        _check_length(len(prompt_ids), max_tokens, client.max_model_len)
        hint = parse_rank_hint(request.headers, req, lambda: _managed(state))
        request_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        seqs = _sequences(request_id, [prompt_ids], params)
        if not req.stream:
            choices = await _collect_all(state, seqs, hint)
            return json_response(chat_response(request_id, created, model, choices, len(prompt_ids), tok,
                                               top_logprobs))

        fan, first = await _start(state, seqs, hint)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        generated = [0] * len(seqs)
        roles = [sse(chat_chunk(request_id, created, model, i, {"role": "assistant", "content": ""},
                                include_usage=include_usage)) for i in range(len(seqs))]

        def events(index: int, out: RequestOutput) -> list[bytes]:
            generated[index] += len(out.new_token_ids)
            if not out.new_text and not out.finished:
                return []
            lps = chat_logprobs(tok, out.logprobs or [], top_logprobs) if top_logprobs is not None else None
            delta = {"content": out.new_text} if out.new_text else {}
            return [sse(chat_chunk(request_id, created, model, index, delta, logprobs=lps,
                                   finish_reason=out.finish_reason if out.finished else None,
                                   stop_reason=out.stop_reason if out.finished else None,
                                   include_usage=include_usage))]

        def epilogue() -> list[bytes]:
            if not include_usage:
                return []
            return [sse(usage_chunk(request_id, created, model, "chat.completion.chunk", len(prompt_ids),
                                    sum(generated)))]

        return _stream(fan, first, events, roles, epilogue)


def _managed(state: AppState) -> list[dict[str, Any]] | None:
    try:
        return state.client.server_info().get("managed_ranks")
    except Exception:  # server_info is advisory here; the client re-checks the hint's range
        return None
