"""The reasoning parsers of models whose answer comes wrapped in tags after the thinking (vLLM's ``ernie45`` and
``hunyuan_a13b``), as data on :class:`~asyncdp.api.reasoning_parser_base.ReasoningParser`: the wrapper's tags are
``dropped`` from the content, so a streamed answer and a whole one agree however the text was cut.

Where vLLM's whole and streamed readings of one answer differ, these follow its stream, token by token (the
model's ordinary case), as the registry's other parsers do: vLLM's whole ``ernie45`` keeps what lies outside the
``<response>`` wrapper only when one of its tags is missing, and its whole ``hunyuan_a13b`` makes an answer that
does not finish the pattern (cut while thinking, or one whose ``</think>`` has no newline before it) all content.
"""

from __future__ import annotations

from asyncdp.api.reasoning_parser_base import END, START, ReasoningParser

ERNIE_RESPONSE = ("<response>", "</response>")


class Ernie45Parser(ReasoningParser):
    """ERNIE-4.5 thinking models (ERNIE-4.5-21B-A3B-Thinking, ERNIE-4.5-VL): ``deepseek_r1``'s split of
    ``abc\\n</think>\\n\\n<response>\\ndef\\n</response>\\n`` (or ``abc\\n</think>\\ndef``), then the content
    unwrapped: the newlines after ``</think>`` and after ``</response>`` are dropped, and both ``<response>`` tags
    wherever they are (vLLM's stream drops them as tokens), so the first gives reasoning ``abc\\n`` and content
    ``\\ndef\\n``, the second ``def``. A tool call after the thinking (``<tool_call>``) is content, for the tool-call
    parser."""

    name = "ernie45"
    dropped = ERNIE_RESPONSE
    trimmed_after = (END, ERNIE_RESPONSE[1])


class HunyuanA13bParser(ReasoningParser):
    """Tencent Hunyuan-A13B: ``<think>\\n`` reasoning ``\\n</think>\\n<answer>\\n`` content ``\\n</answer>``, the
    model opening the thinking itself (``opens``: text before ``<think>\\n`` is content, an answer without it all
    content; an end before it stays text, as vLLM's stream reads it). Its fast answer (``/no_think``),
    ``<think>\\n\\n</think>\\n<answer>\\n``, thinks nothing. ``</think>\\n<answer>\\n`` ends the thinking without its
    newline too (as vLLM's stream, which accepts both), and ``\\n</answer>`` is dropped from the content. The
    reasoning tokens and a constraint's start are found by ``</think>\\n<answer>\\n`` as the tokenizer encodes it
    alone (the first of ``ends``), which both answers contain: Hunyuan's tokenizer makes the fast answer's
    ``\\n\\n`` one token, so ``\\n</think>``'s ids are not in it."""

    name = "hunyuan_a13b"
    starts = (START + "\n",)
    ends = (END + "\n<answer>\n", "\n" + END + "\n<answer>\n")
    opens = True
    drops_stray_end = False
    dropped = ("\n</answer>",)
