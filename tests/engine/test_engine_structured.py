"""Structured outputs in the engine core (no torch): validation, per-request matchers, masks, completion, and
grammars that exceed the library's limits (refused at validation, or ended with an error mid-generation)."""

from __future__ import annotations

import json
import logging

import pytest
from engine_testing import EOS_ID, ScriptedExecutor, encode, run_to_completion, scripted_core, sim_core

from asyncdp.engine.executor import ModelBatch, StepResult
from asyncdp.errors import InvalidRequestError, InvalidSamplingParams
from asyncdp.sampling_params import SamplingParams, StructuredOutputs
from asyncdp.sampling_params.structured import PROBE_STEPS, check_grammar

pytest.importorskip("llguidance", reason="structured outputs need llguidance (pip install llguidance)")


class MaskingExecutor(ScriptedExecutor):
    """A scripted executor that honours token masks the way a sampler does: the scripted token when the mask
    allows it, else the lowest allowed token; it records every batch's masks."""

    applies_token_masks = True

    def __init__(self, scripts: dict[str, list[int]]) -> None:
        super().__init__(scripts)
        self.masks: list[tuple[list[str], list[set[int]]] | None] = []

    def execute(self, batch: ModelBatch) -> StepResult:
        result = super().execute(batch)
        masks = batch.token_masks
        if masks is None:
            self.masks.append(None)
            return result
        allowed_sets = []
        unpacked = masks.allowed(self.vocab_size)
        for row, i in enumerate(masks.chunk_indices):
            allowed = {t for t in range(self.vocab_size) if unpacked[row, t]}
            allowed_sets.append(allowed)
            if result.sampled[i] not in allowed:
                result.sampled[i] = min(allowed)
        self.masks.append(([batch.chunks[i].request_id for i in masks.chunk_indices], allowed_sets))
        return result


def masking_core(scripts: dict[str, list[int]]):
    core, _ = scripted_core({})
    ex = MaskingExecutor(scripts)
    core.executor = ex
    return core, ex


def params(**structured: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=40, structured=StructuredOutputs(**structured))  # type: ignore[arg-type]


def test_request_finishes_with_stop_when_its_choice_is_complete_and_keeps_the_last_token_text() -> None:
    core, ex = masking_core({"c": encode("yes") + encode(" and more")})
    core.add_request("c", encode("hi"), params(choice=("yes", "no")))
    res = run_to_completion(core)["c"]
    assert res["text"] == "yes"
    assert res["finish_reason"] == "stop" and res["stop_reason"] is None
    assert res["tokens"] == encode("yes")


def test_mask_replaces_a_token_the_grammar_forbids() -> None:
    core, ex = masking_core({"r": encode("hello")})  # the script breaks the regex at once
    core.add_request("r", encode("hi"), params(regex="[0-9]{3}"))
    res = run_to_completion(core)["r"]
    assert res["text"] == "000" and res["finish_reason"] == "stop"
    first = ex.masks[0]
    assert first is not None and first[1][0] == set(encode("0123456789"))


def test_only_constrained_rows_get_a_mask_and_unconstrained_batches_none() -> None:
    core, ex = masking_core({"free": encode("abcdefgh"), "json": encode('{"a":1}')})
    core.add_request("free", encode("x"), SamplingParams(temperature=0.0, max_tokens=8))
    run_to_completion(core)
    assert ex.masks and all(m is None for m in ex.masks)  # no structured request yet: the plain path

    ex.masks.clear()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    core.add_request("free2", encode("x"), SamplingParams(temperature=0.0, max_tokens=12))
    core.add_request("json", encode("x"), params(json_schema=json.dumps(schema)))
    res = run_to_completion(core)
    assert json.loads(res["json"]["text"]) == {"a": 1} and res["json"]["finish_reason"] == "stop"
    constrained = [m for m in ex.masks if m is not None]
    assert constrained and all(ids == ["json"] for ids, _ in constrained)
    assert ex.masks[-1] is None  # "free2" runs on after "json" finished: no mask any more
    assert core._grammars is not None and not core._grammars.matchers


def test_eos_is_allowed_once_the_grammar_accepts_and_stops_the_request() -> None:
    core, ex = masking_core({"r": [*encode("ab"), EOS_ID]})
    core.add_request("r", encode("x"), params(regex="[a-z]+"))
    res = run_to_completion(core)["r"]
    assert res["text"] == "ab" and res["finish_reason"] == "stop"
    assert EOS_ID in ex.masks[-1][1][0]


