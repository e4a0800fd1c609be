"""``SamplingParams`` and ``StructuredOutputs`` as the offline API builds them in Python: msgspec structs check no
types at construction, so vLLM's shapes are normalised there and everything else is refused by ``validate()``,
naming the field."""

from __future__ import annotations

import msgspec
import pytest

from asyncdp.errors import InvalidSamplingParams
from asyncdp.sampling_params import SamplingParams, StructuredOutputs, sample_seed


def test_a_stop_string_is_one_stop_string_not_its_characters():
    params = SamplingParams(stop="xyz").validate()
    assert params.stop == ("xyz",)


def test_stop_lists_become_tuples_and_survive_the_wire():
    params = SamplingParams(stop=["ab", "cd"], stop_token_ids=[3, 4]).validate()
    assert (params.stop, params.stop_token_ids) == (("ab", "cd"), (3, 4))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams) == params


@pytest.mark.parametrize("stop", [("",), (5,), ["ok", None]])
def test_a_stop_entry_that_is_not_a_non_empty_string_is_refused(stop):
    with pytest.raises(InvalidSamplingParams, match="stop must be") as err:
        SamplingParams(stop=stop).validate()
    assert err.value.field == "stop"


def test_a_choice_given_as_one_string_is_refused_naming_the_field():
    with pytest.raises(InvalidSamplingParams, match="structured.choice must be a list or tuple of strings") as err:
        SamplingParams(structured=StructuredOutputs(choice="yes")).validate()
    assert err.value.field == "structured.choice"


def test_a_choice_list_is_kept_as_a_tuple():
    assert StructuredOutputs(choice=["yes", "no"]).choice == ("yes", "no")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("temperature", "0.5", r"temperature must be a number, got '0.5'"),
    ("temperature", True, r"temperature must be a number, got True"),
    ("top_p", None, r"top_p must be a number"),
    ("max_tokens", 2.5, r"max_tokens must be an integer or None, got 2.5"),  # refused, never rounded
    ("max_tokens", True, r"max_tokens must be an integer or None, got True"),
    ("n", 2.0, r"n must be an integer, got 2.0"),
    ("seed", "1", r"seed must be an integer or None"),
    ("logprobs", False, r"logprobs must be an integer or None"),
    ("ignore_eos", 1, r"ignore_eos must be a bool"),
    ("stop_token_ids", (1.5,), r"stop_token_ids must be a list of integer token ids"),
    ("logit_bias", {"5": 10.0}, r"logit_bias must be a dict \{token_id: bias\}"),
    ("logit_bias", {5: "10"}, r"logit_bias must be a dict \{token_id: bias\}"),
    ("structured", {"regex": "a"}, r"structured must be a StructuredOutputs or None"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_field(field, value, message):
    with pytest.raises(InvalidSamplingParams, match=message) as err:
        SamplingParams(**{field: value}).validate()
    assert err.value.field == field


def test_logit_bias_as_vllms_dict_becomes_sorted_pairs():
    params = SamplingParams(logit_bias={7: -1.0, 5: 10}).validate()
    assert params.logit_bias == ((5, 10), (7, -1.0))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams).logit_bias == params.logit_bias


def test_a_json_schema_dict_is_serialised_as_vllms_json_argument():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    structured = StructuredOutputs(json_schema=schema)
    assert structured.json_schema == '{"type": "object", "properties": {"a": {"type": "integer"}}}'


@pytest.mark.parametrize(("kwargs", "field"), [({"json_schema": {"a": {1, 2}}}, "structured.json_schema"),
                                               ({"regex": 5}, "structured.regex"),
                                               ({"json_object": "yes"}, "structured.json_object")])
def test_a_structured_field_of_the_wrong_type_is_refused_naming_it(kwargs, field):
    with pytest.raises(InvalidSamplingParams, match=f"{field} must be") as err:
        SamplingParams(structured=StructuredOutputs(**kwargs)).validate()
    assert err.value.field == field


@pytest.mark.parametrize(("seed", "index", "expected"), [
    (None, 3, None), (5, 0, 5), (5, 2, 7), (2**64 - 1, 1, 0), (2**64 - 2, 3, 1), (-(2**63), 1, -(2**63) + 1)])
def test_sample_seeds_are_seed_plus_index_wrapped_into_64_bits(seed, index, expected):
    assert sample_seed(seed, index) == expected
    if expected is not None:
        SamplingParams(seed=expected).validate()
