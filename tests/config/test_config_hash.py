"""The lockstep agreement check (spec §5.3 config hash, E6): summary fields, hash stability, mismatch messages."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncdp.config.flags import EngineConfig
from asyncdp.config.summary import (
    CONFIG_SUMMARY_FIELDS,
    config_hash,
    config_mismatch_message,
    parallel_config_summary,
)
from asyncdp.messages import PROTOCOL_VERSION


def summary(engine: EngineConfig | None = None, **overrides: object) -> dict[str, str | int | bool]:
    args: dict[str, object] = dict(
        model_identity="builtin:tiny-moe@3f2a", dp_size=4, enable_expert_parallel=True, num_experts=8,
        sync_interval=32, prefill_schedule_interval=1, max_model_len=512, protocol_version=PROTOCOL_VERSION)
    args.update(overrides)
    return parallel_config_summary(engine or EngineConfig(dtype="bfloat16", block_size=16), **args)  # type: ignore[arg-type]


# A different value of the right type for every field, to change one field at a time.
OTHER: dict[str, str | int | bool] = {
    "model": "builtin:tiny-moe@9999", "dtype": "float16", "quantization": "fp8", "dp_size": 8, "tp_size": 2,
    "pp_size": 2, "enable_expert_parallel": False, "num_experts": 16, "dp_sync_interval": 8,
    "prefill_schedule_interval": 4, "max_model_len": 1024, "block_size": 32, "scheduling_policy": "priority",
    "protocol_version": 99,
}


def test_summary_holds_every_lockstep_setting_in_readable_form():
    s = summary(EngineConfig(dtype="float16", block_size=32, scheduling_policy="priority"), tp_size=2, pp_size=1,
                sync_interval=16, prefill_schedule_interval=3, max_model_len=2048)
    assert tuple(s) == CONFIG_SUMMARY_FIELDS
    assert s == {
        "model": "builtin:tiny-moe@3f2a", "dtype": "float16", "quantization": "none", "dp_size": 4, "tp_size": 2,
        "pp_size": 1, "enable_expert_parallel": True, "num_experts": 8, "dp_sync_interval": 16,
        "prefill_schedule_interval": 3, "max_model_len": 2048, "block_size": 32, "scheduling_policy": "priority",
        "protocol_version": PROTOCOL_VERSION,
    }


def test_summary_defaults_tp_and_pp_to_one():
    s = summary()
    assert (s["tp_size"], s["pp_size"]) == (1, 1)


def test_summary_ignores_engine_settings_that_need_not_agree():
    base = EngineConfig(dtype="bfloat16")
    other = base.replace(max_num_seqs=3, seed=7, kv_cache_memory_bytes=1 << 20, torch_threads=1)
    assert summary(base) == summary(other)


def test_hash_is_a_short_hex_digest_independent_of_key_order():
    s = summary()
    digest = config_hash(s)
    assert re.fullmatch(r"[0-9a-f]{32}", digest)
    assert config_hash(dict(reversed(list(s.items())))) == digest
    assert config_hash(dict(s)) == digest


def test_hash_is_pinned_so_mixed_builds_agree():
    # Ranks of one deployment may run different asyncdp builds; changing the hash scheme must be deliberate
    # (and bump PROTOCOL_VERSION). The value was checked with `b2sum -l 128` over the sorted, spaceless JSON.
    fixed: dict[str, str | int | bool] = {
        "model": "m", "dtype": "float32", "quantization": "none", "dp_size": 2, "tp_size": 1, "pp_size": 1,
        "enable_expert_parallel": False, "num_experts": 4, "dp_sync_interval": 32, "prefill_schedule_interval": 1,
        "max_model_len": 256, "block_size": 16, "protocol_version": 1,
    }
    assert config_hash(fixed) == "67ed7404e2cb707d3711089af41ec994"


@pytest.mark.parametrize("name", CONFIG_SUMMARY_FIELDS)
def test_changing_any_one_field_changes_the_hash_and_is_named(name):
    base = summary()
    changed = dict(base, **{name: OTHER[name]})
    assert config_hash(changed) != config_hash(base)
    assert config_mismatch_message(3, changed, base) == (
        f"configuration mismatch: engine rank 3 differs from rank 0 in {name}={OTHER[name]} vs {base[name]}")


def test_bool_and_int_of_equal_value_hash_and_compare_as_different():
    base = {"enable_expert_parallel": True, "num_experts": 1}
    swapped = {"enable_expert_parallel": 1, "num_experts": True}
    assert config_hash(base) != config_hash(swapped)
    message = config_mismatch_message(1, swapped, base)
    assert "enable_expert_parallel=1 vs True" in message
    assert "num_experts=True vs 1" in message


@given(st.sets(st.sampled_from(CONFIG_SUMMARY_FIELDS)), st.integers(1, 1023))
def test_message_lists_exactly_the_differing_fields_in_summary_order(changed_fields, dp_rank):
    base = summary()
    other = {name: (OTHER[name] if name in changed_fields else value) for name, value in base.items()}
    assert (config_hash(other) == config_hash(base)) == (not changed_fields)
    message = config_mismatch_message(dp_rank, other, base)
    assert message.startswith(f"configuration mismatch: engine rank {dp_rank} differs from rank 0 in ")
    if changed_fields:
        named = re.findall(r"(?:in |, )(\w+)=", message)
        assert named == [f for f in CONFIG_SUMMARY_FIELDS if f in changed_fields]


def test_field_present_on_one_side_only_is_reported_as_missing():
    base = summary()
    older = {k: v for k, v in base.items() if k != "dp_sync_interval"}
    newer = dict(base, future_knob=3)
    assert config_mismatch_message(2, older, base) == (
        "configuration mismatch: engine rank 2 differs from rank 0 in dp_sync_interval=<missing> vs 32")
    assert config_mismatch_message(2, newer, base) == (
        "configuration mismatch: engine rank 2 differs from rank 0 in future_knob=3 vs <missing>")


def test_values_that_would_read_ambiguously_are_quoted():
    base = summary(model_identity="my model, rev 1")
    other = summary(model_identity="")
    assert config_mismatch_message(1, other, base) == (
        "configuration mismatch: engine rank 1 differs from rank 0 in model='' vs 'my model, rev 1'")


def test_equal_summaries_with_different_hashes_still_give_a_message():
    s = summary()
    message = config_mismatch_message(5, s, dict(s))
    assert message.startswith("configuration mismatch: engine rank 5 differs from rank 0 in config_hash only")
