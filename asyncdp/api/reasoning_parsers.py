"""Reasoning parsers: how a reasoning model's thinking is told apart from its answer (vLLM's
``--reasoning-parser NAME``), for chat completions only.

Qwen3, QwQ, DeepSeek-R1 and its distills think between ``<think>`` and ``</think>`` before they answer. Their
chat templates open the block in the prompt (DeepSeek-R1's, Qwen3.5's) or leave the model to write ``<think>``
itself (Qwen3 up to the 2507 releases), so the output is read the way vLLM reads it today, both ways at once:

- everything before the first ``</think>`` is reasoning, everything after it is the answer's content;
- the first ``<think>`` before it, the model's own opening tag, is dropped (a later one stays, as text);
- an answer that never writes ``</think>`` (cut by ``max_tokens``, or a model that only thought) is all reasoning.

``qwen3`` and ``deepseek_r1`` differ in one thing: with ``chat_template_kwargs: {"enable_thinking": false}``
Qwen3's template closes an empty think block in the prompt, so the model's output is all content and ``qwen3``
does not parse it (as vLLM, which sees from the prompt that the reasoning has ended). ``deepseek_r1`` has no such
switch. vLLM's ``<tool_call>`` as an implicit end of reasoning (Qwen3.5's XML tool calls) is not built.

A constraint (structured outputs, a named or ``"required"`` tool choice) applies only after the thinking, as in
vLLM: the API passes :func:`end_token_ids` as the grammar's ``start_after``, and the engine starts the grammar
at the token after the first ``</think>`` it generates; the parsers then find the constrained text as content.

A parser is sans-IO and incremental, as :mod:`asyncdp.api.tool_parsers`' are: :meth:`ReasoningParser.feed`
takes the next piece of generated text and returns the reasoning and the content known by now; a tail that could
begin a tag is held back until it cannot, and :meth:`ReasoningParser.finish` returns it at the end. A whole
answer is the same parse fed in one piece, so a streamed answer and a whole one agree however the text was cut.

:class:`ReasoningTokens` counts the same split in token ids, for ``usage.completion_tokens_details.reasoning_tokens``
(vLLM's ``count_reasoning_tokens``): the tokens of what the parser makes reasoning, the tags' own tokens left out.

``PARSERS`` is the registry, name -> class, that ``--reasoning-parser`` chooses from (its names are also
:data:`asyncdp.config.choices.REASONING_PARSERS`, which a test keeps equal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from asyncdp.api.tool_parser_base import partial_prefix

START, END = "<think>", "</think>"


class ReasoningParser:
    """One choice's incremental split of its text into reasoning and content (a new one per choice)."""

    name: ClassVar[str]
    # Tokens the format needs in the text: kept by detokenizing with skip_special_tokens false when the tokenizer
    # marks one special (asyncdp.api.tool_parser_base.tags_are_special), or they would be missing from the text.
    tags: ClassVar[tuple[str, ...]] = (START, END)

    def __init__(self) -> None:
        self._thinking = True  # before END
        self._opened = False  # the model's own START was dropped
        self._buf = ""  # while thinking: a tail that may begin a tag

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        """Whether a request with these ``chat_template_kwargs`` lets the model think (else: no parse at all)."""
        return True

    def feed(self, text: str) -> tuple[str, str]:
        """The reasoning and the content that ``text`` adds (either may be empty)."""
        if not self._thinking:
            return "", text
        self._buf += text
        reasoning = []
        while True:
            end = self._buf.find(END)
            start = -1 if self._opened else self._buf.find(START)
            if start >= 0 and (end < 0 or start < end):
                reasoning.append(self._buf[:start])
                self._buf, self._opened = self._buf[start + len(START):], True
                continue
            if end >= 0:
                reasoning.append(self._buf[:end])
                content, self._buf, self._thinking = self._buf[end + len(END):], "", False
                return "".join(reasoning), content
            keep = max(partial_prefix(self._buf, END), 0 if self._opened else partial_prefix(self._buf, START))
            reasoning.append(self._buf[:len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return "".join(reasoning), ""

    def finish(self) -> tuple[str, str]:
        """What was held back, at the end of the answer: a partial tag that never completed is reasoning."""
        rest, self._buf = self._buf, ""
        return rest, ""

    def read(self, text: str, finished: bool) -> tuple[str, str]:
        """``feed`` then, when ``finished``, ``finish``: the reasoning and the content to send for ``text``."""
        reasoning, content = self.feed(text) if text else ("", "")
        if finished:
            more, rest = self.finish()
            reasoning, content = reasoning + more, content + rest
        return reasoning, content


class DeepSeekR1Parser(ReasoningParser):
    """DeepSeek-R1 and its distills, QwQ: the template opens ``<think>`` in the prompt; always thinking."""

    name = "deepseek_r1"


class Qwen3Parser(ReasoningParser):
    """Qwen3 (and 3.5): as ``deepseek_r1``, unless the request turns thinking off with
    ``chat_template_kwargs: {"enable_thinking": false}``, when the output is all content."""

    name = "qwen3"

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return template_kwargs.get("enable_thinking", True) is not False


PARSERS: dict[str, type[ReasoningParser]] = {p.name: p for p in (DeepSeekR1Parser, Qwen3Parser)}


class ReasoningTokens:
    """One choice's reasoning tokens, counted from its generated token ids as they come (``feed``), the way
    :class:`ReasoningParser` splits its text: every token before the first ``</think>`` (an answer that never
    writes it: every token) but those of the tag itself and of the first ``<think>`` before it, the model's own opening.
    The tags are found by their ids as the server's tokenizer encodes them alone (:func:`start_token_ids`,
    :func:`end_token_ids`); a tail that could begin one is held until it cannot, and ``finish`` counts it."""

    def __init__(self, start: Sequence[int], end: Sequence[int]) -> None:
        self._start, self._end = tuple(start), tuple(end)
        self.count = 0
        self._thinking = True  # before the end tag
        self._opened = False  # the model's own start tag was left out
        self._held: list[int] = []  # while thinking: a tail that may begin a tag

    def feed(self, token_ids: Sequence[int]) -> None:
        if not self._thinking:
            return
        held = self._held
        held.extend(token_ids)
        while True:
            end = _find(held, self._end)
            start = -1 if self._opened else _find(held, self._start)
            if start >= 0 and (end < 0 or start < end):
                self.count += start
                del held[:start + len(self._start)]
                self._opened = True
                continue
            if end >= 0:
                self.count += end
                held.clear()
                self._thinking = False
                return
            keep = max(_partial(held, self._end), 0 if self._opened else _partial(held, self._start))
            self.count += len(held) - keep
            del held[:len(held) - keep]
            return

    def finish(self) -> int:
        """The count, at the end of the answer: a partial tag that never completed is reasoning."""
        self.count += len(self._held)
        self._held.clear()
        return self.count


def count_reasoning_tokens(token_ids: Sequence[int], start: Sequence[int], end: Sequence[int]) -> int:
    """A whole answer's reasoning tokens (:class:`ReasoningTokens` fed in one piece)."""
    counter = ReasoningTokens(start, end)
    counter.feed(token_ids)
    return counter.finish()


def _find(values: list[int], tag: tuple[int, ...]) -> int:
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


def _partial(values: list[int], tag: tuple[int, ...]) -> int:
    """The length of the longest end of ``values`` that begins ``tag`` (shorter than the tag)."""
    for k in range(min(len(tag) - 1, len(values)), 0, -1):
        if tuple(values[-k:]) == tag[:k]:
            return k
    return 0


def start_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """``<think>`` as the server's tokenizer encodes it on its own, no special tokens added."""
    return tuple(tokenizer.encode(START, add_special_tokens=False))


def end_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """``</think>`` as the server's tokenizer encodes it on its own, no special tokens added: one added token in
    Qwen3's and DeepSeek-R1's, several elsewhere. A constraint on an answer that may think starts after these ids
    (``StructuredOutputs.start_after``); a model that spells the tag with other tokens leaves its answer free."""
    return tuple(tokenizer.encode(END, add_special_tokens=False))


def split(parser: ReasoningParser, text: str) -> tuple[str | None, str]:
    """A whole answer's reasoning (None when there is none, as a stream that sent none) and content."""
    reasoning, content = parser.read(text, finished=True)
    return reasoning or None, content
