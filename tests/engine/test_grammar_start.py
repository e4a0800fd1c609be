"""Where a waiting grammar starts (``asyncdp.engine.grammar_start``): a ``start_after`` sequence, as before, and a
``StartMarker`` header, gpt-oss's final answer with or without a content type (vLLM's rule: ``<|channel|>final``,
at most 19 ids, ``<|message|>``, no ``<|end|>`` between). Before, only the fixed ``<|channel|>final<|message|>``
started it, so a final header with ``<|constrain|>json`` left the answer unconstrained."""

from __future__ import annotations

import msgspec
import pytest

from asyncdp.engine.grammar_start import start_watch
from asyncdp.errors import InvalidSamplingParams
from asyncdp.sampling_params import SamplingParams, StartMarker, StructuredOutputs

# one id per harmony piece: <|start|> assistant <|channel|> final analysis commentary <|constrain|> json
# <|message|> <|end|>, then "text" ids
START, ASSISTANT, CHANNEL, FINAL, ANALYSIS, COMMENTARY, CONSTRAIN, JSON, MESSAGE, END = range(1, 11)
TEXT = 50
HEADER = StartMarker(ids=(CHANNEL, FINAL), closed_by=(MESSAGE,), max_gap_tokens=19, cancelled_by=(END,))


def started_at(ids: list[int], **structured: object) -> int | None:
    """The index of the id after which the grammar starts (None: it never does)."""
    watch = start_watch(StructuredOutputs(regex="a", **structured))  # type: ignore[arg-type]
    assert watch is not None
    return next((i for i, t in enumerate(ids) if watch.seen(t)), None)


def final(*between: int) -> list[int]:
    return [START, ASSISTANT, CHANNEL, FINAL, *between, MESSAGE]


THOUGHT = [CHANNEL, ANALYSIS, MESSAGE, TEXT, TEXT, END]


@pytest.mark.parametrize("between", [(), (CONSTRAIN, JSON), (TEXT, CONSTRAIN, JSON, TEXT)],
                         ids=["no content type", "<|constrain|>json", "a spaced content type"])
def test_a_final_header_starts_the_grammar_after_its_message_tag(between: tuple[int, ...]) -> None:
    ids = THOUGHT + final(*between) + [TEXT, TEXT]
    assert started_at(ids, start_markers=(HEADER,)) == len(THOUGHT) + len(final(*between)) - 1


@pytest.mark.parametrize("channel", [ANALYSIS, COMMENTARY])
def test_a_header_on_another_channel_does_not_start_it(channel: int) -> None:
    ids = [CHANNEL, channel, MESSAGE, TEXT, END, CHANNEL, channel, TEXT, CONSTRAIN, JSON, MESSAGE, TEXT]
    assert started_at(ids, start_markers=(HEADER,)) is None


def test_the_message_tag_must_come_within_19_ids_of_the_final_channel() -> None:
    assert started_at(final(*[TEXT] * 19), start_markers=(HEADER,)) == 2 + 2 + 19
    assert started_at(final(*[TEXT] * 20) + [TEXT], start_markers=(HEADER,)) is None


def test_an_end_tag_between_cancels_the_header_and_a_later_final_starts_over() -> None:
    assert started_at([CHANNEL, FINAL, TEXT, END, TEXT, MESSAGE, TEXT], start_markers=(HEADER,)) is None
    ids = [CHANNEL, FINAL, END, CHANNEL, ANALYSIS, *[TEXT] * 30, CHANNEL, FINAL, CONSTRAIN, JSON, MESSAGE]
    assert started_at(ids, start_markers=(HEADER,)) == len(ids) - 1


def test_multi_id_parts_span_steps_and_must_follow_the_opening() -> None:
    """Parts of several ids (a byte tokenizer's): the closing's ids must all come after the opening's."""
    header = StartMarker(ids=(7, 8, 9), closed_by=(8, 9), max_gap_tokens=2, cancelled_by=(4, 4))
    watch = start_watch(StructuredOutputs(regex="a", start_markers=(header,)))
    assert watch is not None
    assert [watch.seen(t) for t in (7, 8, 9, 8, 9)] == [False] * 4 + [True]
    assert started_at([7, 8, 9, 4, 4, 8, 9], start_markers=(header,)) is None  # cancelled by the pair 4, 4
    assert started_at([7, 8, 9, 4, 1, 4, 8, 9], start_markers=(header,)) is None  # 3 ids between: over the gap
    assert started_at([7, 8, 9, 4, 8, 9], start_markers=(header,)) == 5


def test_start_after_alone_is_the_sequence_it_was() -> None:
    assert started_at([1, 2, 1, 2, 3, 4], start_after=(2, 3)) == 4
    assert started_at([2, 3], start_after=(1, 2, 3)) is None
    assert start_watch(StructuredOutputs(regex="a")) is None  # no wait: the grammar starts at once


def test_the_first_of_start_after_and_the_markers_starts_it() -> None:
    fixed = (CHANNEL, FINAL, MESSAGE)
    assert started_at(final(CONSTRAIN, JSON), start_after=fixed, start_markers=(HEADER,)) == 6
    assert started_at(final(), start_after=fixed, start_markers=(HEADER,)) == 4
    plain = StartMarker(ids=(TEXT, TEXT))
    assert started_at([TEXT, TEXT, CHANNEL], start_after=fixed, start_markers=(HEADER, plain)) == 1


def test_start_markers_round_trip_the_wire_codec_and_are_validated() -> None:
    p = SamplingParams(structured=StructuredOutputs(regex="a", start_after=(1,), start_markers=[HEADER]))  # type: ignore[arg-type]
    assert p.structured is not None and p.structured.start_markers == (HEADER,)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p
    assert StartMarker(ids=[1, 2]).ids == (1, 2)  # type: ignore[arg-type]
    for bad in (StartMarker(ids=()), StartMarker(ids=(1,), closed_by=(-1,)), StartMarker(ids=(1,), max_gap_tokens=-1)):
        with pytest.raises(InvalidSamplingParams) as err:
            StructuredOutputs(regex="a", start_markers=(bad,)).validate()
        assert err.value.field == "structured.start_markers"
    with pytest.raises(InvalidSamplingParams):
        StructuredOutputs(regex="a", start_markers=((1, 2),)).validate()  # type: ignore[arg-type]
