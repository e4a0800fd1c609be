"""OpenAI request bodies as msgspec structs, and their translation into what the engine client takes.

Decoding checks JSON syntax and field types (a wrong type is a 400 naming the field, via
``asyncdp.api.errors.HTTPError``); ``SamplingParams.validate()`` checks ranges. Unknown fields are ignored, as
OpenAI-compatible servers do. Rank hints (spec §7.6) are parsed here from headers and body into a ``RankHint``;
range checks (E2, E3) belong to the client, which knows the managed ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from asyncdp.api.engine_client import RankHint
from asyncdp.api.errors import HTTPError
from asyncdp.sampling_params import SamplingParams


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _Common(msgspec.Struct, kw_only=True):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0  # accepted for compatibility; the engine does not apply penalties
    frequency_penalty: float = 0.0
    user: str | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    data_parallel_rank: Any = None  # typed by parse_rank_hint, so a bad value gets the E1 message
    data_parallel_global_rank: Any = None


class CompletionRequest(_Common, kw_only=True):
    prompt: Any = None  # str | list[str] | list[int] | list[list[int]]; checked by prompts()
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: Any = None  # str | list of {"type": "text", "text": ...} | None
    name: str | None = None


class ChatRequest(_Common, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None


def decode_body(data: bytes | str, kind: type[msgspec.Struct]) -> Any:
    if not data.strip():
        raise HTTPError(400, "The request body is empty; expected a JSON object.")
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.ValidationError as exc:
        raise HTTPError(400, f"Invalid request body: {exc}", param=_field_of(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise HTTPError(400, f"The request body is not valid JSON: {exc}") from None


def _field_of(message: str) -> str | None:
    # msgspec says "... - at `$.messages[0].role`" or "Object missing required field `messages`".
    if "`$." in message:
        return message.split("`$.", 1)[1].split("`", 1)[0]
    if "field `" in message:
        return message.split("field `", 1)[1].split("`", 1)[0]
    return None


def _bad(field: str, message: str) -> HTTPError:
    return HTTPError(400, message, param=field)


def prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The completion prompts: one string, a list of strings, token ids, or a list of token-id lists."""
    p = req.prompt
    if isinstance(p, str):
        return [p]
    if isinstance(p, list) and p:
        if all(isinstance(x, str) for x in p):
            return list(p)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return [list(p)]
        if all(isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
               for x in p):
            return [list(x) for x in p]
    raise _bad("prompt", "prompt must be a string, a list of strings, a list of token ids, "
                         "or a list of token-id lists (non-empty).")


def chat_messages(req: ChatRequest) -> list[dict[str, str]]:
    """Messages as the chat template expects them: role and plain-text content."""
    if not req.messages:
        raise _bad("messages", "messages must be a non-empty list.")
    out = []
    for i, m in enumerate(req.messages):
        content = m.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text"
                                               and isinstance(part.get("text"), str) for part in content):
            text = "".join(part["text"] for part in content)
        else:
            raise _bad(f"messages[{i}].content", "message content must be a string or a list of text parts.")
        out.append({"role": m.role, "content": text})
    return out


def sampling_params(req: CompletionRequest | ChatRequest, *, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    """The per-sequence sampling parameters (n is fanned out by the caller), range-checked."""
    stop: tuple[str, ...] = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    params = SamplingParams(
        n=req.n,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=0 if req.top_k is None else req.top_k,
        min_p=0.0 if req.min_p is None else req.min_p,
        seed=req.seed,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        stop=stop,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        include_stop_str_in_output=req.include_stop_str_in_output,
        logprobs=logprobs,
        skip_special_tokens=req.skip_special_tokens,
    )
    return params.validate()


def _as_int(field: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _bad(field, f"{field} must be an integer (got {value!r}).")


def _rank_headers(headers: Any) -> tuple[str | None, str | None]:
    """The first ``X-data-parallel-rank`` and ``X-data-parallel-global-rank`` values (names case-insensitive),
    in one pass: werkzeug's ``Headers.get`` scans every header per name, which showed per request."""
    local = global_ = None
    for name, value in headers.items():
        key = name.lower()
        if key == "x-data-parallel-rank":
            if local is None:
                local = value
        elif key == "x-data-parallel-global-rank" and global_ is None:
            global_ = value
    return local, global_


def _one_of(field: str, header: str | None, body: Any) -> int | None:
    from_header = _as_int(field, header) if header is not None else None
    from_body = _as_int(field, body) if body is not None else None
    if from_header is not None and from_body is not None and from_header != from_body:
        raise _bad(field, f"conflicting rank hints: header says {field}={from_header}, body says {from_body}.")
    return from_header if from_header is not None else from_body


def parse_rank_hint(
    headers: Any, req: _Common, managed_ranks: Callable[[], list[dict[str, Any]] | None] | None = None,
) -> RankHint | None:
    """Read ``X-data-parallel-rank`` / ``data_parallel_rank`` (local index) and the global forms.

    ``managed_ranks`` (a call returning ``server_info()["managed_ranks"]``, made only then) lets a local and a global hint be compared: if both are given
    and name different engines, that is a 400 here.
    """
    local_header, global_header = _rank_headers(headers)
    local = _one_of("data_parallel_rank", local_header, req.data_parallel_rank)
    global_ = _one_of("data_parallel_global_rank", global_header, req.data_parallel_global_rank)
    if local is None and global_ is None:
        return None
    ranks = managed_ranks() if local is not None and global_ is not None and managed_ranks else None
    if ranks:
        by_index = {r.get("local_index"): r.get("dp_rank") for r in ranks}
        if local in by_index and by_index[local] != global_:
            raise _bad("data_parallel_rank",
                       f"conflicting rank hints: data_parallel_rank {local} is engine {by_index[local]}, "
                       f"but data_parallel_global_rank is {global_}.")
    return RankHint(local_index=local, global_rank=global_)
