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
class attributes, :class:`~asyncdp.api.reasoning_parser_base.ReasoningParser`, which says how it reads): ``minimax_m2``
and ``seed_oss`` (``<seed:think>``) read as ``deepseek_r1``, ``deepseek_v3`` too but only when the request turns the
thinking on (``thinking`` or ``enable_thinking``), ``holo2`` as ``deepseek_v3`` but thinking when neither switch is
given, ``minimax_m2_append_think`` splits nothing (``plain``: the content is the answer with ``<think>`` before it),
``step3`` knows no opening tag, ``kimi_k2`` has the ``thinking``
switch and drops the model's ``(no content)`` placeholder from the content; ``glm45``, ``mistral`` (``[THINK]``) and
``granite`` (its phrases, which must begin the answer) need the opening tag (``opens``): text before it is content,
an answer without it all content. ``ernie45`` and ``hunyuan_a13b``, whose answers come wrapped in tags, are in
:mod:`asyncdp.api.wrapped_reasoning_parsers`; ``openai_gptoss`` (gpt-oss), whose answers are harmony messages, not
tags, in :mod:`asyncdp.api.harmony_parsers`. Where vLLM's whole and streamed readings of one answer differ, these
follow its stream (an opened block never closed is reasoning), so that a stream and a whole answer agree.

A constraint (structured outputs, a named or ``"required"`` tool choice) applies only after the thinking, as in
vLLM: the API passes :func:`end_token_ids` as the grammar's ``start_after`` (and :func:`end_markers` as its
``start_markers``: gpt-oss's final-channel header with a content type), and the engine starts the grammar at the
token after the first ``</think>`` it generates; the parsers then find the constrained text as content. With
``qwen3`` a ``<tool_call>`` written while thinking starts the grammar too (its ``start_markers``), as vLLM ends the
reasoning at the first one generated for its grammar; a constrained answer is then read with ``constrained=True``
(its parser and its token count): any ``<tool_call>`` ends the thinking and is dropped, the grammar's text after
it is the content.

Each parser is sans-IO and incremental (:mod:`asyncdp.api.reasoning_parser_base`): a streamed answer and a whole
one are the same parse, however the text was cut.

:class:`~asyncdp.api.reasoning_tokens.ReasoningTokens` counts the same split in token ids, for ``usage.completion_tokens_details.reasoning_tokens``
(vLLM's ``count_reasoning_tokens``): the tokens of what the parser makes reasoning, the tags' own tokens left out
(Granite's phrases found by the ids they have alone, which its "Here's" spelling does not match; vLLM counts none;
Hunyuan's end by ``</think>\\n<answer>\\n``'s, so the newline token before it counts: vLLM counts none either).
``qwen3``'s tool-call end is found the same way: the tokens before a ``<tool_call>`` (its ids alone) that the decoded
tokens after it confirm (``<function``) are reasoning, the call's are not. ``openai_gptoss`` counts its
``analysis`` messages' bodies (:class:`~asyncdp.api.harmony.HarmonyTokens`); :func:`token_counter` picks the count.

``PARSERS`` is the registry, name -> class, that ``--reasoning-parser`` chooses from (its names are also
:data:`asyncdp.config.choices.REASONING_PARSERS`, which a test keeps equal).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from asyncdp.api.harmony import TAGS, HarmonyTokens
from asyncdp.api.harmony_parsers import HarmonyReasoningParser
from asyncdp.api.reasoning_parser_base import CALL, END, START, ReasoningParser, find_call
from asyncdp.api.reasoning_tokens import NewTokenCount, ReasoningTokens
from asyncdp.api.wrapped_reasoning_parsers import Ernie45Parser, HunyuanA13bParser
from asyncdp.sampling_params import StartMarker

__all__ = ["CALL", "END", "PARSERS", "START", "DeepSeekR1Parser", "DeepSeekV3Parser", "Ernie45Parser",
           "HarmonyReasoningParser", "Holo2Parser", "HunyuanA13bParser", "MiniMaxM2AppendThinkParser", "Qwen3Parser",
           "ReasoningParser", "call_token_ids", "end_markers", "end_token_ids", "find_call", "split",
           "start_token_ids", "token_counter"]


class DeepSeekR1Parser(ReasoningParser):
    """DeepSeek-R1 and its distills, QwQ: the template opens ``<think>`` in the prompt; always thinking."""

    name = "deepseek_r1"


class DeepSeekV3Parser(DeepSeekR1Parser):
    """DeepSeek-V3.1 and later (hybrid thinking): ``deepseek_r1``'s split when the request turns the thinking on,
    ``chat_template_kwargs`` ``thinking`` or ``enable_thinking`` true (either; ``reasoning_effort`` other than
    ``"none"`` sets the latter), and otherwise no parse at all: off unless asked for, as vLLM's."""

    name = "deepseek_v3"

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return bool(template_kwargs.get("thinking")) or bool(template_kwargs.get("enable_thinking"))


class Holo2Parser(DeepSeekV3Parser):
    """H Company's Holo2 (Qwen3-based): ``deepseek_v3``, but thinking by default, as vLLM's (its
    ``DeepSeekV3ReasoningWithThinkingParser``): on when the request gives neither ``thinking`` nor
    ``enable_thinking`` (or gives them null), else as ``deepseek_v3`` (either true: on), so ``thinking: false`` or
    ``reasoning_effort: "none"`` turns it off."""

    name = "holo2"

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        if template_kwargs.get("thinking") is None and template_kwargs.get("enable_thinking") is None:
            return True
        return super().thinks(template_kwargs)


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


class MiniMaxM2AppendThinkParser(ReasoningParser):
    """MiniMax-M2 for clients that keep the thinking in the answer (vLLM's ``minimax_m2_append_think``): nothing is
    reasoning; the content is the whole answer with the ``<think>`` the template opened in the prompt before it
    (``<think>`` + ``abc</think>def``), as vLLM's, which prepends it to the first delta; no reasoning tokens. A
    constraint still starts after ``</think>``."""

    name = "minimax_m2_append_think"
    plain = True
    prefix = START


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
    dropped = ("(no content)",)

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return bool(template_kwargs.get("thinking", True))


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
    DeepSeekR1Parser, DeepSeekV3Parser, Ernie45Parser, Glm45Parser, GraniteParser, Holo2Parser, HunyuanA13bParser,
    KimiK2Parser, MiniMaxM2Parser, MiniMaxM2AppendThinkParser, MistralParser, HarmonyReasoningParser, Qwen3Parser,
    SeedOssParser, Step3Parser)}


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


