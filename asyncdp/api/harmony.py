"""OpenAI's harmony format (gpt-oss), read from the text: the messages of an answer, incrementally, for the
``openai_gptoss`` reasoning parser and the ``openai`` tool-call parser (:mod:`asyncdp.api.harmony_parsers`), and
the same split counted in token ids (:class:`HarmonyTokens`).

The prompt ends with ``<|start|>assistant``; the model writes one message or more::

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"SF"}<|call|>

A message is a header, ``<|message|>``, a body, and a terminator (``<|end|>``, or the stop tokens ``<|return|>``
and ``<|call|>``, which end the generation and are not in the text: the answer's end ends the message then). The
header is ``<|start|>`` and a role (the first message's are the prompt's, so it has neither, or only the role),
then, in any order, ``<|channel|>`` and the channel's name, the recipient ``to=NAME`` (in the role's section or
the channel's) and a content type (``json``, or ``<|constrain|>json``), read as harmony's own parser reads them
(a lone word is the recipient, unless it is ``<|constrain|>``'s; a word after a recipient is the content type).
A header of anything else, one longer than :data:`MAX_HEADER` characters or with more than four words, is no
header: its text is loose text, as is text between messages and a header the answer ends in. A body ends only at a terminator (harmony's parser reads
a ``<|start|>`` inside a body as text too).

:class:`Splitter` turns text into :class:`Event`\\ s however it is cut: the same text gives the same events.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from asyncdp.api.reasoning_tokens import find_ids, partial_ids
from asyncdp.api.tool_parser_base import partial_prefix

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
TERMINATORS = (END, RETURN, CALL)
TAGS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, RETURN, CALL)  # gpt-oss's special tokens: kept in the text
MAX_HEADER = 256  # characters after ``<|start|>``: a longer header is text
_MAX_WORDS = 4  # the role, the channel, the recipient, the content type
_WORD = re.compile(r"[^\s<]+")
_FUNCTIONS = "functions."


@dataclass(frozen=True, slots=True)
class Header:
    """A message's header, as harmony's parser reads it: ``None`` where the header does not say."""

    channel: str | None
    recipient: str | None
    content_type: str | None

    @property
    def function(self) -> str | None:
        """The function a tool call is for (``to=functions.NAME`` on the ``commentary`` or ``analysis`` channel,
        as vLLM's stream reads calls), else None."""
        if self.recipient is None or not self.recipient.startswith(_FUNCTIONS):
            return None
        return self.recipient[len(_FUNCTIONS):] if self.channel in ("commentary", "analysis") else None

    @property
    def thinking(self) -> bool:
        """Whether the body is reasoning: the ``analysis`` channel's, a call's excepted."""
        return self.channel == "analysis" and self.function is None


def _items(text: str, started: bool, complete: bool) -> list[str] | None:
    """A header's items (``CHANNEL``, ``CONSTRAIN`` and words), or None when ``text`` is none (``complete``) or
    begins none (otherwise: a tail that begins a tag, a word that may go on)."""
    if len(text) > MAX_HEADER:
        return None
    items: list[str] = []
    i, words = 0, 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return items
        tag = next((t for t in (CHANNEL, CONSTRAIN) if text.startswith(t, i)), None)
        if tag is not None:
            items.append(tag)
            i += len(tag)
            continue
        if text[i] == "<":  # only the start of a tag the header may have, at the end of a header not complete
            rest = text[i:]
            return items if not complete and any(t.startswith(rest) for t in (CHANNEL, CONSTRAIN, MESSAGE)) else None
        word = _WORD.match(text, i)
        assert word is not None
        words += 1
        if words > _MAX_WORDS:
            return None
        if not started and not items:  # the first message's header: the role, a recipient, or the channel first
            w, last = word.group(), word.end() == len(text) and not complete
            if not (w == "assistant" or w.startswith("to=")
                    or (last and ("assistant".startswith(w) or "to=".startswith(w)))):
                return None
        items.append(word.group())
        i = word.end()


def may_be_header(text: str, started: bool) -> bool:
    """Whether ``text`` (``<|start|>`` first when ``started``) may still grow into a header."""
    return _items(text[len(START):] if started else text, started, complete=False) is not None


def parse_header(text: str, started: bool) -> Header | None:
    """The header ``text`` (before ``<|message|>``; ``<|start|>`` first when ``started``) is, or None."""
    items = _items(text[len(START):] if started else text, started, complete=True)
    if items is None:
        return None
    channel: str | None = None
    parts: list[str] = []
    for i, item in enumerate(items):
        if item in (CHANNEL, CONSTRAIN) and (i + 1 == len(items) or items[i + 1] in (CHANNEL, CONSTRAIN)):
            return None  # a tag with no word after it
        before = items[i - 1] if i else ""
        if before == CHANNEL:
            if channel is not None:
                return None
            channel = item
        elif before == CONSTRAIN:
            parts.append(CONSTRAIN + item)
        elif item not in (CHANNEL, CONSTRAIN):
            parts.append(item)
    if started:
        if not parts:
            return None  # (<|start|> needs a role)
        parts.pop(0)
    elif parts and parts[0] == "assistant":
        parts.pop(0)
    recipient = content_type = None
    if parts:
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif not parts and not last.startswith(CONSTRAIN):
            recipient = last  # (harmony's: a lone word is the recipient)
        else:
            content_type = last
            if parts:
                raw = parts.pop()
                recipient = raw[3:] if raw.startswith("to=") else raw
    return None if parts else Header(channel, recipient, content_type)


@dataclass(frozen=True, slots=True)
class Event:
    """What the text says, in order: ``text`` (loose text), ``open`` (a message's header: its ``header`` and its
    text, ``<|message|>`` included), ``body`` (its body's text, in pieces) and ``close`` (its terminator, "" when
    the answer ended in the body)."""

    kind: str
    text: str
    header: Header | None = None


HEADER, BODY, BETWEEN = range(3)


class Splitter:
    """One answer's text, incrementally, as :class:`Event`\\ s: a tail that may begin a tag, and a header until
    its ``<|message|>``, are held back until they are known."""

    def __init__(self) -> None:
        self._state = HEADER
        self._started = False  # the header began with <|start|> (every header but the first message's)
        self._buf = ""

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[Event]:
        """The held text, at the answer's end: a header's is loose text; a body's ends its message."""
        rest, self._buf = self._buf, ""
        if self._state == BODY:
            return ([Event("body", rest)] if rest else []) + [Event("close", "")]
        return [Event("text", rest)] if rest else []

    def _step(self, out: list[Event]) -> bool:
        buf = self._buf
        if self._state == HEADER:
            at = buf.find(MESSAGE)
            header = parse_header(buf[:at], self._started) if at >= 0 else None
            if header is not None:
                out.append(Event("open", buf[:at + len(MESSAGE)], header))
                self._buf, self._state = buf[at + len(MESSAGE):], BODY
                return True
            if at < 0 and may_be_header(buf, self._started):
                return False
            if self._started:  # no header: its <|start|> is text, and so is what follows until the next one
                out.append(Event("text", START))
                self._buf = buf[len(START):]
            self._state = BETWEEN
            return True
        if self._state == BODY:
            at, end = _first(buf, TERMINATORS)
            if at >= 0:
                if at:
                    out.append(Event("body", buf[:at]))
                out.append(Event("close", end))
                self._buf, self._state = buf[at + len(end):], BETWEEN
                return True
            keep = max(partial_prefix(buf, t) for t in TERMINATORS)
            if len(buf) > keep:
                out.append(Event("body", buf[:len(buf) - keep]))
            self._buf = buf[len(buf) - keep:]
            return False
        at = buf.find(START)
        cut = at if at >= 0 else len(buf) - partial_prefix(buf, START)
        if cut:
            out.append(Event("text", buf[:cut]))
        self._buf = buf[cut:]
        if at >= 0:
            self._state, self._started = HEADER, True
        return at >= 0


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    """Where the first of ``tags`` occurs in ``text``, and which, or (-1, "")."""
    found = [(at, tag) for tag in tags if (at := text.find(tag)) >= 0]
    return min(found) if found else (-1, "")


class HarmonyTokens:
    """One choice's reasoning tokens, counted from its token ids as :class:`Splitter` reads its text: the tokens
    of the ``analysis`` messages' bodies (a call's excepted), the headers' and terminators' left out. The tags are
    found by their ids as the tokenizer encodes each alone (one special token each in gpt-oss's); a header's ids
    are decoded to read it. A tail that may begin a tag is held until it cannot, and ``finish`` counts it."""

    def __init__(self, tag_ids: dict[str, tuple[int, ...]], decode: Callable[[list[int]], str]) -> None:
        self._start, self._message = tag_ids[START], tag_ids[MESSAGE]
        self._ends = [tag_ids[t] for t in TERMINATORS]
        self._decode = decode
        self.count = 0
        self._state, self._started, self._thinking = HEADER, False, False
        self._held: list[int] = []

    def feed(self, token_ids: Sequence[int]) -> None:
        self._held.extend(token_ids)
        while self._step():
            pass

    def _step(self) -> bool:
        held = self._held
        if self._state == HEADER:
            at = find_ids(held, self._message)
            header = parse_header(self._decode(held[:at]), self._started) if at >= 0 else None
            if header is not None:
                del held[:at + len(self._message)]
                self._state, self._thinking = BODY, header.thinking
                return True
            if at < 0 and may_be_header(self._decode(held), self._started):
                return False
            if self._started:
                del held[:len(self._start)]
            self._state = BETWEEN
            return True
        if self._state == BODY:
            found = [(at, len(end)) for end in self._ends if (at := find_ids(held, end)) >= 0]
            if found:
                at, size = min(found)
                self.count += at if self._thinking else 0
                del held[:at + size]
                self._state = BETWEEN
                return True
            keep = max(partial_ids(held, end) for end in self._ends)
            self.count += len(held) - keep if self._thinking else 0
            del held[:len(held) - keep]
            return False
        at = find_ids(held, self._start)
        del held[:at if at >= 0 else len(held) - partial_ids(held, self._start)]
        if at >= 0:
            self._state, self._started = HEADER, True
        return at >= 0

    def finish(self) -> int:
        """The count, at the end of the answer: a body's held tail counts, a header's does not."""
        if self._state == BODY and self._thinking:
            self.count += len(self._held)
        self._held.clear()
        return self.count
