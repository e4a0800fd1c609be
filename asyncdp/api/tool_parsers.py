"""Tool-call parsers: how ``tool_choice: "auto"`` finds tool calls in a model's free text (vLLM's
``--enable-auto-tool-choice --tool-call-parser NAME``).

A parser is sans-IO and incremental: :meth:`ToolCallParser.feed` takes the next piece of generated text and
returns what is known by now, in order: text (``str``) and complete calls (:class:`ParsedCall`);
:meth:`ToolCallParser.finish` returns the rest at the end. The whole answer is parsed by feeding it in one
piece, so a streamed answer and a whole one are the same parse, however the text was cut into deltas.
:class:`AutoToolCalls` turns those pieces into what the client sees (content and calls, see its doc), keeping
only the first call under ``parallel_tool_calls: false``.

``PARSERS`` is the registry, name -> class, that ``--tool-call-parser`` chooses from (its names are also
:data:`asyncdp.config.choices.TOOL_CALL_PARSERS`, which a test keeps equal): ``hermes`` here, ``llama3_json``,
``pythonic`` and ``llama4_pythonic`` in :mod:`asyncdp.api.llama_tool_parsers`, ``mistral`` in
:mod:`asyncdp.api.mistral_tool_parsers`, ``qwen3_coder`` in :mod:`asyncdp.api.qwen_tool_parsers`, ``openai``
(gpt-oss's harmony messages) in :mod:`asyncdp.api.harmony_parsers`, on the interface of
:mod:`asyncdp.api.tool_parser_base`.
Every format follows the same rules: a call must name one of the request's tools; anything that is not a valid
call stays text, verbatim, so nothing the model wrote is lost; and text that may still become a call is held
back while streaming until it is known, so a streamed answer and a whole one agree however the text is cut.

``hermes`` (Hermes 2 Pro, Qwen 2.5 and 3, and the other models whose chat templates ask for it): each call is a
block ``<tool_call>{"name": F, "arguments": {...}}</tool_call>`` (whitespace around the JSON allowed), several
blocks for several calls. A block is a call when its JSON is an object whose ``name`` is one of the request's
tools and whose ``arguments`` is an object, a string holding a JSON object (passed on as written), or absent
(``"{}"``). Any other block (malformed JSON, an unknown name, other arguments) stays in the text verbatim, tags
included, so nothing the model wrote is lost. A last block whose closing tag never came (the model stopped, or
``max_tokens`` cut it) is a call when its JSON is complete, as vLLM's pattern accepts it, and text otherwise.
Outside a block, a tail that could begin ``<tool_call>`` is held back until it cannot (as the stop-string
hold-back does); inside one, everything is held until the block closes.

``llama3_json`` (Llama 3.1 to 3.3 with JSON tool calling, and Llama 4's JSON template): a call is an object
``{"name": F, "parameters": {...}}`` (or ``"arguments"``; exactly one of the two, an object or a string holding
one; other keys, such as ``"type": "function"``, are ignored as vLLM ignores them), where the answer begins
(after whitespace) or right after ``<|python_tag|>`` (whitespace between allowed), wherever that token comes.
More objects may follow, separated by ``;`` or whitespace; the tag and the separators between objects are the
format and are dropped. Text after the last object (a trailing ``;`` included) is content, and an object in it is
no call: only the answer's start and the tag say a call is coming, so a ``{`` in prose is never held. An object
runs to its matching ``}`` (braces in strings skipped); it is a call when that text is valid JSON of a call, and
otherwise stays text with what introduced it (the tag or a separator). While streaming, an object is held until it
closes (the latency: the whole call, which is sent whole anyway; a JSON answer that is no call is held to its end
too); a tail that could begin the tag is held until it cannot. An object that never closes is text. Llama
tokenizers mark ``<|python_tag|>`` special, so it is a tag (see :func:`tags_are_special`). vLLM parses every
``{`` anywhere in a whole answer but only an answer that starts with ``{`` or the tag when streaming, turns the
whole answer back into text when one object fails, and drops the text around the calls.

``pythonic`` (Llama 3.2 and 4, ToolACE and others whose templates ask for it): the answer begins (after
whitespace) with a Python list of calls, ``[f(a=1, b="x"), g()]``, parsed with :mod:`ast` (never evaluated). The
list is calls when every item is a call of one of the request's tools by its bare name, with keyword arguments
only, each a literal: a string, a number (signed), ``True``/``False``/``None`` (and JSON's ``true``/``false``/
``null``, as vLLM reads them), a list or tuple (a JSON array) or a dict with string keys, nested; the arguments
go out as a JSON object (non-ASCII kept; a number JSON cannot write, ``1e999``, makes it no call). Otherwise the
whole list stays text, so a call is never split from its siblings; vLLM answers all-or-nothing too, but takes
any name and drops positional arguments. Text after the list is content (vLLM makes the whole answer text); an
answer that does not begin with the list is all text, as vLLM's. While streaming, the answer is held while it may
still be ``[name(``, released as text the moment it cannot be, and otherwise held until the list's ``]``
(brackets in strings skipped), when its calls go out together.

``llama4_pythonic``: ``pythonic``, with the list optionally wrapped in ``<|python_start|>`` and ``<|python_end|>``
(whitespace around them allowed), which are dropped when the list is calls and stay text otherwise; a closing tag
that no start tag opened is text.

``mistral``: ``[TOOL_CALLS]`` (whitespace after it allowed), then either a JSON array of ``{"name", "arguments"}``
objects (tokenizers before v11; every item a call, or the token and the array stay text) or ``NAME[ARGS]{...}``
(v11 and later; ``[ARGS]`` optional), one call per token, its arguments a JSON object passed on as written. The
form is told by the text (``[`` after the token), where vLLM asks the tokenizer. When what follows a token is no
call, the token is text and the rest is read again as text. Calls' ids are nine letters and digits, as Mistral's
tokenizers require. Held while streaming: a tail that may begin the token, a name while it may still be a tool's
``NAME{`` or ``NAME[ARGS]{``, and the JSON until it closes.

``qwen3_coder``: ``hermes``'s blocks (:class:`asyncdp.api.tool_parser_base.TaggedBlockParser`) holding
``<function=NAME>`` ``<parameter=P>value</parameter>``... ``</function>``; each value is typed by the tool's
``parameters`` schema as vLLM types it (:func:`asyncdp.api.qwen_tool_parsers.typed`). Qwen3-Coder often leaves
the ``<tool_call>`` out: a bare ``<function=NAME>...</function>`` is a call too when NAME is one of the request's
tools (a ``</tool_call>`` right after it, whitespace between allowed, is dropped), and other text with
``<function`` in it stays text; only ``<function=`` and a tool's name are held back while streaming.
"""

