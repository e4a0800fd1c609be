"""``SamplingParams.validate()`` accepts the types nearly every params has at once (``_has_plain_types``) and checks
field by field only otherwise: the same verdict, the same error naming the same field, for every mix of types."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncdp.errors import InvalidSamplingParams
from asyncdp.sampling_params import SamplingParams

ODD = st.one_of(st.booleans(), st.none(), st.text(max_size=2), st.just([1]), st.just(()), st.just((1,)),
                st.just(((1, 0.5),)), st.just({3: 1.0}), st.just(1 + 0j), st.just(math.nan))
INTS = st.one_of(st.integers(-3, 40), ODD)
NUMBERS = st.one_of(st.floats(-3, 3), st.integers(-3, 3), ODD)
BOOLS = st.one_of(st.booleans(), ODD)

FIELDS = {
    **{name: INTS for name in ("n", "top_k", "min_tokens", "seed", "max_tokens", "logprobs", "prompt_logprobs")},
    **{name: NUMBERS for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                  "repetition_penalty")},
    **{name: BOOLS for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                                "spaces_between_special_tokens")},
    "stop_token_ids": st.one_of(st.just(()), st.lists(st.integers(-1, 3), max_size=2), ODD),
    "logit_bias": st.one_of(st.just(()), st.just({1: 0.5}), ODD),
    "stop": st.one_of(st.just(()), st.text(max_size=2), ODD),
}


def verdict(params: SamplingParams) -> tuple[str, str | None]:
    try:
        params.validate()
    except InvalidSamplingParams as exc:
        return str(exc), exc.field
    except Exception as exc:  # noqa: BLE001 - compared, whatever it is
        return f"{type(exc).__name__}: {exc}", None
    return "ok", None


@given(st.fixed_dictionaries({}, optional=FIELDS))
def test_the_fast_type_check_gives_the_full_checks_verdict(kwargs):
    try:
        params = SamplingParams(**kwargs)
    except (TypeError, ValueError):
        return  # refused at construction (__post_init__), before any check
    fast = verdict(params)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SamplingParams, "_has_plain_types", lambda self: False)
        full = verdict(params)
    assert fast == full


def test_plain_params_take_the_fast_check_and_odd_ones_the_full_one():
    assert SamplingParams(max_tokens=1, temperature=0, seed=5, logprobs=2)._has_plain_types()
    assert not SamplingParams(temperature=True)._has_plain_types()
    assert not SamplingParams(stop_token_ids=[3])._has_plain_types()
    assert not SamplingParams(logit_bias={3: 1.0})._has_plain_types()