def test_aborted_constrained_request_drops_its_matcher() -> None:
    core, _ = masking_core({"r": encode("abc")})
    core.add_request("r", encode("x"), params(regex="[a-z]{10}"))
    core.step()
    assert core._grammars is not None and "r" in core._grammars.matchers
    core.abort_requests(["r"])
    out = core.step()
    assert [o.finish_reason for o in out.outputs] == ["abort"]
    assert not core._grammars.matchers


@pytest.mark.parametrize(("structured", "field"), [
    ({"regex": "a(b"}, "structured.regex"),
    ({"json_schema": "{not json"}, "structured.json_schema"),
    ({"json_schema": "[1, 2]"}, "structured.json_schema"),
    ({"json_schema": '{"type": "nonsense"}'}, "structured.json_schema"),
    ({"grammar": "start: undefined_rule"}, "structured.grammar"),
    ({}, "structured"),
    ({"regex": "a", "choice": ("a",)}, "structured"),
])
def test_invalid_structured_output_is_refused_naming_the_field(structured: dict, field: str) -> None:
    with pytest.raises(InvalidSamplingParams) as err:
        SamplingParams(structured=StructuredOutputs(**structured)).validate()
    assert err.value.field == field


# Grammars that compile but exhaust llguidance's lexer fuel (or a parser row) at the first mask or token.
OVER_LIMITS = [
    ({"regex": "a{99999999}"}, "structured.regex"),
    ({"regex": "(ab){5000000}"}, "structured.regex"),
    ({"regex": "x|a{99999999}"}, "structured.regex"),
    ({"regex": "((a{1000}){1000}){1000}"}, "structured.regex"),
    ({"json_schema": json.dumps({"type": "string", "pattern": "^a{99999999}$"})}, "structured.json_schema"),
    ({"grammar": "start: /a{99999999}/"}, "structured.grammar"),
    ({"choice": tuple(f"option {i}" for i in range(2500))}, "structured.choice"),
]


@pytest.mark.parametrize(("structured", "field"), OVER_LIMITS)
def test_a_grammar_that_would_fail_once_generation_starts_is_refused_at_validation(structured: dict,
                                                                                  field: str) -> None:
    with pytest.raises(InvalidSamplingParams) as err:
        SamplingParams(structured=StructuredOutputs(**structured)).validate()
    assert err.value.field == field
    assert "exceeds the grammar library's limits" in str(err.value), err.value


@pytest.mark.parametrize("structured", [
    {"regex": "a{10000}"}, {"regex": "[a-z]{1,99999999}"},
    {"json_schema": json.dumps({"type": "string", "minLength": 99999999})},
    {"json_schema": json.dumps({"type": "array", "minItems": 99999999})},
    {"choice": tuple(f"option {i}" for i in range(500))},
])
def test_large_but_workable_grammars_still_pass_validation(structured: dict) -> None:
    SamplingParams(structured=StructuredOutputs(**structured)).validate()


# Past the validation probe's bytes, the forced run of b's exhausts the lexer fuel: only generation finds out.
LATE_FAILURE = f"[a-z]{{{PROBE_STEPS + 8}}}b{{99999999}}"


def test_a_grammar_that_fails_mid_generation_ends_the_request_with_an_error_not_a_stop(
        caplog: pytest.LogCaptureFixture) -> None:
    assert check_grammar("regex", LATE_FAILURE) == ""  # the probe does not see it
    core, _ = masking_core({"r": encode("x" * 60)})
    core.add_request("r", encode("hi"), params(regex=LATE_FAILURE))
    outputs = []
    with caplog.at_level(logging.WARNING, logger="asyncdp.engine.structured"):
        while core.has_unfinished():
            outputs += core.step().outputs
    last = outputs[-1]
    assert last.finished and last.finish_reason == "error"
    assert (last.error_type, last.error_field) == ("invalid_request", "structured.regex")
    assert "failed during generation" in (last.error or "") and "too many expressions" in (last.error or "")
    assert len(outputs) == PROBE_STEPS + 9  # the letters, then the first b: the request did not run on
    assert all(o.error_type is None and not o.finished for o in outputs[:-1])
    assert any("its grammar failed" in r.getMessage() and "too many expressions" in r.getMessage()
               for r in caplog.records)
    assert core._grammars is not None and not core._grammars.matchers


