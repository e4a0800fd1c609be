"""What every tool-call parser shares (:mod:`asyncdp.api.tool_parsers` has the registry and the overview): the
pieces a parser returns, its incremental interface, and the small text helpers of the formats."""

from __future__ import annotations

import json
import re
import uuid
from bisect import bisect_left
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar


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

    def __init__(self, tool_names: Collection[str], parameters: Mapping[str, Any] | None = None) -> None:
        self.tool_names = frozenset(tool_names)
        # each tool's ``parameters`` JSON schema (absent or None: it has none), for formats whose arguments are
        # not JSON and take their types from it (qwen3_coder)
        self.parameters: Mapping[str, Any] = parameters or {}

    @classmethod
    def call_id(cls) -> str:
        """A new tool call's ``id`` (vLLM's, ``chatcmpl-tool-`` and 32 hex digits; a format may need its own)."""
        return f"chatcmpl-tool-{uuid.uuid4().hex}"

    def feed(self, text: str) -> list[Piece]:
        raise NotImplementedError

    def finish(self) -> list[Piece]:
        raise NotImplementedError

    def tool_named(self, parsed: dict[str, Any]) -> str | None:
        """The object's ``name`` when it is one of the request's tools (a model may write any JSON there: a list
        cannot even be looked up), else None."""
        name = parsed.get("name")
        return name if isinstance(name, str) and name in self.tool_names else None


