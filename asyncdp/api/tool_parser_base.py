"""What every tool-call parser shares (:mod:`asyncdp.api.tool_parsers` has the registry and the overview): the
pieces a parser returns, its incremental interface, and the small text helpers of the formats."""

from __future__ import annotations

import json
from collections.abc import Collection
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

    def __init__(self, tool_names: Collection[str]) -> None:
        self.tool_names = frozenset(tool_names)

    def feed(self, text: str) -> list[Piece]:
        raise NotImplementedError

    def finish(self) -> list[Piece]:
        raise NotImplementedError

    def tool_named(self, parsed: dict[str, Any]) -> str | None:
        """The object's ``name`` when it is one of the request's tools (a model may write any JSON there: a list
        cannot even be looked up), else None."""
        name = parsed.get("name")
        return name if isinstance(name, str) and name in self.tool_names else None


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