def test_a_grammar_failing_mid_generation_names_the_request_parameter_the_api_gave_it() -> None:
    core, _ = masking_core({"r": encode("x" * 60)})
    core.add_request("r", encode("hi"), params(regex=LATE_FAILURE, param="guided_regex"))
    outputs = []
    while core.has_unfinished():
        outputs += core.step().outputs
    last = outputs[-1]
    assert (last.finish_reason, last.error_type, last.error_field) == ("error", "invalid_request", "guided_regex")
    assert (last.error or "").startswith("guided_regex: structured.regex failed during generation")


def test_a_failure_does_not_poison_the_next_request_with_the_same_grammar() -> None:
    """llguidance shares the lexer between a template and its copies: after one request exhausts it, the cached
    template fails every later copy at its first mask, unless it is evicted."""
    either = f"{LATE_FAILURE}|0"
    core, _ = masking_core({"late": encode("x" * 60), "short": encode("0")})
    core.add_request("late", encode("hi"), params(regex=either))
    assert run_to_completion(core)["late"]["finish_reason"] == "error"
    core.add_request("short", encode("hi"), params(regex=either))
    res = run_to_completion(core)["short"]
    assert (res["text"], res["finish_reason"]) == ("0", "stop")


def test_a_failed_matcher_whose_mask_allows_only_eos_is_an_error_not_a_stop() -> None:
    core, ex = masking_core({"r": encode("abcdef")})
    core.add_request("r", encode("x"), params(regex="[a-z]{10}"))
    core.step()
    matcher = core._grammars.matchers["r"]  # type: ignore[union-attr]
    assert not matcher.consume_token(ord("0"))  # what a limit hit does: the matcher is in its error state
    res = run_to_completion(core)["r"]
    assert ex.masks[-1] is not None and ex.masks[-1][1][0] == {EOS_ID}  # the failed matcher's mask: EOS only
    assert res["tokens"][-1] == EOS_ID and res["finish_reason"] == "error"


def test_the_error_output_survives_the_wire_codec() -> None:
    import msgspec

    from asyncdp.messages import RequestOutput

    out = RequestOutput(request_id="r", finished=True, finish_reason="error", error_type="invalid_request",
                        error="structured.regex failed", error_field="structured.regex")
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(out), type=RequestOutput) == out


def test_engine_refuses_an_uncompilable_grammar_at_add_request_and_keeps_no_state() -> None:
    core, _ = masking_core({})
    with pytest.raises(InvalidSamplingParams):
        core.add_request("bad", encode("x"), params(regex="a(b"))
    assert "bad" not in core.scheduler.requests
    assert not core.has_unfinished()


def test_sim_executor_refuses_structured_requests() -> None:
    core = sim_core()
    with pytest.raises(InvalidRequestError) as err:
        core.add_request("r", encode("x"), params(choice=("a", "b")))
    assert err.value.field == "structured.choice"  # as a grammar refused at validation is named (offline LLM)


def test_structured_params_round_trip_the_wire_codec() -> None:
    import msgspec

    p = params(choice=("a", "b"))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p


# ---------------------------------------------------------------- start_after: the grammar starts after a marker

THINK_END = tuple(encode("</think>"))  # eight byte tokens: the marker spans steps


def after(marker: tuple[int, ...], max_tokens: int = 60, **structured: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens,
                          structured=StructuredOutputs(start_after=marker, **structured))  # type: ignore[arg-type]


def test_a_grammar_with_a_marker_is_free_until_the_marker_then_constrains_from_its_start() -> None:
    """The thinking (letters the regex forbids) comes out as scripted, unmasked, over several steps; from the
    token after the eight-token marker only digits are allowed, so the script's letters are replaced."""
    thinking = "hm, </think no; then </think>"
    core, ex = masking_core({"r": encode(thinking) + encode("ok")})
    core.add_request("r", encode("hi"), after(THINK_END, regex="[0-9]{3}"))
    res = run_to_completion(core)["r"]
    assert res["text"] == thinking + "000" and res["finish_reason"] == "stop"
    assert ex.masks[:len(thinking)] == [None] * len(thinking)  # the prefill's sample and every thinking token
    assert all(m is not None and m[1][0] <= set(encode("0123456789")) for m in ex.masks[len(thinking):])
    assert core._grammars is not None and not core._grammars.matchers and not core._grammars.waiting("r")


