"""Stop strings through the whole core, against a brute-force reference (hypothesis, scripted byte tokens).

The output is a text of 1- to 4-byte characters fed one byte (token) per step, so characters and stop strings
cross token boundaries at every offset. The reference reads the text after each token (without a trailing
incomplete character) and stops at the first token after which any stop string occurs, cutting the text at the
earliest occurrence. The streamed deltas, the number of tokens, ``finish_reason`` and ``stop_reason`` must
agree.
"""

from __future__ import annotations

from engine_testing import encode, scripted_core
from hypothesis import given
from hypothesis import strategies as st

from asyncdp.sampling_params import SamplingParams

CHARS = st.sampled_from(["a", "b", " ", "\n", "é", "€", "😀"])  # 1, 2, 3 and 4 UTF-8 bytes
TEXT = st.lists(CHARS, min_size=1, max_size=24).map("".join)
STOPS = st.lists(st.lists(CHARS, min_size=1, max_size=4).map("".join), min_size=1, max_size=3, unique=True)


def visible(data: bytes) -> str:
    """The text of ``data`` without a trailing incomplete character (what the detokenizer has released)."""
    for cut in range(len(data), max(len(data) - 4, 0) - 1, -1):
        try:
            return data[:cut].decode()
        except UnicodeDecodeError:
            continue
    raise AssertionError("the generated text is valid UTF-8")


def reference(data: bytes, stops: list[str], include: bool) -> tuple[int, str, str, str | None]:
    for k in range(1, len(data) + 1):
        text = visible(data[:k])
        found = [(text.find(s), s) for s in stops if s in text]
        if found:
            at, stop = min(found)
            return k, text[:at + len(stop) if include else at], "stop", stop
    return len(data), data.decode(), "length", None


@given(TEXT, STOPS, st.booleans())
def test_streamed_text_tokens_and_reason_match_a_brute_force_stop_search(
        text: str, stops: list[str], include: bool) -> None:
    data = text.encode()
    core, _ = scripted_core({"r": list(data)}, max_model_len=1024)
    params = SamplingParams(max_tokens=len(data), stop=stops, include_stop_str_in_output=include)
    core.add_request("r", encode("ascii prompt "), params)
    deltas: list[str] = []
    num_tokens = 0
    last = None
    while core.has_unfinished():
        for out in core.step().outputs:
            deltas.append(out.new_text)
            num_tokens += len(out.new_token_ids)
            last = out
    assert last is not None and last.finished
    got = (num_tokens, "".join(deltas), last.finish_reason, last.stop_reason)
    assert got == reference(data, stops, include)
