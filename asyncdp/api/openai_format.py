"""Build OpenAI response objects (completions and chat, whole and streamed) from ``RequestOutput`` deltas.

``Choice`` accumulates one sequence's deltas. The functions here are pure: ids, timestamps and the tokenizer
are passed in, so the shapes can be checked without a server.

Completions logprobs follow OpenAI's legacy shape (``tokens``, ``token_logprobs``, ``top_logprobs`` as
``{token text: logprob}`` including the chosen token, as vLLM does, ``text_offset``). With ``echo`` the prompt's
tokens come first, from the engine's prompt logprobs: the first prompt token has no context, so its logprob and
its ``top_logprobs`` entry are null (what lm-evaluation-harness's loglikelihood expects). ``prompt_logprobs``
is vLLM's response field: ``[None, {"<token id>": {"logprob", "rank", "decoded_token"}}, ...]``.

Every logprob sent is at least ``LOGPROB_FLOOR`` (-9999.0), as vLLM's serving layer clamps them: a token a grammar
masked has logprob ``-inf`` among a constrained request's alternatives, which JSON cannot write (orjson wrote
``null``, where OpenAI's schema has a number).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from asyncdp.api.token_bytes import TextOffsets, token_bytes_of
from asyncdp.api.token_ids import token_id_text
from asyncdp.messages import RequestOutput, TokenLogprobs

LOGPROB_FLOOR = -9999.0


def _sent(logprob: float) -> float:
    """A logprob as sent: ``-inf`` (a masked token) is the floor."""
    return max(logprob, LOGPROB_FLOOR)


@dataclass
class Choice:
    index: int
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_cached_tokens: int = 0  # the sequence's prefix-cache hit (the engine repeats it on its outputs)
    token_ids: list[int] | None = None  # the generated ids, kept when asked (run_whole's keep_token_ids)

    @property
    def cumulative_logprob(self) -> float:
        return sum(lp.logprob for lp in self.logprobs)

    def add(self, out: RequestOutput) -> None:
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        self.text += out.new_text
        self.num_tokens += len(out.new_token_ids)
        if self.token_ids is not None:
            self.token_ids.extend(out.new_token_ids)
        if out.num_cached_tokens > self.num_cached_tokens:
            self.num_cached_tokens = out.num_cached_tokens
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        if out.finished:
            self.finish_reason = out.finish_reason
            self.stop_reason = out.stop_reason


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
          reasoning_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's ``usage``; with ``cached_tokens`` (``--enable-prompt-tokens-details``) also
    ``prompt_tokens_details.cached_tokens``, 0 included (vLLM leaves a 0 out); with ``reasoning_tokens`` (chat,
    ``--reasoning-parser``) also ``completion_tokens_details.reasoning_tokens``, 0 included (as vLLM)."""
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    if reasoning_tokens is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return out


def _token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id])


def _namer(tokenizer: Any, as_ids: bool) -> Callable[[int], str]:
    """How logprobs name a token: its text, or ``"token_id:{id}"`` (``return_tokens_as_token_ids``)."""
    return token_id_text if as_ids else partial(_token_text, tokenizer)


# ---------------------------------------------------------------------- completions


def _top(name: Callable[[int], str], lp: TokenLogprobs) -> dict[str, float]:
    top = {name(t.token_id): _sent(t.logprob) for t in lp.top}
    top.setdefault(name(lp.token_id), _sent(lp.logprob))
    return top