def end_markers(tokenizer: Any, parser: type[ReasoningParser]) -> tuple[StartMarker, ...]:
    """More ends of the thinking after which a constraint starts (``StructuredOutputs.start_markers``), each part
    as the tokenizer encodes it alone: the parser's ``end_header`` (gpt-oss's final-channel header, any content
    type between its parts), and a ``calls`` parser's ``<tool_call>`` (qwen3: vLLM ends the reasoning at the first
    one generated, for its grammar too); none for the others."""
    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False))

    markers = [StartMarker(ids=ids(CALL))] if parser.calls else []
    if parser.end_header is not None:
        opening, closing, max_gap_tokens, cancel = parser.end_header
        markers.append(StartMarker(ids=ids(opening), closed_by=ids(closing), max_gap_tokens=max_gap_tokens,
                                   cancelled_by=ids(cancel)))
    return tuple(markers)


def call_token_ids(tokenizer: Any, parser: type[ReasoningParser]) -> tuple[int, ...]:
    """``<tool_call>`` as the tokenizer encodes it alone, for a parser a tool call ends (``calls``; else none)."""
    return tuple(tokenizer.encode(CALL, add_special_tokens=False)) if parser.calls else ()


def token_counter(tokenizer: Any, parser: type[ReasoningParser]) -> NewTokenCount:
    """A new choice's reasoning-token count (``reasoning_tokens``), by the parser's tags as ``tokenizer`` encodes
    each alone: :class:`ReasoningTokens` (a constrained answer's: any ``<tool_call>`` ends its thinking), or
    harmony's messages for ``openai_gptoss``. Token ids are decoded with the special tokens kept (what follows
    qwen3's ``<tool_call>``, a harmony header)."""
    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    if issubclass(parser, HarmonyReasoningParser):
        tag_ids = {tag: tuple(tokenizer.encode(tag, add_special_tokens=False)) for tag in TAGS}
        return lambda constrained=False: HarmonyTokens(tag_ids, decode)
    count = partial(ReasoningTokens, start_token_ids(tokenizer, parser), end_token_ids(tokenizer, parser),
                    parser.opens, call_token_ids(tokenizer, parser), decode, parser.plain)
    return lambda constrained=False: count(bare_call=constrained)


def split(parser: ReasoningParser, text: str) -> tuple[str | None, str]:
    """A whole answer's reasoning (None when there is none, as a stream that sent none) and content."""
    reasoning, content = parser.read(text, finished=True)
    return reasoning or None, content
