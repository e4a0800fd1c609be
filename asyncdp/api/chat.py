"""``POST /v1/chat/completions``.

Preparation (decode, checks, chat-template rendering, tokenization) is one plain function, ``prepare``, run off
the event loop for large bodies. Template options follow vLLM: ``add_generation_prompt`` (default true, false
by default when ``continue_final_message`` is set; both true is a 400), ``continue_final_message`` (the last
message is left open for the model to continue), ``chat_template_kwargs`` (extra variables for the template;
the ones asyncdp sets itself are refused); the rendering, with ``documents`` and a request's own ``chat_template``,
is :mod:`asyncdp.api.chat_render`. ``echo`` prepends the last message's content to each answer when
that message is the assistant's.

With ``--reasoning-parser`` (:mod:`asyncdp.api.reasoning_parsers`), each answer's thinking is taken out of its
text into ``message.reasoning`` (``delta.reasoning`` streamed, as it comes); the content, and the tool-call parser
of ``tool_choice: "auto"``, get the rest. Every message then has ``reasoning`` (null when the model wrote none)
and a ``content`` that is null rather than empty, and the first chunk of a stream has ``content: null``, so that
a client accumulating the deltas gets the same message. A request that constrains the output (structured outputs,
a named or ``"required"`` tool choice) while the model may think is constrained after the thinking only, as in
vLLM: its grammar's ``start_after`` is ``</think>``'s token ids (its ``start_markers`` gpt-oss's final-channel
header with a content type, qwen3's ``<tool_call>``), so the model thinks freely and the grammar applies from the
token after the first ``</think>``; the tool calls are read from the content alone (a constrained answer's
parser ends the thinking where the grammar starts: ``Prepared.reading``). An answer cut by
``max_tokens`` (or ended by EOS) inside the thinking was never constrained: it is all reasoning.
``include_reasoning: false`` (vLLM's) drops the thinking, and the logprobs, which would show it. ``usage`` then
has ``completion_tokens_details.reasoning_tokens`` (as vLLM): the thinking's tokens, tags left out, counted from
each choice's token ids (:class:`~asyncdp.api.reasoning_tokens.ReasoningTokens`) and summed over the choices;
0 when the request does not think; per choice so far in ``continuous_usage_stats``' chunks.
``truncate_prompt_tokens`` cuts the rendered prompt, ``return_token_ids`` adds the prompt's and each choice's token
ids (withheld, as the logprobs are, when ``include_reasoning: false`` hides the thinking), and
``return_tokens_as_token_ids`` names the logprobs' tokens by id (``asyncdp.api.token_ids``). ``use_beam_search``
streams too, as vLLM's chat route does (completions refuses it): the search runs before the response starts and
each beam goes out whole, through the same chunks, when it ends (``asyncdp.api.beam_search.stream_beam_search``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec
from quart import Quart, Response, request

from asyncdp.api.beam_search import check_beam_search, run_beam_search, stream_beam_search
from asyncdp.api.chat_messages import content_text
from asyncdp.api.chat_render import render_prompt, template_kwargs
from asyncdp.api.context import AppState, json_response
from asyncdp.api.fanout import Sequence
from asyncdp.api.generate import (
    Items,
    best_choices,
    cached_prompt_tokens,
    check_length,
    check_num_sequences,
    run_whole,
    sequences,
    start_stream,
    stream_response,
)
from asyncdp.api.offload import INLINE_TOKENS, heavy_body
from asyncdp.api.openai_format import (
    Choice,
    Echo,
    chat_chunk,
    chat_logprobs,
    chat_response,
    prompt_logprobs_field,
    usage,
    usage_chunk,
)
from asyncdp.api.params import logit_bias, refuse_unsupported, sampling_params
from asyncdp.api.rank_hint import parse_rank_hint, routing_headers
from asyncdp.api.reasoning_parsers import ReasoningParser, split
from asyncdp.api.reasoning_tokens import TokenCount
from asyncdp.api.request_ids import REQUEST_ID_HEADER, request_ids
from asyncdp.api.routing_key import routing_key
from asyncdp.api.schemas import ChatRequest, decode_body
from asyncdp.api.sse import sse
from asyncdp.api.structured import structured_outputs
from asyncdp.api.token_ids import add_chat_token_ids, truncate_prompt
from asyncdp.api.tool_calls import StreamedCalls, ToolUse, answer, tool_use
from asyncdp.errors import HTTPError, InvalidRequestError
from asyncdp.messages import RequestOutput
from asyncdp.sampling_params import StructuredOutputs


@dataclass
class Prepared:
    req: ChatRequest
    request_id: str
    model: str
    prompt: Echo
    echo: str
    seqs: list[Sequence]
    per_prompt: int
    n: int
    top_logprobs: int | None
    tools: ToolUse | None
    thinker: type[ReasoningParser] | None  # the reasoning parser, when the request lets the model think
    hide_reasoning: bool  # include_reasoning false: the thinking is dropped, and the logprobs that would show it
    constrained: bool = False  # a thinker's constrained answer: its grammar starts where the thinking ends

    def reading(self) -> ReasoningParser:
        """A new parse of one choice's thinking (a thinker's only)."""
        assert self.thinker is not None
        return self.thinker(constrained=self.constrained)


def prepare(state: AppState, body: bytes, id_header: str | None = None) -> Prepared:
    """Everything that can refuse the request, before any sequence starts (see ``completions.prepare``)."""
    req: ChatRequest = decode_body(body, ChatRequest)
    refuse_unsupported(req)
    model = state.check_model(req.model)
    n = req.n or 1
    per_prompt = check_num_sequences(1, n, req.best_of, bool(req.stream), state.max_seqs_per_request)
    tools = tool_use(req, state.tool_parser)
    messages, prompt_ids = render_prompt(state, req, tools.template_tools if tools else None)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    if req.top_logprobs is not None and not req.logprobs:
        raise HTTPError(400, "top_logprobs requires logprobs to be true.", param="top_logprobs")
    top_logprobs = (req.top_logprobs or 0) if req.logprobs else None
    seq_logprobs = top_logprobs if top_logprobs is not None else (0 if per_prompt > n else None)
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    tok = state.client.tokenizer
    thinker = state.reasoning_parser
    if thinker is not None and not thinker.thinks(template_kwargs(req)):
        thinker = None  # (qwen3 with enable_thinking false: the answer is all content)
    constraint = _constraint(req, tools)
    if thinker is not None and constraint is not None:  # (the thinking stays free: vLLM's behaviour)
        constraint = msgspec.structs.replace(constraint, start_after=state.reasoning_end_ids,
                                             start_markers=state.reasoning_end_markers)
    try:
        params = sampling_params(req, max_tokens=max_tokens, logprobs=seq_logprobs,
                                 prompt_logprobs=req.prompt_logprobs, bias=logit_bias(req, len(tok)),
                                 structured=constraint, tokenizer=tok, scheduling_policy=state.scheduling_policy,
                                 defaults=state.generation_defaults, logprobs_limit=state.logprobs_limit)
    except InvalidRequestError as exc:
        if exc.field == "logprobs":
            exc.field = "top_logprobs"
        elif exc.field == "max_tokens":
            exc.field = field
        raise
    keep_tags = (tools is not None and tools.parser is not None and state.tool_tags_special) or (
        thinker is not None and state.reasoning_tags_special)
    if keep_tags and req.skip_special_tokens is None:
        params = msgspec.structs.replace(params, skip_special_tokens=False)  # the parsers must see their tags
    prompt_ids = truncate_prompt(prompt_ids, req.truncate_prompt_tokens, state.client.max_model_len, max_tokens,
                                 field)
    check_length(len(prompt_ids), max_tokens, state.client.max_model_len, field, params.min_tokens,
                 prompt_field="messages")
    echo = content_text(messages[-1]["content"]) if req.echo and messages[-1]["role"] == "assistant" else ""
    if echo and tools is not None and tools.calls:
        raise HTTPError(400, "echo cannot be combined with a tool_choice whose answer is tool calls.", param="echo")
    beams = check_beam_search(req, params, 1, state.max_seqs_per_request, logprobs_limit=state.logprobs_limit,
                              may_stream=True)  # (as vLLM's chat)
    request_id, engine_id = request_ids("chatcmpl", id_header, req.request_id)
    seqs = sequences(engine_id, [prompt_ids], params, 1 if beams else per_prompt)  # (beams: the search's start)
    per_prompt = beams or per_prompt
    return Prepared(req, request_id, model, Echo("", prompt_ids), echo, seqs, per_prompt, n, top_logprobs, tools,
                    thinker, thinker is not None and req.include_reasoning is False,
                    thinker is not None and constraint is not None)


def _whole(state: AppState, prep: Prepared, message: dict[str, Any], finish_reason: str | None,
           ) -> tuple[dict[str, Any], str | None]:
    """A whole answer's message and finish reason: its reasoning taken out, then its tool calls."""
    text: str = message["content"]
    reasoning = None
    if prep.thinker is not None:
        reasoning, answer_text = split(prep.reading(), text[len(prep.echo):])  # (the echo is content)
        text = prep.echo + answer_text
        message = {"role": "assistant", "content": text}
    if prep.tools is not None and prep.tools.calls:
        message, finish_reason = answer(prep.tools, text, finish_reason)
    if _null_content(state, prep):  # (an empty answer too: a stream of it accumulates null from its first chunk)
        message["content"] = message["content"] or None
    if state.reasoning_parser is not None:
        message["reasoning"] = None if prep.hide_reasoning else reasoning
    return message, finish_reason


