"""``POST /v1/completions``.

Preparation (decode, checks, tokenization) is one plain function, ``prepare``, that the handler runs off the
event loop when the body is large (``asyncdp.api.offload``). ``echo`` prepends each prompt's text to its choices
and, with ``logprobs``, its tokens to ``logprobs`` (through the engine's prompt logprobs); ``max_tokens: 0``
runs one token and drops it, so only the prompt comes back. ``best_of`` runs ``best_of`` sequences per prompt
with their sampled-token logprobs and returns the ``n`` most likely, renumbered (not with ``stream``).
``truncate_prompt_tokens``, ``return_token_ids`` and ``return_tokens_as_token_ids``: ``asyncdp.api.token_ids``;
with ``return_token_ids`` an ``echo`` sends the prompt as ids only (its text is left out, as vLLM does).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson
from quart import Quart, Response, request

from asyncdp.api.beam_search import check_beam_search, run_beam_search
from asyncdp.api.context import AppState
from asyncdp.api.fanout import Sequence
from asyncdp.api.generate import (
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
    Echo,
    completion_choice,
    completion_chunk,
    completion_logprobs,
    completion_response,
    prompt_logprobs_field,
    usage,
    usage_chunk,
)
from asyncdp.api.params import logit_bias, prompts, refuse_unsupported, sampling_params
from asyncdp.api.rank_hint import parse_rank_hint, routing_headers
from asyncdp.api.request_ids import REQUEST_ID_HEADER, request_ids
from asyncdp.api.routing_key import routing_key
from asyncdp.api.schemas import CompletionRequest, decode_body
from asyncdp.api.sse import sse
from asyncdp.api.structured import structured_outputs
from asyncdp.api.token_bytes import TextOffsets
from asyncdp.api.token_ids import truncate_prompt
from asyncdp.errors import HTTPError
from asyncdp.messages import RequestOutput


@dataclass
class Prepared:
    req: CompletionRequest
    request_id: str
    model: str
    prompt_ids: list[list[int]]
    prompts: list[Echo]  # text and ids of each prompt
    seqs: list[Sequence]
    per_prompt: int
    n: int
    drop_generated: bool  # max_tokens 0: the prompt only

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompt_ids)


def prepare(state: AppState, body: bytes, id_header: str | None = None) -> Prepared:
    """Everything that can refuse the request, before any sequence starts. Runs in a worker thread for big
    bodies: touches only the request, the tokenizer and immutable app settings."""
    req: CompletionRequest = decode_body(body, CompletionRequest)
    refuse_unsupported(req)
    model = state.check_model(req.model)
    raw = prompts(req)
    n = req.n or 1
    per_prompt = check_num_sequences(len(raw), n, req.best_of, bool(req.stream), state.max_seqs_per_request)
    tok = state.client.tokenizer
    add_special = True if req.add_special_tokens is None else req.add_special_tokens
    prompt_ids = [p if isinstance(p, list) else tok.encode(p, add_special_tokens=add_special) for p in raw]
    vocab = len(tok)
    for ids in prompt_ids:
        if not ids:
            raise HTTPError(400, "prompt must contain at least one token.", param="prompt")
        if any(not 0 <= t < vocab for t in ids):
            raise HTTPError(400, f"prompt token ids must be in [0, {vocab}) for this model's vocabulary.",
                            param="prompt")
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    for name in ("max_tokens", "max_completion_tokens"):
        if getattr(req, name) == 0 and not req.echo:
            raise HTTPError(400, f"{name} must be >= 1, or 0 together with echo (the prompt only).", param=name)
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    requested = 16 if limit is None else limit
    max_tokens = max(requested, 1)
    # best_of ranks sequences by their cumulative logprob, so they carry at least the sampled token's.
    seq_logprobs = req.logprobs if req.logprobs is not None else (0 if per_prompt > n else None)
    prompt_lps = req.prompt_logprobs
    if req.echo and req.logprobs is not None:
        prompt_lps = max(prompt_lps or 0, req.logprobs)
    params = sampling_params(req, max_tokens=max_tokens, logprobs=seq_logprobs, prompt_logprobs=prompt_lps,
                             bias=logit_bias(req, vocab), structured=structured_outputs(req), tokenizer=tok,
                             scheduling_policy=state.scheduling_policy, defaults=state.generation_defaults,
                             logprobs_limit=state.logprobs_limit)
    whole = prompt_ids
    prompt_ids = [truncate_prompt(ids, req.truncate_prompt_tokens, state.client.max_model_len, max_tokens, field)
                  for ids in whole]
    for ids in prompt_ids:
        check_length(len(ids), max_tokens, state.client.max_model_len, field)

    def echoed(p: str | list[int], ids: list[int], cut: bool) -> str:
        if not req.echo or req.return_token_ids:
            return ""
        return p if isinstance(p, str) and not cut else tok.decode(ids)

    texts = [Echo(echoed(p, ids, len(ids) < len(w)), ids)
             for p, ids, w in zip(raw, prompt_ids, whole, strict=True)]
    beams = check_beam_search(req, params, len(raw), state.max_seqs_per_request,
                              logprobs_limit=state.logprobs_limit)
    request_id, engine_id = request_ids("cmpl", id_header, req.request_id)
    # beam search: one sequence per prompt, the search's start (asyncdp.api.beam_search)
    seqs = sequences(engine_id, prompt_ids, params, 1) if beams else sequences(engine_id, prompt_ids, params,
                                                                               per_prompt)
    per_prompt = beams or per_prompt
    return Prepared(req, request_id, model, prompt_ids, texts, seqs, per_prompt, n, requested == 0)


def _render(state: AppState, prep: Prepared, choices: list[Any], request_id: str, created: int,
            cached: int | None) -> bytes:
    req, tok = prep.req, state.client.tokenizer
    prompt_of = [prep.prompts[c.index // prep.n] for c in choices]  # renumbered: index = prompt * n + j
    out = [completion_choice(tok, c, with_logprobs=req.logprobs is not None,
                             echo=p if req.echo else None, prompt=p if req.prompt_logprobs is not None else None,
                             drop_generated=prep.drop_generated, as_ids=bool(req.return_tokens_as_token_ids))
           for c, p in zip(choices, prompt_of, strict=True)]
    if req.return_token_ids:
        for choice, c, p in zip(out, choices, prompt_of, strict=True):
            choice["prompt_token_ids"] = p.token_ids
            choice["token_ids"] = [] if prep.drop_generated else c.token_ids
    generated = 0 if prep.drop_generated else sum(c.num_tokens for c in choices)
    return orjson.dumps(completion_response(request_id, created, prep.model, out, prep.num_prompt_tokens,
                                            generated, cached))


def register(app: Quart, state: AppState) -> None:
    @app.post("/v1/completions")
    async def completions() -> Response:
        body = await request.get_data(as_text=False)
        headers = routing_headers(request.headers)  # one pass: the rank hint, the routing key, X-Request-Id
        prep = await state.offload.run(heavy_body(body), prepare, state, body, headers.get(REQUEST_ID_HEADER))
        req = prep.req
        hint, key = parse_rank_hint(headers, req), routing_key(headers, req)
        request_id, created = prep.request_id, int(time.time())
        if not req.stream:
            if req.use_beam_search:
                ran = await run_beam_search(state, prep.seqs, prep.n, req.length_penalty, hint, key)
            else:
                ran = await run_whole(state, prep.seqs, hint, key, keep_token_ids=bool(req.return_token_ids))
            cached = cached_prompt_tokens(state, [c.num_cached_tokens for c in ran], prep.per_prompt)
            choices = best_choices(ran, prep.per_prompt, prep.n)
            heavy = (req.echo or req.logprobs is not None or req.prompt_logprobs is not None) and (
                prep.num_prompt_tokens + sum(c.num_tokens for c in choices) > INLINE_TOKENS)
            payload = await state.offload.run(heavy, _render, state, prep, choices, request_id, created, cached)
            return Response(payload, content_type="application/json")
        return await _streamed(state, prep, hint, key, request_id, created)


async def _streamed(state: AppState, prep: Prepared, hint: Any, key: str | None, request_id: str,
                    created: int) -> Response:
    req, tok, model = prep.req, state.client.tokenizer, prep.model
    fan, first = await start_stream(state, prep.seqs, hint, key)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(include_usage and req.stream_options and req.stream_options.continuous_usage_stats)
    offsets = [TextOffsets(tok) for _ in prep.seqs]  # each choice's, across its chunks
    generated = [0] * len(prep.seqs)
    cached = [0] * len(prep.seqs)  # each sequence's prefix-cache hit
    started = [False] * len(prep.seqs)

    def events(index: int, out: RequestOutput) -> list[bytes]:
        prompt = prep.prompts[index // prep.per_prompt]
        echo_now = bool(req.echo) and not started[index]
        cached[index] = max(cached[index], out.num_cached_tokens)
        if prep.drop_generated:
            out = RequestOutput(request_id=out.request_id, finished=out.finished, finish_reason=out.finish_reason,
                                stop_reason=out.stop_reason, prompt_logprobs=out.prompt_logprobs,
                                logprobs=[] if out.logprobs is not None else None)
        generated[index] += len(out.new_token_ids)
        lps = None
        if req.logprobs is not None:
            lps = completion_logprobs(
                tok, out.logprobs or [], offsets[index],
                (prompt.token_ids, out.prompt_logprobs or [None] * len(prompt.token_ids)) if echo_now else None,
                as_ids=bool(req.return_tokens_as_token_ids))
        chunk = completion_chunk(request_id, created, model, index, out, lps, include_usage)
        if req.return_token_ids:  # the prompt's ids in the choice's first chunk, as vLLM
            chunk["choices"][0]["token_ids"] = list(out.new_token_ids)
            if not started[index]:
                chunk["choices"][0]["prompt_token_ids"] = prompt.token_ids
        if continuous:  # vLLM's continuous_usage_stats: this choice's usage so far, in every chunk
            chunk["usage"] = usage(len(prompt.token_ids), generated[index])
        if echo_now:
            chunk["choices"][0]["text"] = prompt.text + out.new_text
        if req.prompt_logprobs is not None and not started[index]:
            chunk["choices"][0]["prompt_logprobs"] = prompt_logprobs_field(tok, prompt.token_ids,
                                                                           out.prompt_logprobs)
        started[index] = True
        return [sse(chunk)]

    def epilogue() -> list[bytes]:
        if not include_usage:
            return []
        details = cached_prompt_tokens(state, cached, prep.per_prompt)
        return [sse(usage_chunk(request_id, created, model, "text_completion", prep.num_prompt_tokens,
                                sum(generated), details))]

    return stream_response(fan, first, events, [], epilogue)

