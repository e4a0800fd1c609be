"""The machine every reasoning parser of :mod:`asyncdp.api.reasoning_parsers` is: one choice's text split into
reasoning and content, incrementally, with each model's tags and switches as class attributes (a table).

A parser is sans-IO and incremental, as :mod:`asyncdp.api.tool_parsers`' are: :meth:`ReasoningParser.feed`
takes the next piece of generated text and returns the reasoning and the content known by now; a tail that could
begin a tag is held back until it cannot, and :meth:`ReasoningParser.finish` returns it at the end. A whole
answer is the same parse fed in one piece, so a streamed answer and a whole one agree however the text was cut.

The split, by default (``deepseek_r1``'s): everything before the first end tag is reasoning, everything after it
the content; the first start tag before it, the model's own opening, is dropped (a later one stays, as text); an
answer that never writes the end tag is all reasoning. The attributes change it: ``opens`` (the thinking needs
the opening tag), ``anchored`` (which must begin the answer), ``calls`` (qwen3's ``<tool_call>`` ends the
thinking, :func:`find_call`), and, for the content, ``dropped`` (strings taken out of it wherever they are: a
placeholder, an answer's wrapper tags) and ``trimmed_after`` (the end tag or dropped strings after which the
newlines that follow are dropped too). ``plain`` turns the split off (all content, the thinking and its tags
included) and ``prefix`` begins the content (``minimax_m2_append_think``'s ``<think>``, which the prompt opened).

A parser for a constrained answer (``constrained=True``) reads a ``calls`` parser's ``<tool_call>`` as the engine
does: the constraint's grammar starts after the first one generated (``start_markers``, as vLLM's ends the
reasoning there), so any ``<tool_call>`` ends the thinking, whatever follows it, and is dropped: the content is
the grammar's text (the JSON, or a named or ``"required"`` tool choice's calls).
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

    A subclass names its tags and switches, table-like: ``starts`` (the model's own opening tag, its spellings;
    none: the template always opens the block), ``ends`` (the closing tag's; the first is the one the ids find),
    ``opens`` (the thinking needs the opening tag: text before it is content, an answer without it all content, a
    closing tag before it dropped unless ``drops_stray_end`` is false, when it stays text) and ``anchored`` (with
    ``opens``: the opening must begin the answer, else all of it is content, phrases included); for the content,
    ``dropped`` and ``trimmed_after`` (see the module); ``plain`` (nothing is reasoning: the answer is all content,
    nor are its tokens counted) and ``prefix`` (text the content begins with, sent with the first piece of the
    answer, or at its end when it had none)."""

    name: ClassVar[str]
    starts: ClassVar[tuple[str, ...]] = (START,)
    ends: ClassVar[tuple[str, ...]] = (END,)
    opens: ClassVar[bool] = False
    anchored: ClassVar[bool] = False
    drops_stray_end: ClassVar[bool] = True
    calls: ClassVar[bool] = False  # a ``<tool_call>`` that ``<function`` follows (any, constrained) ends it (qwen3)
    # a header after which a constraint starts too (gpt-oss's final channel with a content type): its opening, its
    # closing, the most ids between them, what between them cancels it (asyncdp.api.reasoning_parsers.end_markers)
    end_header: ClassVar[tuple[str, str, int, str] | None] = None
    dropped: ClassVar[tuple[str, ...]] = ()
    trimmed_after: ClassVar[tuple[str, ...]] = ()
    plain: ClassVar[bool] = False
    prefix: ClassVar[str] = ""
    # Tokens the format needs in the text: kept by detokenizing with skip_special_tokens false when the tokenizer
    # marks one special (asyncdp.api.tool_parser_base.tags_are_special), or they would be missing from the text.
    tags: ClassVar[tuple[str, ...]] = (START, END)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "tags" not in cls.__dict__:  # (a parser that reads its format otherwise names them: harmony's)
            cls.tags = cls.starts + cls.ends + cls.dropped

    def __init__(self, *, constrained: bool = False) -> None:
        self._state = PLAIN if self.plain else BEFORE if self.opens else THINKING
        self._grammar_call = constrained and self.calls  # a <tool_call> starts the grammar: any ends the thinking
        self._prefix = self.prefix  # not sent yet
        self._opened = self.opens  # the opening tag is behind: a later one is text
        self._buf = ""  # before the end: a tail that may begin a tag
        self._held = ""  # the content's tail that may begin a dropped string
        self._trim = False  # the content's next newlines are dropped (after a trimmed_after tag)

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        """Whether a request with these ``chat_template_kwargs`` lets the model think (else: no parse at all)."""
        return True

    def feed(self, text: str) -> tuple[str, str]:
        """The reasoning and the content that ``text`` adds (either may be empty)."""
        reasoning, content = self._split(text)
        prefix, self._prefix = self._prefix, ""
        return reasoning, prefix + content

    def _split(self, text: str) -> tuple[str, str]:
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
        tags = self.starts + (self.ends if self.drops_stray_end else ())
        at, tag = _first(buf, tags)
        if at >= 0:
            content.append(buf[:at])  # (a closing tag before any opening one is dropped)
            self._buf = buf[at + len(tag):]
            if tag in self.starts:
                self._state = THINKING
            return True
        keep = max(partial_prefix(buf, tag) for tag in tags)
        content.append(buf[:len(buf) - keep])
        self._buf = buf[len(buf) - keep:]
        return False

    def _thinking(self, reasoning: list[str], content: list[str]) -> bool:
        """Inside the thinking: reasoning until the first closing tag; whether to go on."""
        buf = self._buf
        end, end_tag = _first(buf, self.ends)
        call, held = (_find(buf, CALL) if self._grammar_call else find_call(buf)) if self.calls else (-1, 0)
        start, start_tag = (-1, "") if self._opened else _first(buf, self.starts)
        if start >= 0 and (end < 0 or start < end) and (call < 0 or start < call):
            reasoning.append(buf[:start])
            self._buf, self._opened = buf[start + len(start_tag):], True
            return True
        if call >= 0 and (end < 0 or call < end):
            reasoning.append(buf[:call])
            # the call stays, for the tool-call parser; the tag a grammar started after is not the grammar's text
            content.append(buf[call + len(CALL):] if self._grammar_call else buf[call:])
            self._buf, self._state = "", AFTER
            return False
        if end >= 0:
            reasoning.append(buf[:end])
            content.append(buf[end + len(end_tag):])
            self._buf, self._state, self._trim = "", AFTER, end_tag in self.trimmed_after
            return False
        tags = self.ends if self._opened else self.ends + self.starts
        keep = max([held] + [partial_prefix(buf, tag) for tag in tags])
        reasoning.append(buf[:len(buf) - keep])
        self._buf = buf[len(buf) - keep:]
        return False

    def _content(self, text: str) -> str:
        """The content as sent: ``dropped`` taken out, newlines after a ``trimmed_after`` tag dropped, and a tail
        that may begin a dropped string held back (``_content_rest`` returns it at the end)."""
        if not self.dropped:
            return text
        held = self._held + text
        out: list[str] = []
        while True:
            if self._trim:
                held = held.lstrip("\n")
                if not held:
                    break
                self._trim = False
            at, tag = _first(held, self.dropped)
            if at < 0:
                break
            out.append(held[:at])
            held, self._trim = held[at + len(tag):], tag in self.trimmed_after
        keep = max(partial_prefix(held, tag) for tag in self.dropped)
        out.append(held[:len(held) - keep])
        self._held = held[len(held) - keep:]
        return "".join(out)

    def _content_rest(self) -> str:
        rest, self._held = self._held, ""
        return rest

    def finish(self) -> tuple[str, str]:
        """What was held back, at the end of the answer: a partial tag that never completed is reasoning inside
        the thinking, content before it."""
        rest, self._buf = self._buf, ""
        prefix, self._prefix = self._prefix, ""
        if self._state == THINKING:
            return rest, prefix + self._content_rest()
        return "", prefix + self._content(rest) + self._content_rest()

    def read(self, text: str, finished: bool) -> tuple[str, str]:
        """``feed`` then, when ``finished``, ``finish``: the reasoning and the content to send for ``text``."""
        reasoning, content = self.feed(text) if text else ("", "")
        if finished:
            more, rest = self.finish()
            reasoning, content = reasoning + more, content + rest
        return reasoning, content


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


def _find(text: str, tag: str) -> tuple[int, int]:
    """Where ``tag`` first occurs in ``text`` (-1: nowhere), and how long a tail of ``text`` could begin it."""
    at = text.find(tag)
    return (at, 0) if at >= 0 else (-1, partial_prefix(text, tag))


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    """Where the first of ``tags`` occurs in ``text`` (the longest at a tie) and which, or (-1, "")."""
    best, found = -1, ""
    for tag in tags:
        at = text.find(tag)
        if at >= 0 and (best < 0 or at < best or (at == best and len(tag) > len(found))):
            best, found = at, tag
    return best, found