def _reasoning_tokens(state: AppState, prep: Prepared, choices: list[Choice]) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens`` of a whole answer: None without a reasoning parser,
    0 for a request that does not think, else the choices' sum."""
    if state.reasoning_parser is None:
        return None
    if prep.thinker is None:
        return 0
    total = 0
    for choice in choices:
        counter = _counter(state, prep)
        counter.feed(choice.token_ids or ())
        total += counter.finish()
    return total


def _counter(state: AppState, prep: Prepared) -> TokenCount:
    """A new count of one choice's reasoning tokens (the server's parser's, by its tags' ids)."""
    assert state.reasoning_counter is not None  # (set with the reasoning parser)
    return state.reasoning_counter(prep.constrained)


def _null_content(state: AppState, prep: Prepared) -> bool:
    """Whether an empty content is null: with ``"auto"`` and with a reasoning parser, as vLLM; a named or
    ``"required"`` tool choice's answer keeps its ``""``."""
    tools = prep.tools
    return (tools is not None and tools.parser is not None) or (
        state.reasoning_parser is not None and (tools is None or tools.constraint is None))


def _constraint(req: ChatRequest, tools: ToolUse | None) -> StructuredOutputs | None:
    """The one structured-output constraint: the request's own, or its tool choice's (never both)."""
    own = structured_outputs(req)
    if tools is None or tools.constraint is None:
        return own
    if own is not None:
        raise HTTPError(400, f"tool_choice constrains the answer to tool calls; it cannot be combined with "
                             f"{own.param}.", param="tool_choice")
    return tools.constraint


