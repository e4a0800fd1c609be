"""vLLM's token-id request parameters, shared by the completions and chat routes.

``truncate_prompt_tokens``: keep only the last k tokens of each (tokenized or rendered) prompt before the length
check, as vLLM does (its tokenizers truncate on the left). ``-1`` keeps the most the context holds besides the
output: ``max_model_len - max_tokens`` (``max_tokens`` counted as 0 when absent, as vLLM counts it). A k above
that, or 0 (which would leave no prompt), is a 400 naming the parameter (vLLM's message for the first).
``usage.prompt_tokens`` counts the tokens kept.

``return_token_ids``: the prompt's token ids (``prompt_token_ids``: top-level for chat, on each choice for
completions) and each choice's generated ids (``token_ids``); a stream sends the prompt's ids in each choice's
first chunk and each chunk's new ids in its choice.

``return_tokens_as_token_ids``: logprobs name their tokens ``"token_id:{id}"`` (``token_id_text``).
"""

from __future__ import annotations

from typing import Any

from asyncdp.errors import HTTPError

FIELD = "truncate_prompt_tokens"


def token_id_text(token_id: int) -> str:
    """A token as ``return_tokens_as_token_ids`` names it in logprobs (vLLM's placeholder)."""
    return f"token_id:{token_id}"


def truncate_prompt(ids: list[int], keep: int | None, max_model_len: int, max_tokens: int | None,
                    max_tokens_field: str) -> list[int]:
    """The last ``keep`` tokens of ``ids`` (all of them when ``keep`` is None or the prompt is shorter)."""
    if keep is None:
        return ids
    room = max_model_len - (max_tokens or 0)
    if keep == 0:
        raise HTTPError(400, f"{FIELD}=0 would leave an empty prompt: give at least 1, or -1 for the most the "
                             f"context holds.", param=FIELD)
    if keep > room:
        raise HTTPError(400, f"{FIELD}={keep} cannot be greater than max_model_len - {max_tokens_field} = {room}. "
                             f"Please request a smaller truncation size.", param=FIELD)
    if keep < 0:  # -1: the room besides the output (none left: the length check names the limit)
        keep = room
    return ids[-keep:] if 0 < keep < len(ids) else ids


def add_chat_token_ids(doc: dict[str, Any], prompt_ids: list[int], generated: dict[int, list[int] | None],
                       hidden: bool) -> None:
    """A whole chat answer's ``prompt_token_ids`` and each choice's ``token_ids`` (null when the reasoning, which
    they would show, is hidden, as vLLM does)."""
    doc["prompt_token_ids"] = prompt_ids
    for choice in doc["choices"]:
        choice["token_ids"] = None if hidden else generated[choice["index"]]
