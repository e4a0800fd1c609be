"""Reasoning tokens: ``usage.completion_tokens_details.reasoning_tokens`` (vLLM's ``count_reasoning_tokens``), the
split of :mod:`asyncdp.api.reasoning_parsers` counted in a choice's generated token ids."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from asyncdp.api.reasoning_parser_base import CALL, find_call


class TokenCount(Protocol):
    """One choice's reasoning tokens, as its token ids come: :class:`ReasoningTokens`, or harmony's
    (:class:`asyncdp.api.harmony.HarmonyTokens`)."""

    count: int  # so far

    def feed(self, token_ids: Sequence[int]) -> None: ...

    def finish(self) -> int: ...


class NewTokenCount(Protocol):
    """A new choice's :class:`TokenCount` (:func:`asyncdp.api.reasoning_parsers.token_counter`); ``constrained``:
    of a constrained answer, where any ``<tool_call>`` of a ``calls`` parser ends the thinking, as the grammar
    starts after it (:class:`~asyncdp.api.reasoning_parser_base.ReasoningParser`'s ``constrained``)."""

    def __call__(self, constrained: bool = False) -> TokenCount: ...


class ReasoningTokens:
    """One choice's reasoning tokens, counted from its generated token ids as they come (``feed``), the way
    :class:`ReasoningParser` splits its text: every token before the first end tag (an answer that never
    writes it: every token) but those of the tag itself and of the first start tag before it, the model's own opening;
    with ``opens`` (:attr:`ReasoningParser.opens`), only the tokens after the start tag (none without one); with
    ``plain`` (:attr:`ReasoningParser.plain`: nothing is reasoning), none.
    The tags are found by their ids as the server's tokenizer encodes them alone (:func:`start_token_ids`,
    :func:`end_token_ids`); a tail that could begin one is held until it cannot, and ``finish`` counts it.
    ``bare_call``: any ``call`` ends the thinking, ``<function`` after it or not (a constrained answer's)."""

    def __init__(self, start: Sequence[int], end: Sequence[int], opens: bool = False, call: Sequence[int] = (),
                 decode: Callable[[list[int]], str] | None = None, plain: bool = False,
                 bare_call: bool = False) -> None:
        self._start, self._end, self._call = tuple(start), tuple(end), tuple(call)  # call: qwen3's <tool_call>
        self._decode = decode  # with call: the text of the ids after a <tool_call>, to find <function in
        self._bare_call = bare_call
        self.count = 0
        self._before = opens  # before the start tag, which the thinking needs: no count yet
        self._thinking = not plain  # before the end tag
        self._opened = opens  # the model's own start tag was left out (or is needed first)
        self._held: list[int] = []  # while thinking: a tail that may begin a tag

    def feed(self, token_ids: Sequence[int]) -> None:
        if not self._thinking:
            return
        held = self._held
        held.extend(token_ids)
        if self._before:
            start = find_ids(held, self._start)
            if start < 0:
                del held[:len(held) - partial_ids(held, self._start)]  # (content: not counted)
                return
            del held[:start + len(self._start)]
            self._before = False
        while True:
            end = find_ids(held, self._end)
            call, wait = self._find_call(held)
            start = -1 if self._opened else find_ids(held, self._start)
            if start >= 0 and (end < 0 or start < end) and (call < 0 or start < call):
                self.count += start
                del held[:start + len(self._start)]
                self._opened = True
                continue
            if call >= 0 and (end < 0 or call < end):
                self.count += call
                held.clear()
                self._thinking = False
                return
            if end >= 0:
                self.count += end
                held.clear()
                self._thinking = False
                return
            keep = max(partial_ids(held, self._end), 0 if self._opened else partial_ids(held, self._start), wait)
            self.count += len(held) - keep
            del held[:len(held) - keep]
            return

    def _find_call(self, held: list[int]) -> tuple[int, int]:
        """As :func:`find_call`, in ids: where the first ``<tool_call>`` that ends the thinking is (-1: none), and
        how many ids at the end to hold while it may be one."""
        tag, decode = self._call, self._decode
        if self._bare_call and tag:  # (a constrained answer's: any <tool_call>)
            at = find_ids(held, tag)
            return (at, 0) if at >= 0 else (-1, partial_ids(held, tag))
        if not tag or decode is None:
            return -1, 0
        at = find_ids(held, tag)
        while at >= 0:
            text = CALL + decode(held[at + len(tag):])
            found, wait = find_call(text)
            if found == 0:
                return at, 0
            if wait == len(text):
                return -1, len(held) - at
            nxt = find_ids(held[at + 1:], tag)
            at = -1 if nxt < 0 else at + 1 + nxt
        return -1, partial_ids(held, tag)

    def finish(self) -> int:
        """The count, at the end of the answer: a partial tag that never completed is reasoning (content before
        the start tag that ``opens`` needs)."""
        self.count += 0 if self._before else len(self._held)
        self._held.clear()
        return self.count


def count_reasoning_tokens(token_ids: Sequence[int], start: Sequence[int], end: Sequence[int],
                           opens: bool = False, call: Sequence[int] = (),
                           decode: Callable[[list[int]], str] | None = None, plain: bool = False) -> int:
    """A whole answer's reasoning tokens (:class:`ReasoningTokens` fed in one piece)."""
    counter = ReasoningTokens(start, end, opens, call, decode, plain)
    counter.feed(token_ids)
    return counter.finish()


def find_ids(values: list[int], tag: tuple[int, ...]) -> int:
    """Where ``tag`` first occurs in ``values``, or -1."""
    if not tag:
        return -1
    i = -1
    try:
        while True:
            i = values.index(tag[0], i + 1)
            if tuple(values[i:i + len(tag)]) == tag:
                return i
    except ValueError:
        return -1


def partial_ids(values: list[int], tag: tuple[int, ...]) -> int:
    """The length of the longest end of ``values`` that begins ``tag`` (shorter than the tag)."""
    for k in range(min(len(tag) - 1, len(values)), 0, -1):
        if tuple(values[-k:]) == tag[:k]:
            return k
    return 0
