"""The ``mistral`` tool-call format (its rules are in :mod:`asyncdp.api.tool_parsers`' doc, with the registry
that names it): ``[TOOL_CALLS]`` and a JSON array of calls (tokenizers before v11), or ``[TOOL_CALLS]`` before
each call's name and its JSON arguments (v11 and later)."""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Collection, Mapping
from typing import Any

from asyncdp.api.tool_parser_base import (
    Closing,
    ParsedCall,
    Piece,
    ToolCallParser,
    arguments_json,
    emit_text,
    json_object,
    partial_prefix,
)

_ALPHANUMERIC = string.ascii_letters + string.digits


class MistralParser(ToolCallParser):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` or ``[TOOL_CALLS]name[ARGS]{...}`` repeated (see
    the module doc)."""

    name = "mistral"
    TOKEN, ARGS = "[TOOL_CALLS]", "[ARGS]"
    tags = (TOKEN, ARGS)

    def __init__(self, tool_names: Collection[str], parameters: Mapping[str, Any] | None = None) -> None:
        super().__init__(tool_names, parameters)
        self._buf = ""  # text not yet given out
        # "text"; "token" (after TOKEN, before what follows it); "array" and "args" (a JSON text held until it
        # closes); "name" (a call's name, held until its arguments open)
        self._mode = "text"
        self._opener = ""  # TOKEN and what followed it up to the held JSON: text again if it is no call
        self._name = ""
        self._closing = Closing('"')

    @classmethod
    def call_id(cls) -> str:
        """Nine letters and digits: Mistral's tokenizers refuse other ids in the calls sent back (as vLLM's)."""
        return "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Piece]:
        rest = self._opener + self._buf  # (a call that never came whole: text)
        self._buf, self._opener, self._mode = "", "", "text"
        return [rest] if rest else []

    def _step(self, out: list[Piece]) -> bool:
        """Move on as far as the held text decides; False when it needs more text."""
        buf = self._buf
        if self._mode == "text":
            at = buf.find(self.TOKEN)
            if at < 0:
                keep = partial_prefix(buf, self.TOKEN)
                emit_text(out, buf[:len(buf) - keep])
                self._buf = buf[len(buf) - keep:]
                return False
            emit_text(out, buf[:at])
            self._buf, self._opener, self._mode = buf[at + len(self.TOKEN):], self.TOKEN, "token"
            return True
        if self._mode == "token":
            body = buf.lstrip()
            if not body:
                return False
            self._opener += buf[:len(buf) - len(body)]
            self._buf, self._mode = body, "array" if body.startswith("[") else "name"
            self._closing = Closing('"')
            return True
        if self._mode == "name":
            found = self._named(buf)
            if found is None:
                return False if self._may_be_named(buf) else self._no_call(out)
            self._name, at = found
            self._opener += buf[:at]
            self._buf, self._mode = buf[at:], "args"
            return True
        end = self._closing.end(buf)
        if end < 0:
            return False
        held = buf[:end]
        calls = self._array(held) if self._mode == "array" else self._arguments(held)
        if not calls:
            return self._no_call(out)
        out.extend(calls)
        self._buf, self._opener, self._mode = buf[end:], "", "text"
        return True

    def _no_call(self, out: list[Piece]) -> bool:
        """What followed TOKEN is no call: TOKEN is text, and the rest is read again as text (it may hold the
        next TOKEN)."""
        emit_text(out, self.TOKEN)
        self._buf = self._opener[len(self.TOKEN):] + self._buf
        self._opener, self._mode = "", "text"
        return True

    def _heads(self) -> list[tuple[str, str]]:
        return [(n, f"{n}{between}{{") for n in self.tool_names for between in (self.ARGS, "")]

    def _named(self, text: str) -> tuple[str, int] | None:
        """A tool's name and the offset of its arguments' ``{`` when ``text`` begins with ``NAME{`` or
        ``NAME[ARGS]{``, else None."""
        for name, head in self._heads():
            if text.startswith(head):
                return name, len(head) - 1
        return None

    def _may_be_named(self, text: str) -> bool:
        """Whether more text may still make ``text`` begin with a tool's ``NAME{`` or ``NAME[ARGS]{``."""
        return any(head.startswith(text) for _, head in self._heads())

    def _arguments(self, text: str) -> list[ParsedCall]:
        """The call whose name came before these arguments, when they are a JSON object (passed on as written)."""
        return [ParsedCall(self._name, text)] if json_object(text) is not None else []

    def _array(self, text: str) -> list[ParsedCall]:
        """The calls of an array of ``{"name", "arguments"}`` objects; none unless every item is a call."""
        try:
            items = json.loads(text)
        except (ValueError, RecursionError):
            return []
        calls: list[ParsedCall] = []
        for item in items if isinstance(items, list) else ():
            name = self.tool_named(item) if isinstance(item, dict) else None
            arguments = None if name is None else arguments_json(item.get("arguments", {}))
            if name is None or arguments is None:
                return []
            calls.append(ParsedCall(name, arguments))
        return calls
