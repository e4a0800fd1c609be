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
switch. Qwen3.5 and Qwen3-Coder may call a tool while thinking, without ``</think>``: ``qwen3`` ends the reasoning
at the first ``<tool_call>`` that whitespace and ``<function=`` (or ``<function `` ) follow, as vLLM, whether or not
the request has tools; the call, ``<tool_call>`` included, is content, for the tool-call parser (``qwen3_coder``). A
``<tool_call>`` followed by anything else (Hermes' JSON ``{...}``, as vLLM) stays reasoning, and so does one the
answer ends before deciding. The earlier of the two ends counts; after it, a ``</think>`` is content.

Other models' parsers, vLLM's of the same names, are the same machine with other tags and switches (a table of
class attributes, :class:`ReasoningParser`): ``minimax_m2`` and ``seed_oss`` (``<seed:think>``) read as
``deepseek_r1``, ``step3`` knows no opening tag, ``kimi_k2`` has the ``thinking`` switch and drops the model's
``(no content)`` placeholder from the content; ``glm45``, ``mistral`` (``[THINK]``) and ``granite`` (its phrases,
which must begin the answer) need the opening tag (``opens``): text before it is content, an answer without it all
content. Where vLLM's whole and streamed readings of one answer differ, these follow its stream (an opened block
never closed is reasoning), so that a stream and a whole answer agree; vLLM's ``hunyuan_a13b`` (one tokenizer's
fixed ids) and ``ernie45`` (a ``<response>`` wrapper) are not built.

A constraint (structured outputs, a named or ``"required"`` tool choice) applies only after the thinking, as in
vLLM: the API passes :func:`end_token_ids` as the grammar's ``start_after``, and the engine starts the grammar
at the token after the first ``</think>`` it generates; the parsers then find the constrained text as content.
A constrained answer whose thinking ends with a tool call is a limitation: the grammar still waits for ``</think>``
(vLLM would start it inside the call), so the call is unconstrained content, and a later ``</think>`` too.

A parser is sans-IO and incremental, as :mod:`asyncdp.api.tool_parsers`' are: :meth:`ReasoningParser.feed`
takes the next piece of generated text and returns the reasoning and the content known by now; a tail that could
begin a tag is held back until it cannot, and :meth:`ReasoningParser.finish` returns it at the end. A whole
answer is the same parse fed in one piece, so a streamed answer and a whole one agree however the text was cut.

