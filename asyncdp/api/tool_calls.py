"""Tool calling: the tool choices served without a tool-call parser, as vLLM serves them without
``--enable-auto-tool-choice``, and ``"auto"`` with one (``--enable-auto-tool-choice --tool-call-parser NAME``).

The three tool choices that need no parser:

- ``tool_choice: "none"`` with ``tools``: the tools reach the chat template (``tools=``, as vLLM passes them by
  default), and the answer is text.
- a named function, ``{"type": "function", "function": {"name": F}}``: the output is constrained to F's
  ``parameters`` schema (``{"type": "object", "properties": {}}`` when it has none); the answer is one tool call
  of F whose ``arguments`` is the generated JSON, with ``content: ""`` and the finish reason as generated.
- ``"required"``: the output is constrained to a JSON array of ``{"name", "parameters"}`` objects, one tool each
  (at least one item; at most one with ``parallel_tool_calls: false``), turned into tool calls, with
  ``finish_reason: "tool_calls"``. A ``$defs`` inside a tool's parameters is hoisted to the array's root, where
  its ``#/$defs/...`` references resolve.

``"auto"`` with tools (and tools without a ``tool_choice``, which means ``"auto"``) needs the parser. Without
``--enable-auto-tool-choice`` it is a 400 naming the flags, as in vLLM. With it, the model generates freely (the
tools reach the template) and the server's parser (:mod:`asyncdp.api.tool_parsers`) finds the calls in the
text: the answer's ``content`` is the text outside the calls (``null`` when only whitespace is left), its
``tool_calls`` the calls, and ``finish_reason`` is ``"tool_calls"`` when it has calls and stopped by itself
(``"length"`` stays: the answer was cut, which a client should know; vLLM reports ``"tool_calls"`` then too).
With ``parallel_tool_calls: false`` only the first call the parser finds is returned (streamed: sent, at index 0)
and the later ones are dropped, as vLLM drops them; the model still generates to its end.
An answer without calls is the plain text answer (``null`` when empty, as its stream accumulates it). When the tokenizer marks the parser's tags as special tokens,
the text is detokenized with ``skip_special_tokens`` false unless the request sets it, or the tags would be
dropped (vLLM's hermes parser turns it off for every tool request).

``"auto"`` and ``"none"`` without tools ask for nothing. A tool choice whose answer is tool calls cannot be
combined with ``echo``, and one that constrains the output not with another structured-output constraint.

Streaming: a named function's text is sent as it comes, as the ``arguments`` of one tool-call delta per chunk
(the first carrying the call's ``id``, ``type`` and ``name``); ``"required"`` holds the text back until the
choice ends, since the array is only known to be complete then, and sends every call in one delta. ``"auto"``
sends content as it comes, holding back what could begin a call's tag and whitespace not yet followed by text,
and each call in one delta (``index``, ``id``, ``type``, ``name`` and the whole ``arguments``) when its block
closes; its first chunk has ``content: null`` rather than ``""``, so a client that accumulates the deltas (the
``openai`` library's stream helpers) gets the same message as without streaming.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from asyncdp.api.schemas import ChatRequest, NamedToolChoice, ToolDefinition
from asyncdp.api.tool_parsers import AutoToolCalls, ParsedCall, ToolCallParser
from asyncdp.errors import HTTPError, InvalidSamplingParams
from asyncdp.sampling_params.structured import StructuredOutputs, check_schema_depth

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolUse:
    """What a chat request's ``tools`` and ``tool_choice`` ask for."""

    template_tools: list[dict[str, Any]] | None  # for the chat template's ``tools``
    function: str | None = None  # a named tool choice
    required: bool = False
    constraint: StructuredOutputs | None = None  # None for "none" and "auto": the model writes freely
    parser: type[ToolCallParser] | None = None  # "auto": finds the calls in the text
    tool_names: frozenset[str] = frozenset()
    # "auto": each tool's parameters schema, for a parser that types the arguments by it (qwen3_coder)
    tool_parameters: dict[str, Any] = field(default_factory=dict)
    parallel: bool = True  # "auto": false keeps only the first call the parser finds

    @property
    def calls(self) -> bool:
        """Whether the answer's text is turned into tool calls (a constraint, or a parser looking for them)."""
        return self.constraint is not None or self.parser is not None

    def auto(self) -> AutoToolCalls:
        """A fresh parse of one choice's answer (``"auto"`` only)."""
        assert self.parser is not None
        return AutoToolCalls(self.parser(self.tool_names, self.tool_parameters), self.parallel)

    def call_id(self) -> str:
        """A new call's id: the parser's kind (``mistral``'s has nine letters and digits), else vLLM's."""
        return self.parser.call_id() if self.parser is not None else call_id()


