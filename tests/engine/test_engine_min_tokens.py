"""The engine refuses ``min_tokens`` larger than the room the prompt leaves in ``max_model_len`` (the offline
API's path; the HTTP routes refuse it first): before, it clamped max_tokens to the room and stopped there,
short of the minimum, without a word."""

from __future__ import annotations

import pytest
from engine_testing import sim_core

from asyncdp.errors import InvalidRequestError
from asyncdp.sampling_params import SamplingParams


def test_the_engine_refuses_min_tokens_beyond_the_context_offline() -> None:
    core = sim_core(max_model_len=16)
    with pytest.raises(InvalidRequestError, match=r"min_tokens \(20\) cannot exceed the 12 tokens") as info:
        core.add_request("a", [1] * 4, SamplingParams(max_tokens=None, min_tokens=20))
    assert info.value.field == "min_tokens"
    core.add_request("b", [1] * 4, SamplingParams(max_tokens=None, min_tokens=12))
