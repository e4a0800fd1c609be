"""gpt-oss's parsers (vLLM's ``--reasoning-parser openai_gptoss`` and ``--tool-call-parser openai``): its answers
are harmony messages (:mod:`asyncdp.api.harmony`), read from the text, so that a stream and a whole answer agree
however the text was cut.

``openai_gptoss`` (:class:`HarmonyReasoningParser`): the ``analysis`` channel's bodies are the reasoning; the
``final`` channel's, and those of any other message (the ``commentary`` channel's preambles, which the model
writes for the user before its calls), are the content; a tool call (a message to ``functions.NAME`` on the
``commentary`` or ``analysis`` channel) goes to the content whole, as written (header, body and terminator), for
the tool-call parser; loose text (what is not a message: a header that is none, text between messages, a header
the answer ends in) is content. The bodies of several messages are joined as they come, nothing between them.

``openai`` (:class:`HarmonyToolParser`): in the text it is given (the content, after ``openai_gptoss``; the whole
answer without it), a message to ``functions.NAME`` whose NAME is one of the request's tools and whose body is a
JSON object is a call, its arguments the body as written (surrounding whitespace dropped). Anything else (loose
text, other messages, a call that is none) stays text, verbatim. A header is held back until its
``<|message|>``, a call's body until its message ends (``<|call|>`` or another terminator, or the answer's end,
since ``<|call|>`` stops the generation and is not in the text).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from asyncdp.api.harmony import TAGS, Event, Header, Splitter
from asyncdp.api.reasoning_parser_base import ReasoningParser
from asyncdp.api.tool_parser_base import ParsedCall, Piece, ToolCallParser, emit_text, json_object

FINAL_HEADER = "<|channel|>final<|message|>"  # the final answer's header, whose ids start a constraint's grammar
# The final answer's header with or without a content type (``<|channel|>final <|constrain|>json<|message|>``), which
# starts a constraint's grammar too: its opening, its closing, the most ids between them, and what between them
# cancels it. vLLM's gpt-oss reasoning parser ends the reasoning at a ``<|channel|>final`` that ``<|message|>``
# follows with no ``<|end|>`` between, searching the 20 ids after it (``reasoning_max_num_between_tokens``): at
# most 19 between.
FINAL_HEADERS = ("<|channel|>final", "<|message|>", 19, "<|end|>")


class HarmonyReasoningParser(ReasoningParser):
    """gpt-oss (``openai_gptoss``): the ``analysis`` channel is the reasoning, the rest the content (see the
    module). Always thinking (harmony has no switch to turn it off); a constraint starts after the final answer's
    header: ``<|channel|>final<|message|>`` (``ends``), or one with a content type between (``end_header``), never
    another channel's."""

    name = "openai_gptoss"
    starts = ()
    ends = (FINAL_HEADER,)
    end_header = FINAL_HEADERS
    tags = TAGS

    def __init__(self, *, constrained: bool = False) -> None:
        super().__init__(constrained=constrained)
        self._splitter = Splitter()
        self._header: Header | None = None  # the open message's

    def feed(self, text: str) -> tuple[str, str]:
        return self._read(self._splitter.feed(text))

    def finish(self) -> tuple[str, str]:
        return self._read(self._splitter.finish())

    def _read(self, events: list[Event]) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        for event in events:
            if event.kind == "open":
                self._header = event.header
            header = self._header
            if event.kind == "text" or (header is not None and header.function is not None):
                content.append(event.text)  # (loose text, and a call as written)
            elif event.kind == "body" and header is not None:
                (reasoning if header.thinking else content).append(event.text)
            if event.kind == "close":
                self._header = None
        return "".join(reasoning), "".join(content)


class HarmonyToolParser(ToolCallParser):
    """gpt-oss's tool calls (``openai``): the messages to ``functions.NAME`` (see the module)."""

    name = "openai"
    tags = TAGS

    def __init__(self, tool_names: Collection[str], parameters: Mapping[str, Any] | None = None) -> None:
        super().__init__(tool_names, parameters)
        self._splitter = Splitter()
        self._call: list[str] | None = None  # the open call's text: its header, then its body's pieces
        self._function = ""  # its function

    def feed(self, text: str) -> list[Piece]:
        return self._read(self._splitter.feed(text))

    def finish(self) -> list[Piece]:
        return self._read(self._splitter.finish())

    def _read(self, events: list[Event]) -> list[Piece]:
        out: list[Piece] = []
        for event in events:
            if event.kind == "open":
                function = event.header.function if event.header is not None else None
                if function is not None and function in self.tool_names:
                    self._call, self._function = [event.text], function
                    continue
            if self._call is None:
                emit_text(out, event.text)
            elif event.kind == "body":
                self._call.append(event.text)
            elif event.kind == "close":
                body = "".join(self._call[1:])
                if json_object(body) is not None:
                    out.append(ParsedCall(self._function, body.strip()))
                else:
                    emit_text(out, "".join(self._call) + event.text)
                self._call = None
        return out