def tool_use(req: ChatRequest, parser: type[ToolCallParser] | None = None) -> ToolUse | None:
    """The request's tool use, checked; None when it has no tools and asks for none. ``parser``: the server's
    tool-call parser when ``--enable-auto-tool-choice`` is on (else ``"auto"`` with tools is a 400)."""
    tools = req.tools or []
    choice = req.tool_choice
    if not tools and (choice is None or choice in ("none", "auto")):
        return None
    if not tools:
        raise HTTPError(400, "tool_choice needs tools: give the functions it may call in tools (with no tool-call "
                             'parser, this server serves tools with tool_choice "none", "required" or a named '
                             "function).", param="tool_choice")
    dicts = template_tools(tools)
    if choice == "none":
        return ToolUse(dicts)
    if choice is None or choice == "auto":
        if parser is not None:
            return ToolUse(dicts, parser=parser, tool_names=frozenset(t.function.name for t in tools),
                           tool_parameters={t.function.name: t.function.parameters for t in tools},
                           parallel=req.parallel_tool_calls is not False)
        raise HTTPError(400, 'tools with tool_choice "auto" (the default with tools) need a tool-call parser to find '
                             "the calls in free text: start the server with --enable-auto-tool-choice and "
                             "--tool-call-parser (hermes, llama3_json, llama4_pythonic, mistral, openai, pythonic "
                             "or qwen3_coder), or set tool_choice to \"none\", \"required\" or a named function.",
                        param="tools")
    if isinstance(choice, NamedToolChoice):
        by_name = {t.function.name: t for t in tools}
        if choice.function.name not in by_name:
            raise HTTPError(400, f"tool_choice names the function {choice.function.name!r}, which is not in tools.",
                            param="tool_choice.function.name")
        schema = by_name[choice.function.name].function.parameters or _EMPTY_PARAMETERS
        return ToolUse(dicts, function=choice.function.name, constraint=_compiled(schema))
    items: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for i, t in enumerate(tools):
        params = dict(t.function.parameters or _EMPTY_PARAMETERS)
        tool_defs = params.pop("$defs", None) or {}
        if not isinstance(tool_defs, dict):
            raise HTTPError(400, "tools: $defs must be an object of JSON schemas.", param=f"tools[{i}].function.parameters")
        for name, definition in tool_defs.items():
            if name in defs and defs[name] != definition:
                raise HTTPError(400, f"tools define $defs {name!r} twice, differently; a required tool choice "
                                     "puts every tool's $defs in one schema.", param=f"tools[{i}].function.parameters")
            defs[name] = definition
        items.append({"properties": {"name": {"type": "string", "enum": [t.function.name]}, "parameters": params},
                      "required": ["name", "parameters"]})
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return ToolUse(dicts, required=True, constraint=_compiled(schema))


def template_tools(tools: list[ToolDefinition]) -> list[dict[str, Any]]:
    """The tools as the chat template gets them: OpenAI's shape, the fields given."""
    return [{"type": "function", "function": {k: v for k, v in (
        ("name", t.function.name), ("description", t.function.description), ("parameters", t.function.parameters),
        ("strict", t.function.strict)) if v is not None}} for t in tools]