from __future__ import annotations

from asyncdp.api.harmony_parsers import HarmonyToolParser
from asyncdp.api.llama_tool_parsers import Llama3JsonParser, Llama4PythonicParser, PythonicParser
from asyncdp.api.mistral_tool_parsers import MistralParser
from asyncdp.api.qwen_tool_parsers import Qwen3CoderParser
from asyncdp.api.tool_parser_base import (
    ParsedCall,
    Piece,
    TaggedBlockParser,
    ToolCallParser,
    arguments_json,
    json_object,
    partial_prefix,
    tags_are_special,
)

__all__ = ["PARSERS", "AutoToolCalls", "HarmonyToolParser", "HermesParser", "Llama3JsonParser", "Llama4PythonicParser", "MistralParser",
           "ParsedCall", "Piece", "PythonicParser", "Qwen3CoderParser", "ToolCallParser", "partial_prefix",
           "tags_are_special"]


class HermesParser(TaggedBlockParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (see the module doc)."""

    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"
    tags = (START, END)

    def _call(self, body: str, opener: str) -> ParsedCall | None:
        """The call a block's JSON describes, or None when it is not one (then the block stays text)."""
        parsed = json_object(body)
        if parsed is None or (name := self.tool_named(parsed)) is None:
            return None
        arguments = arguments_json(parsed.get("arguments", {}))
        return None if arguments is None else ParsedCall(name, arguments)


PARSERS: dict[str, type[ToolCallParser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, Llama4PythonicParser, MistralParser, HarmonyToolParser,
                        PythonicParser, Qwen3CoderParser)}


class AutoToolCalls:
    """One choice's answer under ``tool_choice: "auto"``: the content and the calls to send for each piece of
    text. Whole answers and streams both go through it (a whole answer is one piece, finished).

    The content is the text outside the call blocks. Whitespace is held back until text follows it; at the end
    it is sent when the answer has no calls (so an answer without calls is its text, unchanged) and dropped when
    it has some (so the content of an answer with calls has no trailing whitespace, and the separators around
    its blocks alone make no content: ``null``, as vLLM answers).

    ``parallel`` false (a request's ``parallel_tool_calls: false``) sends only the first call the parser finds;
    the later ones are dropped, not made content, as vLLM drops them (generation goes on to its end all the same).
    """

    def __init__(self, parser: ToolCallParser, parallel: bool = True) -> None:
        self._parser = parser
        self._parallel = parallel
        self._held = ""  # whitespace not sent yet
        self.num_calls = 0  # the calls sent: a streamed call's index

    def feed(self, text: str, finished: bool) -> tuple[str, list[ParsedCall]]:
        """The content and the calls that ``text`` (maybe empty) completes; ``finished``: it ends the answer."""
        pieces = self._parser.feed(text) if text else []
        if finished:
            pieces += self._parser.finish()
        content: list[str] = []
        calls: list[ParsedCall] = []
        for piece in pieces:
            if isinstance(piece, ParsedCall):
                calls.append(piece)
                continue
            joined = self._held + piece
            sent = joined.rstrip()
            self._held = joined[len(sent):]
            content.append(sent)
        if not self._parallel:
            calls = [] if self.num_calls else calls[:1]
        self.num_calls += len(calls)
        if finished:
            if not self.num_calls:
                content.append(self._held)
            self._held = ""
        return "".join(content), calls