:class:`~asyncdp.api.reasoning_tokens.ReasoningTokens` counts the same split in token ids, for ``usage.completion_tokens_details.reasoning_tokens``
(vLLM's ``count_reasoning_tokens``): the tokens of what the parser makes reasoning, the tags' own tokens left out
(Granite's phrases found by the ids they have alone, which its "Here's" spelling does not match; vLLM counts none).
``qwen3``'s tool-call end is found the same way: the tokens before a ``<tool_call>`` (its ids alone) that the decoded
tokens after it confirm (``<function``) are reasoning, the call's are not.

``PARSERS`` is the registry, name -> class, that ``--reasoning-parser`` chooses from (its names are also
:data:`asyncdp.config.choices.REASONING_PARSERS`, which a test keeps equal).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from asyncdp.api.tool_parser_base import partial_prefix

START, END = "<think>", "</think>"
CALL = "<tool_call>"  # qwen3: a tool call that ends the thinking (``calls``), when ``<function`` follows it
_FUNCTION = "<function"
BEFORE, THINKING, AFTER, PLAIN = range(4)  # a parser's state: before its opening tag (``opens``), inside, after


class ReasoningParser:
    """One choice's incremental split of its text into reasoning and content (a new one per choice).

    A subclass names its tags and two switches, table-like: ``starts`` (the model's own opening tag, its spellings;
    none: the template always opens the block), ``ends`` (the closing tag's), ``opens`` (the thinking needs the
    opening tag: text before it is content, an answer without it all content, a closing tag before it dropped) and
    ``anchored`` (with ``opens``: the opening must begin the answer, else all of it is content, phrases included)."""

    name: ClassVar[str]
    starts: ClassVar[tuple[str, ...]] = (START,)
    ends: ClassVar[tuple[str, ...]] = (END,)
    opens: ClassVar[bool] = False
    anchored: ClassVar[bool] = False
    calls: ClassVar[bool] = False  # a ``<tool_call>`` that ``<function`` follows ends the thinking (qwen3)
    # Tokens the format needs in the text: kept by detokenizing with skip_special_tokens false when the tokenizer
    # marks one special (asyncdp.api.tool_parser_base.tags_are_special), or they would be missing from the text.
    tags: ClassVar[tuple[str, ...]] = (START, END)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.tags = cls.starts + cls.ends

    def __init__(self) -> None:
        self._state = BEFORE if self.opens else THINKING
        self._opened = self.opens  # the opening tag is behind: a later one is text
        self._buf = ""  # before the end: a tail that may begin a tag

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        """Whether a request with these ``chat_template_kwargs`` lets the model think (else: no parse at all)."""
        return True

    def feed(self, text: str) -> tuple[str, str]:
        """The reasoning and the content that ``text`` adds (either may be empty)."""
        if self._state in (AFTER, PLAIN):
            return "", self._content(text)
        self._buf += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._state == BEFORE and self._before(content):
            pass
        while self._state == THINKING and self._thinking(reasoning, content):
            pass
        return "".join(reasoning), self._content("".join(content))

    def _before(self, content: list[str]) -> bool:
        """Before the opening tag (``opens``): content until it; whether to go on."""
        buf = self._buf
        if self.anchored:
            tag = next((s for s in self.starts if buf.startswith(s)), None)
            if tag is not None:
                self._buf, self._state = buf[len(tag):], THINKING
            elif not any(s.startswith(buf) for s in self.starts):
                content.append(buf)
                self._buf, self._state = "", PLAIN
            return False
        at, tag = _first(buf, self.starts + self.ends)
        if at >= 0:
            content.append(buf[:at])  # (a closing tag before any opening one is dropped)
            self._buf = buf[at + len(tag):]
            if tag in self.starts:
                self._state = THINKING
            return True
        keep = max(partial_prefix(buf, tag) for tag in self.starts + self.ends)
        content.append(buf[:len(buf) - keep])
        self._buf = buf[len(buf) - keep:]
        return False

    def _thinking(self, reasoning: list[str], content: list[str]) -> bool:
        """Inside the thinking: reasoning until the first closing tag; whether to go on."""
        buf = self._buf
        end, end_tag = _first(buf, self.ends)
        call, held = find_call(buf) if self.calls else (-1, 0)
        start, start_tag = (-1, "") if self._opened else _first(buf, self.starts)
        if start >= 0 and (end < 0 or start < end) and (call < 0 or start < call):
            reasoning.append(buf[:start])
            self._buf, self._opened = buf[start + len(start_tag):], True
            return True
        if call >= 0 and (end < 0 or call < end):
            reasoning.append(buf[:call])
            content.append(buf[call:])  # (the call stays, for the tool-call parser)
            self._buf, self._state = "", AFTER
            return False
        if end >= 0:
            reasoning.append(buf[:end])
            content.append(buf[end + len(end_tag):])
            self._buf, self._state = "", AFTER
            return False
        tags = self.ends if self._opened else self.ends + self.starts
        keep = max([held] + [partial_prefix(buf, tag) for tag in tags])
        reasoning.append(buf[:len(buf) - keep])
        self._buf = buf[len(buf) - keep:]
        return False

    def _content(self, text: str) -> str:
        """The content as sent (a subclass may filter it, holding back what ``_content_rest`` returns at the end)."""
        return text

    def _content_rest(self) -> str:
        return ""

    def finish(self) -> tuple[str, str]:
        """What was held back, at the end of the answer: a partial tag that never completed is reasoning inside
        the thinking, content before it."""
        rest, self._buf = self._buf, ""
        if self._state == THINKING:
            return rest, self._content_rest()
        return "", self._content(rest) + self._content_rest()

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
    calls = True

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return template_kwargs.get("enable_thinking", True) is not False


class MiniMaxM2Parser(ReasoningParser):
    """MiniMax-M2: ``<think>``…``</think>`` read as ``deepseek_r1`` (vLLM's base think-tag parser)."""

    name = "minimax_m2"


class SeedOssParser(ReasoningParser):
    """ByteDance Seed-OSS: as ``deepseek_r1``, with ``<seed:think>``…``</seed:think>``."""

    name = "seed_oss"
    starts, ends = ("<seed:think>",), ("</seed:think>",)


class Step3Parser(ReasoningParser):
    """StepFun Step3: everything before the first ``</think>`` is reasoning; it knows no opening tag (a ``<think>``
    is text)."""

    name = "step3"
    starts = ()


class KimiK2Parser(ReasoningParser):
    """Kimi K2 (Thinking): as ``deepseek_r1``, unless ``chat_template_kwargs: {"thinking": false}`` (vLLM's switch for
    it), when the output is all content; the ``(no content)`` placeholder the model writes before a tool call with no
    text is taken out of the content."""

    name = "kimi_k2"
    placeholder = "(no content)"

    def __init__(self) -> None:
        super().__init__()
        self._held = ""  # content that may begin the placeholder

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return bool(template_kwargs.get("thinking", True))

    def _content(self, text: str) -> str:
        held = (self._held + text).replace(self.placeholder, "")
        keep = partial_prefix(held, self.placeholder)
        self._held = held[len(held) - keep:]
        return held[:len(held) - keep]

    def _content_rest(self) -> str:
        rest, self._held = self._held, ""
        return rest


class Glm45Parser(ReasoningParser):
    """GLM-4.5/4.6/4.7: the model opens ``<think>`` itself; an answer without it is all content (text before it is
    content too), and ``chat_template_kwargs: {"enable_thinking": false}`` (which closes an empty block in the
    prompt) turns the parse off."""

    name = "glm45"
    opens = True

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return template_kwargs.get("enable_thinking", True) is not False


class MistralParser(ReasoningParser):
    """Magistral (Mistral): ``[THINK]``…``[/THINK]``; without ``[THINK]`` the answer is all content (a stray
    ``[/THINK]`` dropped), text before it is content too."""

    name = "mistral"
    starts, ends = ("[THINK]",), ("[/THINK]",)
    opens = True


class GraniteParser(ReasoningParser):
    """IBM Granite 3.2 (``chat_template_kwargs: {"thinking": true}``): an answer that begins "Here is my thought
    process:" thinks until "Here is my response:" ("Here's" in either, as vLLM accepts); any other is all content."""

    name = "granite"
    starts = ("Here is my thought process:", "Here's my thought process:")
    ends = ("Here is my response:", "Here's my response:")
    opens = anchored = True


PARSERS: dict[str, type[ReasoningParser]] = {p.name: p for p in (
    DeepSeekR1Parser, Glm45Parser, GraniteParser, KimiK2Parser, MiniMaxM2Parser, MistralParser, Qwen3Parser,
    SeedOssParser, Step3Parser)}


_CALL_ENDS = re.compile(re.escape(CALL) + r"\s*<function[\s=]")


def find_call(text: str) -> tuple[int, int]:
    """Where the first tool call that ends qwen3's thinking begins in ``text`` (-1: none), and how long a tail of
    it could still begin one (a ``<tool_call>`` that only whitespace and a beginning of ``<function`` follow)."""
    found = _CALL_ENDS.search(text)
    at = text.find(CALL)
    while at >= 0 and (found is None or at < found.start()):
        if _FUNCTION.startswith(text[at + len(CALL):].lstrip()):
            return -1, len(text) - at
        at = text.find(CALL, at + 1)
    return (found.start(), 0) if found is not None else (-1, partial_prefix(text, CALL))


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    """Where the first of ``tags`` occurs in ``text`` (the longest at a tie) and which, or (-1, "")."""
    best, found = -1, ""
    for tag in tags:
        at = text.find(tag)
        if at >= 0 and (best < 0 or at < best or (at == best and len(tag) > len(found))):
            best, found = at, tag
    return best, found


def start_token_ids(tokenizer: Any, parser: type[ReasoningParser] = DeepSeekR1Parser) -> tuple[int, ...]:
    """The parser's start tag (its first spelling; none for ``step3``) as the server's tokenizer encodes it on its
    own, no special tokens added."""
    return tuple(tokenizer.encode(parser.starts[0], add_special_tokens=False)) if parser.starts else ()


def end_token_ids(tokenizer: Any, parser: type[ReasoningParser] = DeepSeekR1Parser) -> tuple[int, ...]:
    """The parser's end tag (``</think>``; its first spelling) as the server's tokenizer encodes it on its own, no
    special tokens added: one added token in Qwen3's and DeepSeek-R1's, several elsewhere. A constraint on an
    answer that may think starts after these ids (``StructuredOutputs.start_after``); a model that spells the tag
    with other tokens (Granite's "Here's my response:", a phrase after other text) leaves its answer free."""
    return tuple(tokenizer.encode(parser.ends[0], add_special_tokens=False))


def call_token_ids(tokenizer: Any, parser: type[ReasoningParser]) -> tuple[int, ...]:
    """``<tool_call>`` as the tokenizer encodes it alone, for a parser a tool call ends (``calls``; else none)."""
    return tuple(tokenizer.encode(CALL, add_special_tokens=False)) if parser.calls else ()


def split(parser: ReasoningParser, text: str) -> tuple[str | None, str]:
    """A whole answer's reasoning (None when there is none, as a stream that sent none) and content."""
    reasoning, content = parser.read(text, finished=True)
    return reasoning or None, content
