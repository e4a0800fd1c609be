"""Build OpenAI response objects (completions and chat, whole and streamed) from ``RequestOutput`` deltas.

``Choice`` accumulates one sequence's deltas. The functions here are pure: ids, timestamps and the tokenizer
are passed in, so the shapes can be checked without a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asyncdp.messages import RequestOutput, TokenLogprobs


@dataclass
class Choice:
    index: int
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)

    def add(self, out: RequestOutput) -> None:
        self.text += out.new_text
        self.num_tokens += len(out.new_token_ids)
        if out.logprobs:
            self.logprobs.extend(out.logprobs)
        if out.finished:
            self.finish_reason = out.finish_reason
            self.stop_reason = out.stop_reason


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _token_text(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id])


# ---------------------------------------------------------------------- completions


def completion_logprobs(tokenizer: Any, lps: list[TokenLogprobs], text_offset: int) -> dict[str, Any]:
    """Completions-style logprobs; ``text_offset`` is where the first token starts in the choice's text."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for lp in lps:
        text = _token_text(tokenizer, lp.token_id)
        tokens.append(text)
        token_lps.append(lp.logprob)
        tops.append({_token_text(tokenizer, t.token_id): t.logprob for t in lp.top})
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def completion_response(
    request_id: str, created: int, model: str, choices: list[Choice], prompt_tokens: int, tokenizer: Any,
    with_logprobs: bool,
) -> dict[str, Any]:
    return {
        "id": request_id, "object": "text_completion", "created": created, "model": model,
        "choices": [
            {"index": c.index, "text": c.text,
             "logprobs": completion_logprobs(tokenizer, c.logprobs, 0) if with_logprobs else None,
             "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            for c in sorted(choices, key=lambda c: c.index)
        ],
        "usage": usage(prompt_tokens, sum(c.num_tokens for c in choices)),
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


def chat_logprobs(tokenizer: Any, lps: list[TokenLogprobs], top_n: int) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = _token_text(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [
        {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t.token_id, t.logprob) for t in lp.top[:top_n]]}
        for lp in lps
    ]}


def chat_response(
    request_id: str, created: int, model: str, choices: list[Choice], prompt_tokens: int, tokenizer: Any,
    top_logprobs: int | None,
) -> dict[str, Any]:
    return {
        "id": request_id, "object": "chat.completion", "created": created, "model": model,
        "choices": [
            {"index": c.index, "message": {"role": "assistant", "content": c.text},
             "logprobs": chat_logprobs(tokenizer, c.logprobs, top_logprobs) if top_logprobs is not None else None,
             "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            for c in sorted(choices, key=lambda c: c.index)
        ],
        "usage": usage(prompt_tokens, sum(c.num_tokens for c in choices)),
    }


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
                completion_tokens: int) -> dict[str, Any]:
    return {"id": request_id, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}