def test_a_one_token_marker_and_a_plain_request_in_the_same_batch() -> None:
    core, ex = masking_core({"r": [*encode("ab"), 1, *encode("x")], "free": encode("zzzzzz")})
    core.add_request("r", encode("hi"), after((1,), regex="[0-9]"))
    core.add_request("free", encode("hi"), SamplingParams(temperature=0.0, max_tokens=6))
    res = run_to_completion(core)
    assert res["r"]["tokens"] == [*encode("ab"), 1, ord("0")] and res["r"]["finish_reason"] == "stop"
    assert res["free"]["text"] == "zzzzzz"
    masked = [m for m in ex.masks if m is not None]
    assert [ids for ids, _ in masked] == [["r"]]  # one step: the token after the marker, for "r" only


def test_max_tokens_before_the_marker_ends_the_request_unconstrained_with_length() -> None:
    core, ex = masking_core({"r": encode("thinking on and on")})
    core.add_request("r", encode("hi"), after(THINK_END, max_tokens=10, regex="[0-9]{3}"))
    res = run_to_completion(core)["r"]
    assert (res["text"], res["finish_reason"]) == ("thinking o", "length")
    assert all(m is None for m in ex.masks)
    assert core._grammars is not None and not core._grammars.waiting("r")  # dropped with the request


def test_eos_before_the_marker_stops_the_request_as_vllm_lets_it() -> None:
    core, ex = masking_core({"r": [*encode("hm"), EOS_ID]})
    core.add_request("r", encode("hi"), after(THINK_END, regex="[0-9]{3}"))
    res = run_to_completion(core)["r"]
    assert (res["text"], res["finish_reason"]) == ("hm", "stop")
    assert all(m is None for m in ex.masks)


def test_the_marker_in_the_prompt_does_not_start_the_grammar() -> None:
    core, ex = masking_core({"r": encode("ab</think>7")})
    core.add_request("r", encode("</think>"), after(THINK_END, regex="[0-9]"))
    res = run_to_completion(core)["r"]
    assert (res["text"], res["finish_reason"]) == ("ab</think>7", "stop")
    assert sum(m is not None for m in ex.masks) == 1


def test_start_after_round_trips_the_wire_codec_and_is_validated() -> None:
    import msgspec

    p = after(THINK_END, regex="[0-9]")
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p
    assert StructuredOutputs(regex="a", start_after=[1, 2]).start_after == (1, 2)  # type: ignore[arg-type]
    with pytest.raises(InvalidSamplingParams) as err:
        after((-1,), regex="[0-9]").validate()
    assert err.value.field == "structured.start_after"


WS_SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}, "b": {
    "type": "array", "items": {"type": "integer"}}}, "required": ["a", "b"], "additionalProperties": False})
SPACED = '{ "a" : 1 , "b" : [ 2 ] }'


def test_a_whitespace_pattern_sets_the_whitespace_between_json_tokens_and_keys_the_compiled_grammar() -> None:
    """Pattern "": no mask of the request ever allows a space (outside strings: the schema has none); pattern
    " ": the spaced script passes whole. Same schema, both in one core: each gets its own compiled template."""
    compact = '{"a":1,"b":[2]}'
    core, ex = masking_core({"compact": [*encode(compact), EOS_ID], "spaced": [*encode(SPACED), EOS_ID]})
    core.add_request("compact", encode("x"), params(json_schema=WS_SCHEMA, whitespace_pattern=""))
    core.add_request("spaced", encode("x"), params(json_schema=WS_SCHEMA, whitespace_pattern=" "))
    res = run_to_completion(core)
    assert (res["compact"]["text"], res["compact"]["finish_reason"]) == (compact, "stop")
    assert (res["spaced"]["text"], res["spaced"]["finish_reason"]) == (SPACED, "stop")
    rows = [(rid, allowed) for m in ex.masks if m is not None for rid, allowed in zip(*m, strict=True)]
    assert not any(ord(" ") in allowed for rid, allowed in rows if rid == "compact")
    assert any(ord(" ") in allowed for rid, allowed in rows if rid == "spaced")
    assert core._grammars is not None and len(core._grammars._templates) == 2


def test_a_whitespace_pattern_is_ignored_with_a_regex_and_a_bad_one_is_refused_naming_it() -> None:
    with_regex = StructuredOutputs(regex="[ab]+", whitespace_pattern="(")
    assert with_regex.grammar_key() == ("regex", "[ab]+", None)
    SamplingParams(structured=with_regex).validate()  # ignored, as vLLM ignores it
    with pytest.raises(InvalidSamplingParams) as err:
        SamplingParams(structured=StructuredOutputs(json_object=True, whitespace_pattern="(")).validate()
    assert err.value.field == "structured.whitespace_pattern" and "unclosed group" in str(err.value)
