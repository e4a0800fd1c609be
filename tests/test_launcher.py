"""Launcher decisions that need no processes: the MoE configuration agreement check (E6), the HTTP bind (E11)."""

import socket

import pytest

from asyncdp.config import EngineConfig, parallel_config_summary
from asyncdp.errors import StartupError
from asyncdp.launcher import bind_http_socket, check_config_agreement


def summary(**changes):
    base = dict(model_identity="tiny-moe@abc", dp_size=2, enable_expert_parallel=True, num_experts=8,
                sync_interval=32, prefill_schedule_interval=1, max_model_len=2048, protocol_version=1)
    base.update(changes)
    return parallel_config_summary(EngineConfig(), **base)


def test_agreeing_ranks_pass_in_any_order():
    seen: dict = {}
    assert check_config_agreement(seen, 1, summary()) is None  # rank 0 not seen yet: nothing to compare
    assert check_config_agreement(seen, 0, summary()) is None
    assert check_config_agreement(seen, 2, summary()) is None


def test_a_rank_that_differs_from_rank_0_is_named_with_the_field():
    seen: dict = {}
    assert check_config_agreement(seen, 0, summary()) is None
    problem = check_config_agreement(seen, 1, summary(sync_interval=8))
    assert problem is not None
    assert "engine rank 1 differs from rank 0" in problem and "dp_sync_interval=8 vs 32" in problem


def test_a_mismatch_recorded_before_rank_0_reports_when_rank_0_arrives():
    seen: dict = {}
    assert check_config_agreement(seen, 1, summary(enable_expert_parallel=False)) is None
    problem = check_config_agreement(seen, 0, summary())
    assert problem is not None and "engine rank 1" in problem and "enable_expert_parallel" in problem


def test_a_busy_http_port_fails_before_anything_starts():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind_http_socket("127.0.0.1", port)