def register(app: Quart, state: AppState) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        body = await request.get_data(as_text=False)
        headers = routing_headers(request.headers)  # one pass: the rank hint, the routing key, X-Request-Id
        prep = await state.offload.run(heavy_body(body), prepare, state, body, headers.get(REQUEST_ID_HEADER))
        hint, key = parse_rank_hint(headers, prep.req), routing_key(headers, prep.req)
        created = int(time.time())
        tok = state.client.tokenizer
        if not prep.req.stream:
            if prep.req.use_beam_search:
                ran = await run_beam_search(state, prep.seqs, prep.n, prep.req.length_penalty, hint, key)
            else:
                ran = await run_whole(state, prep.seqs, hint, key,
                                      keep_token_ids=prep.thinker is not None or bool(prep.req.return_token_ids))
            cached = cached_prompt_tokens(state, [c.num_cached_tokens for c in ran], prep.per_prompt)
            choices = best_choices(ran, prep.per_prompt, prep.n)
            heavy = (prep.top_logprobs is not None or prep.req.prompt_logprobs is not None) and (
                len(prep.prompt.token_ids) + sum(c.num_tokens for c in choices) > INLINE_TOKENS)
            prompt = prep.prompt if prep.req.prompt_logprobs is not None else None
            render = partial(chat_response, echo=prep.echo, prompt=prompt, cached_tokens=cached,
                             reasoning_tokens=_reasoning_tokens(state, prep, choices),
                             as_ids=bool(prep.req.return_tokens_as_token_ids))
            doc = await state.offload.run(heavy, render, prep.request_id, created, prep.model, choices,
                                          len(prep.prompt.token_ids), tok, prep.top_logprobs)
            if (prep.tools is not None and prep.tools.calls) or state.reasoning_parser is not None:
                for choice in doc["choices"]:
                    choice["message"], choice["finish_reason"] = _whole(
                        state, prep, choice["message"], choice["finish_reason"])
                    if prep.hide_reasoning:
                        choice["logprobs"] = None  # (as vLLM: they would show the thinking)
            if prep.req.return_token_ids:
                add_chat_token_ids(doc, prep.prompt.token_ids, {c.index: c.token_ids for c in choices},
                                   prep.hide_reasoning)
            return json_response(doc)
        return await _streamed(state, prep, hint, key, created)