def completion_logprobs(
    tokenizer: Any, lps: list[TokenLogprobs], text_offsets: TextOffsets | None = None,
    prompt: tuple[list[int], list[TokenLogprobs | None]] | None = None, *, as_ids: bool = False,
) -> dict[str, Any]:
    """Completions-style logprobs. ``text_offsets`` places each token in the choice's text (its character
    offset, from the tokens' bytes: the same whether the tokens come in one piece or streamed, whatever text a
    stop string or a partial character held back); a stream passes one per choice, carried across chunks.
    ``prompt`` (token ids and their prompt logprobs) puts the echoed prompt's tokens first. ``as_ids``
    (``return_tokens_as_token_ids``): the tokens and ``top_logprobs`` keys are ``"token_id:{id}"``."""
    cursor = text_offsets if text_offsets is not None else TextOffsets(tokenizer)
    name = _namer(tokenizer, as_ids)
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    if prompt is not None:
        for token_id, entry in zip(*prompt, strict=False):
            tokens.append(name(token_id))
            token_lps.append(None if entry is None else _sent(entry.logprob))
            tops.append(None if entry is None else _top(name, entry))
            offsets.append(cursor.next(token_id))
    for lp in lps:
        tokens.append(name(lp.token_id))
        token_lps.append(_sent(lp.logprob))
        tops.append(_top(name, lp))
        offsets.append(cursor.next(lp.token_id))
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def prompt_logprobs_field(
    tokenizer: Any, prompt_ids: list[int], entries: list[TokenLogprobs | None] | None,
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs``: per prompt token, its own logprob and the top alternatives, keyed by id.
    ``rank`` is exact for a token among the alternatives; otherwise it is one past them (a lower bound)."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for entry in (entries or [])[:len(prompt_ids)]:
        if entry is None:
            out.append(None)
            continue
        ranked = {t.token_id: (rank, t.logprob) for rank, t in enumerate(entry.top, start=1)}
        ranked.setdefault(entry.token_id, (len(entry.top) + 1, entry.logprob))
        out.append({str(t): {"logprob": _sent(lp), "rank": rank, "decoded_token": _token_text(tokenizer, t)}
                    for t, (rank, lp) in ranked.items()})
    return out


@dataclass(frozen=True, slots=True)
class Echo:
    """The prompt of one choice, for ``echo`` and ``prompt_logprobs``: its text and token ids."""

    text: str
    token_ids: list[int]


def completion_choice(
    tokenizer: Any, c: Choice, *, with_logprobs: bool, echo: Echo | None = None, prompt: Echo | None = None,
    drop_generated: bool = False, index: int | None = None, as_ids: bool = False,
) -> dict[str, Any]:
    """One completions choice. ``echo``: prepend the prompt (text, and its tokens in ``logprobs``).
    ``prompt``: add vLLM's ``prompt_logprobs``. ``drop_generated``: ``max_tokens: 0``, the prompt only."""
    lps = [] if drop_generated else c.logprobs
    text = "" if drop_generated else c.text
    logprobs = None
    if with_logprobs:
        logprobs = completion_logprobs(
            tokenizer, lps, None,
            (echo.token_ids, c.prompt_logprobs or [None] * len(echo.token_ids)) if echo is not None else None,
            as_ids=as_ids)
    choice: dict[str, Any] = {
        "index": c.index if index is None else index, "text": (echo.text if echo is not None else "") + text,
        "logprobs": logprobs, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
    if prompt is not None:
        choice["prompt_logprobs"] = prompt_logprobs_field(tokenizer, prompt.token_ids, c.prompt_logprobs)
    return choice


def completion_response(
    request_id: str, created: int, model: str, choices: list[dict[str, Any]], prompt_tokens: int,
    completion_tokens: int, cached_tokens: int | None = None,
) -> dict[str, Any]:
    return {
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": sorted(choices, key=lambda c: c["index"]),
        "usage": usage(prompt_tokens, completion_tokens, cached_tokens),
    }


def completion_chunk(
    request_id: str, created: int, model: str, index: int, out: RequestOutput, logprobs: dict[str, Any] | None,
    include_usage: bool,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": index, "text": out.new_text, "logprobs": logprobs,
                     "finish_reason": out.finish_reason if out.finished else None,
                     "stop_reason": out.stop_reason if out.finished else None}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


# ---------------------------------------------------------------------- chat


def chat_logprobs(
    tokenizer: Any, lps: list[TokenLogprobs], top_n: int, *, as_ids: bool = False,
) -> dict[str, Any]:
    """OpenAI's chat logprobs: ``token`` is the token's own decoded text (U+FFFD for a part of a multi-byte
    character, as vLLM gives it), ``bytes`` its raw bytes (``asyncdp.api.token_bytes``), so a client joining
    the ``bytes`` of a run of tokens gets the text back exactly. ``as_ids`` (``return_tokens_as_token_ids``):
    every ``token`` is ``"token_id:{id}"``; the chosen token keeps its bytes, and an alternative's ``bytes`` are
    its name's, as vLLM sends them."""
    token_bytes = token_bytes_of(tokenizer)
    name = _namer(tokenizer, as_ids)

    def entry(token_id: int, logprob: float, chosen: bool) -> dict[str, Any]:
        text = name(token_id)
        raw = token_bytes(token_id) if chosen or not as_ids else text.encode()
        return {"token": text, "logprob": _sent(logprob), "bytes": list(raw)}

    return {"content": [
        {**entry(lp.token_id, lp.logprob, True),
         "top_logprobs": [entry(t.token_id, t.logprob, False) for t in lp.top[:top_n]]}
        for lp in lps
    ]}


def chat_response(
    request_id: str, created: int, model: str, choices: list[Choice], prompt_tokens: int, tokenizer: Any,
    top_logprobs: int | None, *, echo: str = "", prompt: Echo | None = None, cached_tokens: int | None = None,
    reasoning_tokens: int | None = None, as_ids: bool = False,
) -> dict[str, Any]:
    """``echo``: text prepended to every message (chat ``echo`` of a final assistant message). ``prompt``: add
    vLLM's top-level ``prompt_logprobs`` (the prompt is the same for every choice)."""
    ordered = sorted(choices, key=lambda c: c.index)
    response: dict[str, Any] = {
        "id": request_id, "object": "chat.completion", "created": created, "model": model,
        "choices": [
            {"index": c.index, "message": {"role": "assistant", "content": echo + c.text},
             "logprobs": chat_logprobs(tokenizer, c.logprobs, top_logprobs, as_ids=as_ids)
             if top_logprobs is not None else None,
             "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            for c in ordered
        ],
        "usage": usage(prompt_tokens, sum(c.num_tokens for c in choices), cached_tokens, reasoning_tokens),
    }
    if prompt is not None:
        response["prompt_logprobs"] = prompt_logprobs_field(
            tokenizer, prompt.token_ids, ordered[0].prompt_logprobs if ordered else None)
    return response


def chat_chunk(
    request_id: str, created: int, model: str, index: int, delta: dict[str, Any], *,
    logprobs: dict[str, Any] | None = None, finish_reason: str | None = None, stop_reason: str | int | None = None,
    include_usage: bool = False,
) -> dict[str, Any]:
    chunk: dict[str, Any] = {
        "id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
                     "stop_reason": stop_reason}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(request_id: str, created: int, model: str, obj: str, prompt_tokens: int,
                completion_tokens: int, cached_tokens: int | None = None,
                reasoning_tokens: int | None = None) -> dict[str, Any]:
    return {"id": request_id, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens)}
