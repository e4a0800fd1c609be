"""Sampling parameters are validated once, where they are built: the API server (``asyncdp.api.params``) before it
sends them to a rank, the offline ``LLM`` before it adds them to its core, the simulation harness before it hands
them to its clients. A rank trusts the params that come over a link (it validated them a second time: 4-8 % of an
engine's CPU on a zero-cost model); ``EngineCore.add_request`` called alone still validates them."""

from __future__ import annotations

import pytest
import trio
from test_rank_dense import open_rank

from asyncdp import LLM
from asyncdp.errors import InvalidRequestError, InvalidSamplingParams
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import open_sim_cluster
from asyncdp.testing import sim_rank_core as sim_core


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> list[SamplingParams]:
    """Every ``SamplingParams.validate()`` call, by the params it checked."""
    calls: list[SamplingParams] = []
    real = SamplingParams.validate

    def counted(self: SamplingParams) -> SamplingParams:
        calls.append(self)
        return real(self)

    monkeypatch.setattr(SamplingParams, "validate", counted)
    return calls


@pytest.mark.trio
async def test_a_rank_does_not_validate_the_params_a_client_sent(autojump_clock, validations):
    async with open_rank() as (_, client, _, _, _):
        with trio.fail_after(30):
            res = await client.add(0, "r", max_tokens=3)
            await res.done.wait()
    assert len(res.tokens) == 3
    assert validations == []  # the rank called validate() once per request


def test_the_offline_llm_validates_each_params_once(validations):
    params = [SamplingParams(max_tokens=2), SamplingParams(max_tokens=3, n=2, seed=1)]
    with LLM("builtin:tiny-dense", executor="sim", num_kv_blocks=64) as llm:
        validations.clear()
        outs = llm.generate(["a", "b"], params)
        assert validations == params  # once each: the core validated each sequence's params again (three more)
        with pytest.raises(InvalidSamplingParams) as err:
            llm.generate("a", SamplingParams(top_p=0.0))
    assert [len(c.token_ids) for o in outs for c in o.outputs] == [2, 3, 3]
    assert err.value.field == "top_p"


def test_the_core_alone_still_validates(validations):
    core = sim_core()
    with pytest.raises(InvalidSamplingParams):
        core.add_request("a", [1, 2], SamplingParams(top_p=0.0))
    core.add_request("b", [1, 2], SamplingParams(), validated=True)
    assert len(validations) == 1


@pytest.mark.anyio
async def test_the_harness_refuses_invalid_params_before_a_rank_sees_them(anyio_backend, validations):
    async with open_sim_cluster(1, 1) as cluster:
        with pytest.raises(InvalidRequestError) as err:
            await cluster.complete(0, [1, 2, 3], SamplingParams(temperature=-1.0))
        assert err.value.field == "temperature"
        outs = await cluster.complete(0, [1, 2, 3], SamplingParams(max_tokens=2))
    assert sum(len(o.new_token_ids) for o in outs) == 2
    assert len(validations) == 2  # once each, by the harness
