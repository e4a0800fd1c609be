"""Feeding a parser an answer whole and cut into pieces (tests of :mod:`asyncdp.api.tool_parsers` and
:mod:`asyncdp.api.reasoning_parsers`): a streamed answer must parse as the whole one does, however the text was cut."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncdp.api.reasoning_parsers import ReasoningParser
from asyncdp.api.tool_parsers import AutoToolCalls, ParsedCall


def feed_pieces(auto: AutoToolCalls, pieces: list[str]) -> tuple[str, list[ParsedCall]]:
    """The content and calls ``auto`` gives for ``pieces``, the last one finishing the answer."""
    content, calls = "", []
    for i, piece in enumerate(pieces):
        more, found = auto.feed(piece, finished=i == len(pieces) - 1)
        content += more
        calls += found
    return content, calls


def assert_every_split_agrees(make: Callable[[], AutoToolCalls], text: str) -> None:
    """``text`` fed character by character, cut once at every point, and cut twice on a grid (with an empty last
    piece) gives what it gives whole."""
    expected = make().feed(text, finished=True)
    assert feed_pieces(make(), list(text)) == expected, "character by character"
    for cut in range(len(text) + 1):
        assert feed_pieces(make(), [text[:cut], text[cut:]]) == expected, cut
    for a in range(0, len(text), 3):
        for b in range(a, len(text), 5):
            assert feed_pieces(make(), [text[:a], text[a:b], text[b:], ""]) == expected, (a, b)


def whole(parser: ReasoningParser, text: str) -> tuple[str, str]:
    """A reasoning parser's ``(reasoning, content)`` of a whole answer."""
    return parser.read(text, finished=True)


def fed(parser: ReasoningParser, pieces: list[str]) -> tuple[str, str]:
    """The same, fed ``pieces``, the last one finishing the answer."""
    reasoning, content = "", ""
    for i, piece in enumerate(pieces):
        more, rest = parser.read(piece, finished=i == len(pieces) - 1)
        reasoning, content = reasoning + more, content + rest
    return reasoning, content


def assert_read_alike_at_every_cut(make: Callable[[], ReasoningParser], text: str, expected: tuple[str, str],
                                   step: int = 5) -> None:
    """A reasoning parser from ``make`` reads ``text`` as ``expected`` (``(reasoning, content)``) whole, character
    by character, cut once at every point, and cut twice on a grid of 3 by ``step`` (with an empty last piece)."""
    assert whole(make(), text) == expected
    assert fed(make(), list(text)) == expected, "character by character"
    for cut in range(len(text) + 1):
        assert fed(make(), [text[:cut], text[cut:]]) == expected, cut
    for a in range(0, len(text), 3):
        for b in range(a, len(text), step):
            assert fed(make(), [text[:a], text[a:b], text[b:], ""]) == expected, (a, b)

def assert_counts_at_every_cut(make: Callable[[], Any], ids: list[int], expected: int) -> None:
    """A reasoning-token counter from ``make`` fed ``ids`` in two pieces, cut anywhere (and an empty piece), counts
    ``expected`` in the end, and never more before it (a tail that may be a tag waits)."""
    for cut in range(len(ids) + 1):
        counter = make()
        counter.feed(ids[:cut])
        assert counter.count <= expected
        counter.feed(ids[cut:])
        counter.feed([])
        assert counter.finish() == expected, cut
