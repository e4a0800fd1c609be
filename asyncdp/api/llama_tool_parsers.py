"""The Llama tool-call formats: ``llama3_json``, ``pythonic`` and ``llama4_pythonic`` (their rules are in
:mod:`asyncdp.api.tool_parsers`'s doc, with the registry that names them)."""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Collection, Mapping
from typing import Any, ClassVar

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


class Llama3JsonParser(ToolCallParser):
    """``{"name": ..., "parameters": {...}}`` objects at the start of the answer or after ``<|python_tag|>``,
    several separated by ``;`` (see the module doc)."""

    name = "llama3_json"
    TAG = "<|python_tag|>"
    tags = (TAG,)

    def __init__(self, tool_names: Collection[str], parameters: Mapping[str, Any] | None = None) -> None:
        super().__init__(tool_names, parameters)
        self._buf = ""  # text not yet given out
        self._mode = "text"  # "text", "tag" (after TAG, before the object), "object", "after" (an object)
        self._at_start = True  # only whitespace so far: a "{" opens an object without the tag
        self._opener = ""  # what came before the object (the tag, a separator): text again if it is no call
        self._closing = Closing('"')

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Piece]:
        opener = {"tag": self.TAG, "object": self._opener}.get(self._mode, "")  # (a call that never came: text)
        rest = opener + self._buf
        self._buf, self._mode = "", "text"
        return [rest] if rest else []

    def _step(self, out: list[Piece]) -> bool:
        """Move on as far as the held text decides; False when it needs more text."""
        buf = self._buf
        if self._mode == "text":
            if self._at_start:
                body = buf.lstrip()
                if body.startswith("{"):
                    emit_text(out, buf[:len(buf) - len(body)])
                    self._open(body, "")
                    return True
                self._at_start = not body
            at = buf.find(self.TAG)
            if at < 0:
                keep = partial_prefix(buf, self.TAG)
                emit_text(out, buf[:len(buf) - keep])
                self._buf = buf[len(buf) - keep:]
                return False
            emit_text(out, buf[:at])
            self._buf, self._mode, self._at_start = buf[at + len(self.TAG):], "tag", False
            return True
        body = buf.lstrip()
        if self._mode == "tag":
            if not body:
                return False
            if body.startswith("{"):
                self._open(body, self.TAG + buf[:len(buf) - len(body)])
            else:  # the tag introduces no object (Llama's built-in tools write Python after it): all text
                emit_text(out, self.TAG)
                self._mode = "text"
            return True
        if self._mode == "after":
            if body.startswith(";"):
                body = body[1:].lstrip()
            if not body:
                return False
            if body.startswith("{"):
                self._open(body, buf[:len(buf) - len(body)])
            else:  # text after the calls: content, and an object in it is no call
                self._mode = "text"
            return True
        end = self._closing.end(buf)
        if end < 0:
            return False
        obj = buf[:end]
        out.append(self._call(obj) or self._opener + obj)
        self._buf, self._mode = buf[end:], "after"
        return True

    def _open(self, body: str, opener: str) -> None:
        self._buf, self._mode, self._opener, self._at_start = body, "object", opener, False
        self._closing = Closing('"')

    def _call(self, text: str) -> ParsedCall | None:
        """The call an object describes, or None when it is not one (then it stays text)."""
        parsed = json_object(text)
        if parsed is None or (name := self.tool_named(parsed)) is None:
            return None
        keys = [k for k in ("parameters", "arguments") if k in parsed]
        if len(keys) != 1:  # neither (vLLM: no call) or both (which one?)
            return None
        arguments = arguments_json(parsed[keys[0]])
        return None if arguments is None else ParsedCall(name, arguments)


# the start of a pythonic answer that may still be a list of calls: "[", a name, "("
_MAY_BE_CALLS = re.compile(r"\[\s*(?:[^\W\d]\w*\s*)?")
_CALLS = re.compile(r"\[\s*[^\W\d]\w*\s*\(")


