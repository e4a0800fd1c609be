"""Chat messages as the chat template receives them, from the shapes client libraries send (vLLM's rules).

``content`` is a string, null (empty) or a list of parts. The parts that carry text (``TEXT_PARTS``: OpenAI's
``text`` and ``refusal``, the Responses API's ``input_text``/``output_text``, ``thinking``) make the content; any
other part (``image_url``, ``input_audio``, ``file``, ...) is a 400 naming the part, since asyncdp serves
text-only models. How the content reaches the template depends on the template's content format
(:mod:`asyncdp.api.content_format`): for a "string" template the texts joined with ``"\\n"``; for an "openai"
template a list with one ``{"type": "text", "text": ...}`` part per text (a string content is one part, null
none), except a ``tool`` message's, which stays the joined text (vLLM's rule: templates print a tool result as
text). ``name``, ``tool_calls`` and ``tool_call_id`` reach the template as given, except that a tool call's
``arguments`` written as a JSON string (OpenAI's shape) are decoded to the object tool-call templates expect
(Transformers' convention, which vLLM follows; a string that is not JSON stays a string, so the template shows
what the model wrote; none, null or "", is an empty object, as in vLLM), an empty ``tool_calls`` list is dropped
so the template takes its plain assistant path, and a call that is not a function call is a 400. An assistant
message's reasoning (``reasoning``, or ``reasoning_content``, the name DeepSeek's API and clients such as
Qwen-Agent send back) reaches the template as both ``reasoning`` and ``reasoning_content``, as vLLM passes it, for
templates that render earlier turns' thinking (Qwen3's ``<think>`` blocks).

Roles reach the template as given, except ``developer`` for a template without that role of its own
(:mod:`asyncdp.api.template_roles`): it is ``system`` there, and all the system messages of such a request are
merged into one, first, as vLLM's renderer does. A system message's content has the shape the template shows it
in (``TemplateRoles.system_format``): a string wherever a string shows, whatever the content format.
"""

from __future__ import annotations

from typing import Any

import orjson

from asyncdp.api.schemas import ChatMessage
from asyncdp.api.template_roles import DEVELOPER, TemplateRoles
from asyncdp.errors import HTTPError

# Part type -> the key holding its text.
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal",
              "thinking": "thinking"}

NO_ROLES = TemplateRoles()  # (a template with no developer role, shown a string system message)

# Message fields besides role and content that reach the chat template, when given (vLLM's too).
_PASSED_MESSAGE_FIELDS = ("name", "tool_calls", "tool_call_id")


def _bad(field: str, message: str) -> HTTPError:
    return HTTPError(400, message, param=field)


def _texts_of(content: Any, where: str) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise _bad(where, f"{where} must be a string, null or a list of content parts.")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise _bad(at, f'{at} must be an object with a string "type", such as {{"type": "text", "text": "..."}}.')
        key = TEXT_PARTS.get(kind)
        if key is None:
            raise _bad(at, f"{at} has type {kind!r}: this server serves a text-only model, so its content parts "
                           f"may only be of type {', '.join(repr(t) for t in TEXT_PARTS)}.")
        text = part.get(key)
        if not isinstance(text, str):
            raise _bad(f"{at}.{key}", f"{at}.{key} must be a string (a {kind!r} part carries its text there).")
        texts.append(text)
    return texts


def _template_tool_calls(calls: list[Any], where: str) -> list[Any]:
    """``tool_calls`` as the template gets them (copies; the request is untouched): each ``function.arguments``
    JSON string decoded, and none (null or "") an empty object, as vLLM gives them. A call that is not a function
    call is a 400, as in vLLM; so is one without a string ``name``, or whose ``arguments`` are neither JSON text,
    an object nor null (OpenAI refuses both; templates would fail on them, or print them as they are)."""
    out = []
    for j, call in enumerate(calls):
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, dict):
            raise _bad(f"{where}[{j}]", f'{where}[{j}] must be a function call, {{"type": "function", "function": '
                                        f'{{"name": ..., "arguments": ...}}}}: chat completions take no other kind.')
        at = f"{where}[{j}].function"
        if not isinstance(function.get("name"), str):
            raise _bad(f"{at}.name", f"{at}.name must be a string: the name of the function called.")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, (str, dict)):
            raise _bad(f"{at}.arguments", f"{at}.arguments must be a string of JSON (or an object, or null).")
        if not arguments:
            arguments = {}
        elif isinstance(arguments, str):
            try:
                arguments = orjson.loads(arguments)
            except orjson.JSONDecodeError:
                pass  # (the string the model wrote)
        out.append({**call, "function": {**function, "arguments": arguments}})
    return out


def _content(texts: list[str], role: str, content_format: str) -> str | list[dict[str, str]]:
    if content_format == "openai" and role != "tool":
        return [{"type": "text", "text": text} for text in texts]
    return "\n".join(texts)


def content_text(content: str | list[dict[str, str]]) -> str:
    """A template message's content as text, whichever format it is in (the text parts joined with "\\n")."""
    return content if isinstance(content, str) else "\n".join(part["text"] for part in content)


def chat_messages(messages: list[ChatMessage], content_format: str = "string",
                  roles: TemplateRoles = NO_ROLES) -> list[dict[str, Any]]:
    """The messages for ``apply_chat_template``: role, content in ``content_format`` ("string" or "openai"; a
    system message's in ``roles.system_format``), and the passed fields the message has. ``developer`` is
    ``system`` unless the template has that role (``roles.developer_role``)."""
    if not messages:
        raise _bad("messages", "messages must be a non-empty list.")
    out = []
    renamed = False
    for i, m in enumerate(messages):
        texts = _texts_of(m.content, f"messages[{i}].content")
        role = m.role
        if role == DEVELOPER and not roles.developer_role:
            role, renamed = "system", True
        fmt = roles.system_format if role == "system" else content_format
        entry: dict[str, Any] = {"role": role, "content": _content(texts, role, fmt)}
        for name in _PASSED_MESSAGE_FIELDS:
            value = getattr(m, name)
            if name == "tool_calls" and value is not None:
                value = _template_tool_calls(value, f"messages[{i}].tool_calls") if value else None
            if value is not None:
                entry[name] = value
        reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
        if reasoning is not None and m.role == "assistant":  # (vLLM passes no other role's)
            entry["reasoning"] = entry["reasoning_content"] = reasoning
        out.append(entry)
    return _one_system_message(out, roles.system_format) if renamed else out


def _one_system_message(messages: list[dict[str, Any]], system_format: str) -> list[dict[str, Any]]:
    """With a developer message renamed ``system``: every system message merged into one, first (their texts
    joined by a blank line, in order), as vLLM does, since templates take one system prompt, at the start."""
    systems = [m for m in messages if m["role"] == "system"]
    if len(systems) == 1 and messages[0] is systems[0]:
        return messages
    text = "\n\n".join(content_text(m["content"]) for m in systems)
    first = {"role": "system", "content": _content([text], "system", system_format)}
    return [first, *(m for m in messages if m["role"] != "system")]
