"""``repetition_penalty`` below ``MIN_REPETITION_PENALTY`` (1e-6) is a 400: a tiny positive value (1e-40 is a
float32 subnormal, 1e-300 rounds to 0) made the penalised logits inf and the sampled distribution NaN, so every
step drew token 0 with no error. The sampler clamps too, for params that never went through ``validate()``
(tests/model/test_model_sampler_penalty_floor.py)."""

from __future__ import annotations

import pytest

from asyncdp.errors import InvalidSamplingParams
from asyncdp.sampling_params import MIN_REPETITION_PENALTY, SamplingParams
from tests.api.conftest import running


@pytest.mark.anyio
@pytest.mark.parametrize("penalty", [1e-40, 1e-300, 5e-324, 9.9e-7])
async def test_a_degenerate_repetition_penalty_is_a_400(penalty: float) -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                                         "repetition_penalty": penalty})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "repetition_penalty"
    assert not srv.fake.submitted


@pytest.mark.anyio
async def test_the_smallest_repetition_penalty_is_accepted() -> None:
    async with running() as srv:
        r = await srv.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                                         "repetition_penalty": MIN_REPETITION_PENALTY})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("penalty", [1e-40, 1e-300, 0.0])
def test_offline_params_refuse_a_degenerate_repetition_penalty(penalty: float) -> None:
    with pytest.raises(InvalidSamplingParams) as info:
        SamplingParams(repetition_penalty=penalty).validate()
    assert info.value.field == "repetition_penalty"