async def _streamed(state: AppState, prep: Prepared, hint: Any, key: str | None, created: int) -> Response:
    req, tok, model, request_id = prep.req, state.client.tokenizer, prep.model, prep.request_id
    fan: Items
    if req.use_beam_search:  # the search runs here; its beams come whole, once it ends (as vLLM streams them)
        fan, first = await stream_beam_search(state, prep.seqs, prep.n, req.length_penalty, hint, key)
    else:
        fan, first = await start_stream(state, prep.seqs, hint, key)
    num_choices = prep.per_prompt  # (one prompt: its sequences, or its beams)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(include_usage and req.stream_options and req.stream_options.continuous_usage_stats)
    num_prompt = len(prep.prompt.token_ids)
    generated = [0] * num_choices
    cached = [0] * num_choices  # each choice's prefix-cache hit

    # with a reasoning parser: each choice's reasoning tokens, counted as they come (none when it does not think)
    counts = [_counter(state, prep) for _ in range(num_choices)] if prep.thinker is not None else None

    def reasoning_tokens(index: int | None) -> int | None:  # (None: all the choices)
        if state.reasoning_parser is None:
            return None
        if counts is None:
            return 0
        return sum(c.finish() for c in counts) if index is None else counts[index].count

    def with_usage(chunk: dict[str, Any], index: int) -> dict[str, Any]:
        if continuous:  # vLLM's continuous_usage_stats: this choice's usage so far, in every chunk
            chunk["usage"] = usage(num_prompt, generated[index], reasoning_tokens=reasoning_tokens(index))
        return chunk

    prologue = []
    # "auto" may answer calls alone, a thinker only think, whose content is null: "" here would make it "" in an
    # accumulated stream
    opening = {"role": "assistant", "content": None if _null_content(state, prep) else ""}
    for i in range(num_choices):
        role_chunk = chat_chunk(request_id, created, model, i, dict(opening), include_usage=include_usage)
        if req.return_token_ids:  # (as vLLM: in each choice's first chunk)
            role_chunk["prompt_token_ids"] = prep.prompt.token_ids
        prologue.append(sse(with_usage(role_chunk, i)))
        if prep.echo:
            prologue.append(sse(with_usage(chat_chunk(request_id, created, model, i, {"content": prep.echo},
                                                      include_usage=include_usage), i)))
    started = [False] * num_choices
    calls = [StreamedCalls(prep.tools) for _ in range(num_choices)] if prep.tools is not None and prep.tools.calls \
        else None
    thoughts = [prep.reading() for _ in range(num_choices)] if prep.thinker is not None else None

    def events(index: int, out: RequestOutput) -> list[bytes]:
        generated[index] += len(out.new_token_ids)
        if counts is not None:
            counts[index].feed(out.new_token_ids)
            if out.finished:
                counts[index].finish()
        cached[index] = max(cached[index], out.num_cached_tokens)
        first_of_choice = not started[index]
        started[index] = True
        show_logprobs = prep.top_logprobs is not None and not prep.hide_reasoning  # (they would show the thinking)
        wants_ids = bool(req.return_token_ids) and not prep.hide_reasoning  # (hidden with the thinking)
        # logprobs and ids go out with every token, one with no text yet included
        must_send = (show_logprobs and bool(out.logprobs)) or (wants_ids and bool(out.new_token_ids))
        if not out.new_text and not out.finished and not must_send and not (
                first_of_choice and req.prompt_logprobs is not None):
            return []  # (a token with no text yet, held back by a stop string or a partial character: its
            # logprobs and ids still go out, in a chunk of their own, one entry per token as without streaming)
        top = prep.top_logprobs
        lps = chat_logprobs(tok, out.logprobs or [], top, as_ids=bool(req.return_tokens_as_token_ids)) \
            if top is not None and show_logprobs else None
        text, reasoning = out.new_text, ""
        if thoughts is not None:
            reasoning, text = thoughts[index].read(text, out.finished)
        delta = {"content": text} if text else {}
        finish_reason = out.finish_reason if out.finished else None
        if calls is not None:
            delta, finish_reason = calls[index].delta(text, out.finished, finish_reason)
        if reasoning and not prep.hide_reasoning:
            delta = {"reasoning": reasoning, **delta}
        if (calls is not None or thoughts is not None) and not delta and finish_reason is None and not (
                must_send or (first_of_choice and req.prompt_logprobs is not None)):
            return []  # "required" holds its text until the choice ends, a parser a tail that may be a tag
        chunk = chat_chunk(request_id, created, model, index, delta, logprobs=lps, finish_reason=finish_reason,
                           stop_reason=out.stop_reason if out.finished else None, include_usage=include_usage)
        if first_of_choice and req.prompt_logprobs is not None:
            chunk["prompt_logprobs"] = prompt_logprobs_field(tok, prep.prompt.token_ids, out.prompt_logprobs)
        if wants_ids:
            chunk["choices"][0]["token_ids"] = list(out.new_token_ids)
        return [sse(with_usage(chunk, index))]

    def epilogue() -> list[bytes]:
        if not include_usage:
            return []
        details = cached_prompt_tokens(state, cached, prep.per_prompt)
        return [sse(usage_chunk(request_id, created, model, "chat.completion.chunk", len(prep.prompt.token_ids),
                                sum(generated), details, reasoning_tokens(None)))]

    return stream_response(fan, first, events, prologue, epilogue)
