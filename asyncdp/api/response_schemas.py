"""JSON Schemas of the chat answers, for ``GET /openapi.json`` (``asyncdp.api.openapi``).

They describe what ``asyncdp.api.openai_format`` and ``asyncdp.api.chat`` send, flags included: a message's
``content`` may be null (an answer of tool calls alone, or one that only thought), its ``tool_calls`` (a named or
``"required"`` tool choice, and ``"auto"`` with ``--enable-auto-tool-choice``), ``finish_reason: "tool_calls"``,
and, with ``--reasoning-parser``, ``message.reasoning`` on every message (a string or null),
``delta.reasoning`` in a stream and ``usage.completion_tokens_details.reasoning_tokens``; with
``return_token_ids``, ``prompt_token_ids`` (top-level: the whole answer, and each choice's first chunk) and each
choice's ``token_ids``. A streamed answer is described event by event, as OpenAPI 3.2's ``itemSchema``
(schemathesis reads a 3.1 ``schema`` of ``text/event-stream`` that way): each event's ``data`` is a chunk or an
error as JSON, or ``[DONE]``. Objects stay open (``additionalProperties`` allowed), as OpenAI adds fields.
"""

from __future__ import annotations

from typing import Any

_REF = "#/components/schemas/{name}"
_NULLABLE_STRING = {"type": ["string", "null"]}
_FINISH_REASONS = ["stop", "length", "tool_calls", "abort", "error"]

_TOP_LOGPROB: dict[str, Any] = {"type": "object", "required": ["token", "logprob", "bytes"], "properties": {
    "token": {"type": "string"}, "logprob": {"type": "number"},
    "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}}}}
_LOGPROBS: dict[str, Any] = {"anyOf": [{"type": "null"}, {"type": "object", "required": ["content"], "properties": {"content": {
    "type": "array", "items": {**_TOP_LOGPROB, "required": ["token", "logprob", "bytes", "top_logprobs"],
                               "properties": {**_TOP_LOGPROB["properties"],
                                              "top_logprobs": {"type": "array", "items": _TOP_LOGPROB}}}}}}]}
_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"], "properties": {
    "prompt_tokens": {"type": "integer", "minimum": 0}, "completion_tokens": {"type": "integer", "minimum": 0},
    "total_tokens": {"type": "integer", "minimum": 0},
    "prompt_tokens_details": {"type": "object", "required": ["cached_tokens"],
                              "properties": {"cached_tokens": {"type": "integer", "minimum": 0}}},
    "completion_tokens_details": {"type": "object", "required": ["reasoning_tokens"],
                                  "properties": {"reasoning_tokens": {"type": "integer", "minimum": 0}}}}}
_PROMPT_LOGPROBS = {"type": "array", "items": {"anyOf": [{"type": "null"}, {
    "type": "object", "additionalProperties": {"type": "object", "required": ["logprob", "rank", "decoded_token"]}}]}}
_STOP_REASON = {"type": ["string", "integer", "null"]}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_NULLABLE_IDS = {"anyOf": [{"type": "null"}, _IDS]}  # null: withheld with the hidden thinking
_FUNCTION = {"type": "object", "required": ["name", "arguments"],
             "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}
_TOOL_CALL = {"type": "object", "required": ["id", "type", "function"], "properties": {
    "id": {"type": "string"}, "type": {"const": "function"}, "function": _FUNCTION}}
# A streamed call: the first delta of a call has its id, type and name; a named tool choice's later deltas carry
# more of the arguments only.
_TOOL_CALL_DELTA = {"type": "object", "required": ["index"], "properties": {
    "index": {"type": "integer", "minimum": 0}, "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}
_HEADER = {"id": {"type": "string"}, "created": {"type": "integer"}, "model": {"type": "string"}}


def chat_response_schemas(*, reasoning: bool) -> dict[str, Any]:
    """The components ``ChatCompletion``, ``ChatCompletionChunk`` and ``ChatCompletionEvent`` (an SSE event).
    ``reasoning``: the server has a reasoning parser, so every message has ``reasoning``."""
    message = {"type": "object", "required": ["role", "content", *(["reasoning"] if reasoning else [])],
               "properties": {"role": {"const": "assistant"}, "content": _NULLABLE_STRING,
                              "reasoning": _NULLABLE_STRING,
                              "tool_calls": {"type": "array", "items": _TOOL_CALL}}}
    choice = {"type": "object", "required": ["index", "message", "logprobs", "finish_reason"], "properties": {
        "index": {"type": "integer", "minimum": 0}, "message": message, "logprobs": _LOGPROBS,
        "finish_reason": {"enum": _FINISH_REASONS}, "stop_reason": _STOP_REASON, "token_ids": _NULLABLE_IDS}}
    completion = {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
                  "properties": {**_HEADER, "object": {"const": "chat.completion"},
                                 "choices": {"type": "array", "items": choice}, "usage": _USAGE,
                                 "prompt_logprobs": _PROMPT_LOGPROBS, "prompt_token_ids": _IDS}}
    delta = {"type": "object", "properties": {
        "role": {"const": "assistant"}, "content": _NULLABLE_STRING, "reasoning": {"type": "string"},
        "tool_calls": {"type": "array", "items": _TOOL_CALL_DELTA}}}
    chunk_choice = {"type": "object", "required": ["index", "delta", "finish_reason"], "properties": {
        "index": {"type": "integer", "minimum": 0}, "delta": delta, "logprobs": _LOGPROBS,
        "finish_reason": {"enum": [*_FINISH_REASONS, None]}, "stop_reason": _STOP_REASON, "token_ids": _IDS}}
    chunk = {"type": "object", "required": ["id", "object", "created", "model", "choices"],
             "properties": {**_HEADER, "object": {"const": "chat.completion.chunk"},
                            "choices": {"type": "array", "items": chunk_choice},
                            "usage": {"anyOf": [{"type": "null"}, _USAGE]}, "prompt_logprobs": _PROMPT_LOGPROBS,
                            "prompt_token_ids": _IDS}}
    return {"ChatCompletion": completion, "ChatCompletionChunk": chunk, "ChatCompletionEvent": sse_event(
        "ChatCompletionChunk")}


def sse_event(chunk: str) -> dict[str, Any]:
    """One Server-Sent Event of a stream of ``chunk`` components: ``data`` is ``[DONE]``, or JSON holding a
    chunk or (a failure after the stream started) an error."""
    return {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}},
            "if": {"properties": {"data": {"const": "[DONE]"}}},
            "else": {"properties": {"data": {
                "contentMediaType": "application/json",
                "contentSchema": {"anyOf": [{"$ref": _REF.format(name=chunk)},
                                            {"$ref": _REF.format(name="ErrorResponse")}]}}}}}
