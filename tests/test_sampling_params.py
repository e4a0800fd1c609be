"""``SamplingParams`` and ``StructuredOutputs`` as the offline API builds them in Python: msgspec structs check no
types at construction, so vLLM's shapes are normalised there and everything else is refused by ``validate()``,
naming the field."""

from __future__ import annotations

import msgspec
import pytest

from asyncdp.errors import InvalidSamplingParams
from asyncdp.sampling_params import SamplingParams, StructuredOutputs


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