def _compiled(schema: dict[str, Any]) -> StructuredOutputs:
    """The constraint for ``schema``, compiled now: a schema the grammar library refuses is a 400 naming tools."""
    try:
        check_schema_depth(schema, "tools")
        constraint = StructuredOutputs(json_schema=json.dumps(schema), param="tool_choice")
        constraint.validate()
    except InvalidSamplingParams as exc:
        raise HTTPError(400, f"tools: the functions' parameters cannot be used as a grammar: {exc}",
                        param="tools") from None
    return constraint


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def _call(name: str, arguments: str, call: str | None = None) -> dict[str, Any]:  # (an OpenAI tool call)
    return {"id": call or call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}


def required_calls(text: str) -> list[dict[str, Any]] | None:
    """The tool calls of a ``"required"`` answer, or None when the text is not a complete array of calls (cut
    short by ``max_tokens`` or a stop string)."""
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, list) or not all(
                isinstance(x, dict) and isinstance(x.get("name"), str) and "parameters" in x for x in parsed):
            return None
        return [_call(x["name"], json.dumps(x["parameters"], ensure_ascii=False)) for x in parsed]
    except (ValueError, RecursionError):  # (a schema that allows any object allows nesting past the limit)
        return None


def answer(use: ToolUse, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
    """A whole answer's message and finish reason. A ``"required"`` answer that is not a complete array of calls
    (cut short) comes back as text, with its finish reason. A named function's answer with no text (one that
    ended in its thinking, under a reasoning parser) has no call, as a stream of it sends none."""
    if use.function is not None:
        if not text:
            return {"role": "assistant", "content": ""}, finish_reason
        return {"role": "assistant", "content": "", "tool_calls": [_call(use.function, text)]}, finish_reason
    if use.parser is not None:
        content, found = use.auto().feed(text, finished=True)
        if not found:
            return {"role": "assistant", "content": content}, finish_reason
        return {"role": "assistant", "content": content or None, "tool_calls": [_parsed(use, c) for c in found]}, (
            "tool_calls" if finish_reason == "stop" else finish_reason)
    calls = required_calls(text)
    if calls is None:
        return {"role": "assistant", "content": text}, finish_reason
    return {"role": "assistant", "content": "", "tool_calls": calls}, (
        "tool_calls" if finish_reason == "stop" else finish_reason)


def _parsed(use: ToolUse, call: ParsedCall) -> dict[str, Any]:
    return _call(call.name, call.arguments, use.call_id())


class StreamedCalls:
    """One choice's tool calls, streamed: the deltas to send for each piece of text (see the module doc)."""

    def __init__(self, use: ToolUse) -> None:
        self._use = use
        self._id: str | None = None  # a named function's call, once its first delta went out
        self._held: list[str] = []  # "required": the text so far
        self._auto = use.auto() if use.parser is not None else None

    def delta(self, new_text: str, finished: bool, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The delta for ``new_text`` (maybe empty), and the finish reason to send with it when ``finished``."""
        if self._auto is not None:
            content, found = self._auto.feed(new_text, finished)
            delta: dict[str, Any] = {"content": content} if content else {}
            if found:  # (indexes go on from the calls sent before: num_calls counts these too)
                first = self._auto.num_calls - len(found)
                delta["tool_calls"] = [{"index": first + i, **_parsed(self._use, c)} for i, c in enumerate(found)]
            if finished and self._auto.num_calls and finish_reason == "stop":
                finish_reason = "tool_calls"
            return delta, finish_reason
        if self._use.function is not None:
            if not new_text:
                return {}, finish_reason
            if self._id is None:
                self._id = call_id()
                call = {"index": 0, **_call(self._use.function, new_text, self._id)}
            else:
                call = {"index": 0, "function": {"arguments": new_text}}
            return {"tool_calls": [call]}, finish_reason
        self._held.append(new_text)
        if not finished:
            return {}, None
        text = "".join(self._held)
        calls = required_calls(text)
        if calls is None:
            return ({"content": text} if text else {}), finish_reason
        return ({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]},
                "tool_calls" if finish_reason == "stop" else finish_reason)