class PythonicParser(ToolCallParser):
    """``[f(a=1), g(b="x")]``, a Python list of calls with literal keyword arguments, at the start of the answer
    (see the module doc). A subclass may name tags that wrap the list (``llama4_pythonic``)."""

    name = "pythonic"
    START: ClassVar[str] = ""  # a tag that may open the answer before the list (whitespace around it allowed)
    END: ClassVar[str] = ""  # the tag that closes a list that START opened (whitespace before it allowed)

    def __init__(self, tool_names: Collection[str], parameters: Mapping[str, Any] | None = None) -> None:
        super().__init__(tool_names, parameters)
        self._buf = ""  # text not yet given out
        # "start" (only whitespace, maybe START, so far), "list" (held until its "]"), "end" (after a list START
        # opened: whitespace and END may follow), "text" (the rest)
        self._mode = "start"
        self._opener = ""  # START and the whitespace after it: text again when no list of calls follows
        self._closing = Closing("'\"")

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        if self._mode == "start":
            body = self._buf.lstrip()
            if self.START and not self._opener and body and self.START.startswith(body[:len(self.START)]):
                if len(body) < len(self.START):
                    return out  # (may still be the tag)
                emit_text(out, self._buf[:len(self._buf) - len(body)])
                self._opener, self._buf = self.START, body[len(self.START):]
                body = self._buf.lstrip()
            if not body or _MAY_BE_CALLS.fullmatch(body):
                return out
            if not _CALLS.match(body):
                return out + self._text()
            self._mode = "list"
            lead = self._buf[:len(self._buf) - len(body)]
            if self._opener:
                self._opener += lead
            else:
                emit_text(out, lead)
            self._buf = body
        if self._mode == "list":
            end = self._closing.end(self._buf)
            if end < 0:
                return out
            listed, self._buf = self._buf[:end], self._buf[end:]
            calls = self._calls(listed)
            out += calls or [self._opener + listed]
            self._mode = "end" if calls and self._opener else "text"
            self._opener = ""
        if self._mode == "end":
            body = self._buf.lstrip()
            if len(body) < len(self.END) and self.END.startswith(body):
                return out  # (may still be the closing tag)
            if body.startswith(self.END):
                self._buf = body[len(self.END):]
            self._mode = "text"
        return out + self._text()

    def finish(self) -> list[Piece]:
        return self._text()

    def _text(self) -> list[Piece]:
        rest = self._opener + self._buf
        self._buf, self._opener, self._mode = "", "", "text"
        return [rest] if rest else []

    def _calls(self, text: str) -> list[Piece] | None:
        """The calls a list describes, or None when one item is not a call (then the whole list stays text)."""
        try:
            with warnings.catch_warnings():  # ("\d" in a string: a SyntaxWarning, an error under -W error)
                warnings.simplefilter("ignore")
                tree = ast.parse(text, mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                return None
            calls: list[Piece] = []
            for item in tree.elts:
                if not (isinstance(item, ast.Call) and isinstance(item.func, ast.Name)
                        and item.func.id in self.tool_names and not item.args):
                    return None
                arguments = {}
                for kw in item.keywords:
                    if kw.arg is None:  # **spread
                        return None
                    arguments[kw.arg] = _literal(kw.value)
                calls.append(ParsedCall(item.func.id, json.dumps(arguments, ensure_ascii=False, allow_nan=False)))
            return calls
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # (_literal's refusal is a ValueError)
            return None


_JSON_NAMES = {"true": True, "false": False, "null": None}  # JSON's literals, which models write in Python too


def _literal(node: ast.expr) -> Any:
    """A Python literal's value as JSON takes it (tuples as lists; ``true``, ``false``, ``null`` as vLLM reads
    them); ValueError for anything else (a name, a call, an f-string, a set, bytes), which is no literal."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]  # (None: a **spread)
        if not all(isinstance(k, str) for k in keys):
            raise ValueError("a dict's keys must be strings")
        return {k: _literal(v) for k, v in zip(keys, node.values, strict=True)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):  # -1: a sign and a number
        value = node.operand.value if isinstance(node.operand, ast.Constant) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise ValueError(f"not a literal: {ast.dump(node)}")


class Llama4PythonicParser(PythonicParser):
    """``pythonic`` as Llama 4 writes it: the list may be wrapped in ``<|python_start|>`` and ``<|python_end|>``
    (see the module doc)."""

    name = "llama4_pythonic"
    START, END = "<|python_start|>", "<|python_end|>"
    tags = (START, END)
