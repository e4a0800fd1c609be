"""Tool-call parsers: how ``tool_choice: "auto"`` finds tool calls in a model's free text (vLLM's
``--enable-auto-tool-choice --tool-call-parser NAME``).

A parser is sans-IO and incremental: :meth:`ToolCallParser.feed` takes the next piece of generated text and
returns what is known by now, in order: text (``str``) and complete calls (:class:`ParsedCall`);
:meth:`ToolCallParser.finish` returns the rest at the end. The whole answer is parsed by feeding it in one
piece, so a streamed answer and a whole one are the same parse, however the text was cut into deltas.
:class:`AutoToolCalls` turns those pieces into what the client sees (content and calls, see its doc).

``PARSERS`` is the registry, name -> class, that ``--tool-call-parser`` chooses from (its names are also
:data:`asyncdp.config.flags.TOOL_CALL_PARSERS`, which a test keeps equal). Only ``hermes`` exists; a
``llama3_json`` or ``pythonic`` parser would be one more class here.

``hermes`` (Hermes 2 Pro, Qwen 2.5 and 3, and the other models whose chat templates ask for it): each call is a
block ``<tool_call>{"name": F, "arguments": {...}}</tool_call>`` (whitespace around the JSON allowed), several
blocks for several calls. A block is a call when its JSON is an object whose ``name`` is one of the request's
tools and whose ``arguments`` is an object, a string holding a JSON object (passed on as written), or absent
(``"{}"``). Any other block (malformed JSON, an unknown name, other arguments) stays in the text verbatim, tags
included, so nothing the model wrote is lost. A last block whose closing tag never came (the model stopped, or
``max_tokens`` cut it) is a call when its JSON is complete, as vLLM's pattern accepts it, and text otherwise.
Outside a block, a tail that could begin ``<tool_call>`` is held back until it cannot (as the stop-string
hold-back does); inside one, everything is held until the block closes.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from asyncdp.api.reasoning_parsers import ReasoningParser


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One tool call found in the text: the function's name and its arguments as a JSON string."""

    name: str
    arguments: str


Piece = str | ParsedCall


class ToolCallParser:
    """One choice's incremental parser (a new one per choice): ``feed`` the text as it comes, then ``finish``."""

    name: ClassVar[str]
    # Tokens the format needs in the text: when the tokenizer marks one special, the answer is detokenized with
    # skip_special_tokens false (unless the request sets it), or they would be missing from the text.
    tags: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tool_names: Collection[str]) -> None:
        self.tool_names = frozenset(tool_names)

    def feed(self, text: str) -> list[Piece]:
        raise NotImplementedError

    def finish(self) -> list[Piece]:
        raise NotImplementedError


def partial_prefix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper prefix of ``tag`` (what to hold back)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class HermesParser(ToolCallParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (see the module doc)."""

    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"
    tags = (START, END)

    def __init__(self, tool_names: Collection[str]) -> None:
        super().__init__(tool_names)
        self._buf = ""  # outside a block: a tail that may begin START; inside: the block's text after START
        self._in_block = False
        self._searched = 0  # inside a block: END does not begin before this offset of _buf

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while True:
            if not self._in_block:
                at = self._buf.find(self.START)
                if at < 0:
                    keep = partial_prefix(self._buf, self.START)
                    self._emit_text(out, self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return out
                self._emit_text(out, self._buf[:at])
                self._buf = self._buf[at + len(self.START):]
                self._in_block, self._searched = True, 0
            end = self._buf.find(self.END, self._searched)
            if end < 0:
                self._searched = max(0, len(self._buf) - len(self.END) + 1)
                return out
            body = self._buf[:end]
            self._buf = self._buf[end + len(self.END):]
            self._in_block = False
            out.append(self._call(body) or f"{self.START}{body}{self.END}")

    def finish(self) -> list[Piece]:
        rest, self._buf = self._buf, ""
        if not self._in_block:
            return [rest] if rest else []
        self._in_block = False
        return [self._call(rest) or f"{self.START}{rest}"]

    @staticmethod
    def _emit_text(out: list[Piece], text: str) -> None:
        if text:
            out.append(text)

    def _call(self, body: str) -> ParsedCall | None:
        """The call a block's JSON describes, or None when it is not one (then the block stays text)."""
        try:
            parsed = json.loads(body)
        except ValueError:
            return None
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
            return None
        if parsed["name"] not in self.tool_names:
            return None
        arguments = _arguments(parsed.get("arguments", {}))
        return None if arguments is None else ParsedCall(parsed["name"], arguments)


def _arguments(value: Any) -> str | None:
    """``arguments`` as the JSON string of an object: an object is dumped (non-ASCII kept, as vLLM does); a string
    that holds a JSON object is taken as written (vLLM would dump it again, into a JSON string of a string)."""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, str):
        try:
            return value if isinstance(json.loads(value), dict) else None
        except ValueError:
            return None
    return None


PARSERS: dict[str, type[ToolCallParser]] = {HermesParser.name: HermesParser}


def tags_are_special(parser: type[ToolCallParser] | type[ReasoningParser], tokenizer: Any) -> bool:
    """Whether ``tokenizer`` marks one of the parser's tags as a special token, which detokenizing with
    skip_special_tokens would drop (Qwen's ``<tool_call>`` and ``<think>`` are added tokens that are not special:
    kept). Tool-call and reasoning parsers alike."""
    special = set(getattr(tokenizer, "all_special_tokens", None) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special |= {str(t) for t in decoder.values() if getattr(t, "special", False)}
    return any(tag in special for tag in parser.tags)


class AutoToolCalls:
    """One choice's answer under ``tool_choice: "auto"``: the content and the calls to send for each piece of
    text. Whole answers and streams both go through it (a whole answer is one piece, finished).

    The content is the text outside the call blocks. Whitespace is held back until text follows it; at the end
    it is sent when the answer has no calls (so an answer without calls is its text, unchanged) and dropped when
    it has some (so the content of an answer with calls has no trailing whitespace, and the separators around
    its blocks alone make no content: ``null``, as vLLM answers).
    """

    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser
        self._held = ""  # whitespace not sent yet
        self.num_calls = 0

    def feed(self, text: str, finished: bool) -> tuple[str, list[ParsedCall]]:
        """The content and the calls that ``text`` (maybe empty) completes; ``finished``: it ends the answer."""
        pieces = self._parser.feed(text) if text else []
        if finished:
            pieces += self._parser.finish()
        content: list[str] = []
        calls: list[ParsedCall] = []
        for piece in pieces:
            if isinstance(piece, ParsedCall):
                calls.append(piece)
                continue
            joined = self._held + piece
            sent = joined.rstrip()
            self._held = joined[len(sent):]
            content.append(sent)
        self.num_calls += len(calls)
        if finished:
            if not self.num_calls:
                content.append(self._held)
            self._held = ""
        return "".join(content), calls
