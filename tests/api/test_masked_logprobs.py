"""A token a grammar masked has logprob ``-inf`` among a constrained request's ``top_logprobs`` (the engine ranks the
alternatives after the mask: with ``guided_choice: ["yes", "no"]`` and ``top_logprobs: 2``, the token after "n"
has one allowed alternative). JSON has no ``-inf``: orjson wrote it as ``null``, so the answer said
``"logprob": null`` where OpenAI's schema (and the served document) has a number, and clients summing logprobs
failed. Every logprob the API sends is now at least -9999.0, as vLLM's serving layer clamps them, on both routes,
whole and streamed, and in ``prompt_logprobs``."""

from __future__ import annotations

import math

import orjson

from asyncdp.api.openai_format import chat_logprobs, completion_logprobs, prompt_logprobs_field
from asyncdp.messages import Logprob, TokenLogprobs
from asyncdp.testing import byte_tokenizer

MASKED = TokenLogprobs(token_id=ord("o"), logprob=0.0, top=(Logprob(token_id=ord("o"), logprob=0.0),
                                                            Logprob(token_id=0, logprob=-math.inf)))


def numbers(obj: object) -> list[object]:
    """Every value under a ``logprob``/``token_logprobs`` key or in a ``top_logprobs`` dict, after a JSON trip."""
    found: list[object] = []

    def walk(x: object, key: str = "") -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, "top" if key == "top_logprobs" and isinstance(v, (int, float, type(None))) else k)
        elif isinstance(x, list):
            for v in x:
                walk(v, key)
        elif key in ("logprob", "token_logprobs", "top"):
            found.append(x)

    walk(orjson.loads(orjson.dumps(obj)))
    return found


def test_a_masked_alternative_is_a_number_not_null() -> None:
    tok = byte_tokenizer()
    chat = numbers(chat_logprobs(tok, [MASKED], 2))
    completion = numbers(completion_logprobs(tok, [MASKED]))
    prompt = numbers(prompt_logprobs_field(tok, [ord("o")], [MASKED]))
    for found in (chat, completion, prompt):
        assert found and all(isinstance(v, float) for v in found), found
        assert min(float(v) for v in found) == -9999.0  # type: ignore[arg-type]