class TaggedBlockParser(ToolCallParser):
    """Calls in blocks between tags (hermes, qwen3_coder): ``START`` opens a block that ``END`` closes, and
    :meth:`blocks` may name more openers, each with its closer. A block whose body ``_call`` makes a call is one,
    any other stays text verbatim, tags included. Outside a block, a tail that could begin an opener is held back
    until it cannot; inside one, everything is held until its closer. A last ``START`` block that never closed is
    a call when ``_call`` takes its body as it is, and text otherwise (as is another opener's). After a call, its
    opener's :meth:`trailer` (a closer the model may write again, whitespace before it allowed) is dropped."""

    START: ClassVar[str]
    END: ClassVar[str]

    def __init__(self, tool_names: Collection[str], parameters: Mapping[str, Any] | None = None) -> None:
        super().__init__(tool_names, parameters)
        self._closers = self.blocks()
        self._openers = sorted(self._closers)
        self._opener_at = re.compile("|".join(map(re.escape, self._openers)))
        self._may_open = re.compile(f"[{re.escape(''.join({o[0] for o in self._openers}))}]")
        self._longest = max(map(len, self._openers))
        self._buf = ""  # outside a block: a tail that may begin an opener; inside: the block's text after it
        self._opener = ""  # the open block's opener, "" outside a block
        self._searched = 0  # inside a block: its closer does not begin before this offset of _buf
        self._trailer = ""  # after a call: its opener's trailer, dropped when it comes next

    def blocks(self) -> dict[str, str]:
        """Each tag that opens a block, with the tag that closes it; no opener may begin another."""
        return {self.START: self.END}

    def trailer(self, opener: str) -> str:
        """What a call opened by ``opener`` may be followed by and is dropped ("" for nothing)."""
        return ""

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while True:
            if not self._opener:
                if self._trailer and not self._drop_trailer(out):
                    return out
                found = self._opener_at.search(self._buf)
                if found is None:
                    keep = self._held()
                    emit_text(out, self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return out
                emit_text(out, self._buf[:found.start()])
                self._buf = self._buf[found.end():]
                self._opener, self._searched = found.group(), 0
            closer = self._closers[self._opener]
            end = self._buf.find(closer, self._searched)
            if end < 0:
                self._searched = max(0, len(self._buf) - len(closer) + 1)
                return out
            body = self._buf[:end]
            self._buf = self._buf[end + len(closer):]
            opener, self._opener = self._opener, ""
            call = self._call(body, opener)
            if call is None:
                out.append(f"{opener}{body}{closer}")
            else:
                out.append(call)
                self._trailer = self.trailer(opener)

    def finish(self) -> list[Piece]:
        rest, self._buf, self._trailer = self._buf, "", ""
        if not self._opener:
            return [rest] if rest else []
        opener, self._opener = self._opener, ""
        call = self._call(rest, opener) if opener == self.START else None
        return [call or f"{opener}{rest}"]

    def _held(self) -> int:
        """The length of the longest tail of the text that begins an opener (what to hold back): the openers
        beginning with a tail are a run of the sorted ones, found by bisection, as a parser may have many."""
        for may in self._may_open.finditer(self._buf, max(0, len(self._buf) - self._longest + 1)):
            tail = self._buf[may.start():]
            at = bisect_left(self._openers, tail)
            if at < len(self._openers) and self._openers[at].startswith(tail):
                return len(tail)
        return 0

    def _drop_trailer(self, out: list[Piece]) -> bool:
        """After a call: the whitespace that follows it is text, then the trailer, when it comes, is dropped.
        False while the text may still be the trailer (it is held)."""
        rest = self._buf.lstrip()
        emit_text(out, self._buf[:len(self._buf) - len(rest)])
        self._buf = rest
        if rest.startswith(self._trailer):
            self._buf = rest[len(self._trailer):]
        elif not rest or self._trailer.startswith(rest):
            return False
        self._trailer = ""
        return True

    def _call(self, body: str, opener: str) -> ParsedCall | None:
        """The call a block's body describes (the block was opened by ``opener``), or None when it is not one
        (then the block stays text)."""
        raise NotImplementedError


class Closing:
    """Where a bracketed text that opens at offset 0 closes: the end of its first bracket's match, brackets inside
    strings (delimited by one of ``quotes``, with backslash escapes) not counted. Scans each character once as the
    text grows. It only finds the end; whether the text between is valid is the caller's parser's to say."""

    def __init__(self, quotes: str) -> None:
        self._quotes = quotes
        self._scanned = 0
        self._depth = 0
        self._quote = ""  # the open string's quote
        self._escaped = False

    def end(self, text: str) -> int:
        """The offset just past the closing bracket, or -1 while it has not come."""
        for i in range(self._scanned, len(text)):
            c = text[i]
            if self._quote:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == self._quote:
                    self._quote = ""
            elif c in self._quotes:
                self._quote = c
            elif c in "([{":
                self._depth += 1
            elif c in ")]}":
                self._depth -= 1
                if self._depth == 0:
                    self._scanned = i + 1
                    return i + 1
        self._scanned = len(text)
        return -1


def partial_prefix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper prefix of ``tag`` (what to hold back)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def emit_text(out: list[Piece], text: str) -> None:
    """Append ``text`` to the pieces unless it is empty."""
    if text:
        out.append(text)


def json_object(text: str) -> dict[str, Any] | None:
    """``text`` as a JSON object, or None when it is not one (malformed, another type, or nested past Python's
    recursion limit, which a model can write: no call then, never a RecursionError's 500)."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def arguments_json(value: Any) -> str | None:
    """``arguments`` as the JSON string of an object: an object is dumped (non-ASCII kept, as vLLM does); a string
    that holds a JSON object is taken as written (vLLM would dump it again, into a JSON string of a string)."""
    if isinstance(value, dict):
        try:
            return json.dumps(value, ensure_ascii=False)
        except (ValueError, RecursionError):
            return None
    if isinstance(value, str):
        return value if json_object(value) is not None else None
    return None


def tags_are_special(parser: Any, tokenizer: Any) -> bool:
    """Whether ``tokenizer`` marks one of the parser's tags as a special token, which detokenizing with
    skip_special_tokens would drop (Qwen's ``<tool_call>`` and ``<think>`` are added tokens that are not special:
    kept). ``parser``: a tool-call or reasoning parser class, by its ``tags``."""
    special = set(getattr(tokenizer, "all_special_tokens", None) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special |= {str(t) for t in decoder.values() if getattr(t, "special", False)}
    return any(tag in special for tag in parser.tags)
