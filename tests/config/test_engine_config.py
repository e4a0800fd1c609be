"""``EngineConfig.validate()``: what the offline ``LLM(**engine_args)`` and the simulation harness build in Python
(no flag parser in between), so every field is checked there, naming the field."""

from __future__ import annotations

import math

import pytest

from asyncdp.config.flags import EngineConfig, SimCostProfile
from asyncdp.errors import ConfigError
from asyncdp.testing import open_sim_cluster


@pytest.mark.parametrize("cost", [SimCostProfile(a_ms=-50.0), SimCostProfile(d_ms_per_kv_token=-1e-9),
                                  SimCostProfile(b_ms_per_token=math.nan), SimCostProfile(c_ms_per_seq=math.inf)])
def test_a_negative_or_non_finite_sim_cost_is_refused_naming_the_field(cost):
    with pytest.raises(ConfigError, match=r"sim_cost \(--sim-cost\) must be .*non-negative"):
        EngineConfig(executor="sim", sim_cost=cost).validate()


def test_a_sim_cost_that_is_not_a_profile_is_refused():
    with pytest.raises(ConfigError, match="sim_cost"):
        EngineConfig(executor="sim", sim_cost={"a_ms": 1.0}).validate()  # type: ignore[arg-type]


def test_a_valid_sim_cost_is_accepted():
    cost = SimCostProfile(1.0, 0.5, 0.25, 0.0, 0.001)
    assert EngineConfig(executor="sim", sim_cost=cost).validate().sim_cost == cost


@pytest.mark.anyio
async def test_the_simulation_harness_refuses_a_negative_sim_cost():
    config = EngineConfig(executor="sim", sim_cost=SimCostProfile(a_ms=-5.0), num_kv_blocks=64)
    with pytest.raises(ConfigError, match="sim_cost"):
        async with open_sim_cluster(dp_size=1, engine_config=config):
            pass


@pytest.mark.parametrize(("field", "value", "message"), [
    ("max_num_seqs", "8", r"max_num_seqs \(--max-num-seqs\) must be int \(got '8'\)"),
    ("max_num_seqs", 8.0, r"max_num_seqs \(--max-num-seqs\) must be int"),
    ("block_size", True, r"block_size \(--block-size\) must be int"),
    ("max_model_len", "64", r"max_model_len \(--max-model-len\) must be int or None"),
    ("enable_prefix_caching", 1, r"enable_prefix_caching \(--enable-prefix-caching\) must be bool"),
    ("tokenizer", 5, r"tokenizer \(--tokenizer\) must be str or None"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_the_keyword(field, value, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(**{field: value}).validate()


def test_values_of_the_right_types_are_accepted():
    config = EngineConfig(max_num_seqs=8, max_model_len=None, tokenizer=None, enable_prefix_caching=False)
    assert config.validate() is config
