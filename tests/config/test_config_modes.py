"""Mode derivation (spec §3), driven by real command lines: the §3.5 test vectors (mode, ranks, API servers,
coordinator), the vectors rejected, addresses, managed ranks, and the multi-port children's ranks, ports and
device ids."""

from __future__ import annotations

import pytest

from tests.config.command_lines import DENSE, MOE, deploy, fails

# ---------------------------------------------------------------- §3.5 test vectors


TABLE = [
    # command line, mode, rank, local, API servers, coordinator here
    ("-dp 4", "internal", 0, 4, 4, True),
    ("-dp 4 --api-server-count 1", "internal", 0, 4, 1, True),
    ("-dp 4 -dpl 2 -dpa H -dpp 13345", "internal", 0, 2, 4, True),
    ("--headless -dp 4 -dpl 2 -dpr 2 -dpa H -dpp 13345", "headless", 2, 2, 0, False),
    ("-dp 4 -dpl 0", "internal", 0, 0, 4, True),
    ("-dp 4 -dpl 2 -dpr 0", "hybrid", 0, 2, 2, True),
    ("-dp 4 -dpl 2 -dpr 2 --data-parallel-hybrid-lb", "hybrid", 2, 2, 2, False),
    ("-dp 4 -dpl 4 -dpr 0", "internal", 0, 4, 4, True),
    ("-dp 4 -dpl 1 -dpr 3", "external", 3, 1, 1, False),
    ("-dp 2 --data-parallel-rank 1", "external", 1, 1, 1, False),
    ("-dp 2 --data-parallel-rank 0 --api-server-count 4", "external", 0, 1, 4, True),
    ("-dp 4 --nnodes 2 --node-rank 0", "internal", 0, 2, 4, True),
    ("--headless -dp 4 --nnodes 2 --node-rank 1", "headless", 2, 2, 0, False),
]


@pytest.mark.parametrize(("cmd", "mode", "rank", "local", "api_servers", "coordinator"), TABLE)
def test_derivation_vector_gives_mode_ranks_servers_and_coordinator(cmd, mode, rank, local, api_servers,
                                                                    coordinator):
    d = deploy(cmd)
    assert (d.mode, d.dp_start_rank, d.dp_size_local, d.api_server_count, d.coordinator_here) == (
        mode, rank, local, api_servers, coordinator)


def test_multi_port_vector_spawns_children_for_ranks_4_to_7_on_consecutive_ports():
    d = deploy("-dp 8 -dpl 4 --node-rank 1 -dpm --port 8000")
    assert (d.mode, d.dp_start_rank, d.api_server_count, d.coordinator_here) == ("multi-port", 4, 1, False)
    children = [(c.port, c.deployment.mode, c.deployment.dp_rank, c.deployment.api_server_count)
                for c in d.children]
    assert children == [(8000 + i, "external", 4 + i, 1) for i in range(4)]


@pytest.mark.parametrize(("cmd", "facts", "rule"), [
    ("-dp 4 --nnodes 2 --node-rank 1", MOE, "only the head (rank 0) runs API servers"),  # V25
    ("-dp 2 --data-parallel-rank 1", DENSE, "non-MoE models do not support external"),  # V9
    ("-dp 4 -dpl 1 -dpr 1", DENSE, "(hybrid LB with --data-parallel-size-local 1 is external LB)"),  # V9b
    ("-dp 4 -dpl 2 -dpr 3", MOE, "--data-parallel-start-rank 3 plus --data-parallel-size-local 2 exceeds"),  # V17
])
def test_derivation_vector_rejected(cmd, facts, rule):
    assert rule in fails(cmd, facts)


def test_internal_head_uses_given_address_and_rpc_port():
    d = deploy("-dp 4 -dpl 2 -dpa H -dpp 13345")
    assert (d.data_parallel_address, d.data_parallel_rpc_port) == ("H", 13345)


def test_address_falls_back_to_master_addr_then_loopback():
    assert deploy("-dp 2 --master-addr 10.1.2.3").data_parallel_address == "10.1.2.3"
    d = deploy("-dp 2")
    assert (d.data_parallel_address, d.data_parallel_rpc_port) == ("127.0.0.1", 29550)


@pytest.mark.parametrize(("cmd", "managed"), [
    ("-dp 4", (0, 1, 2, 3)),
    ("-dp 4 -dpl 2 -dpr 2 -dph", (2, 3)),
    ("-dp 2 --data-parallel-rank 1", (1,)),
    ("", (0,)),
    ("--headless -dp 4 -dpl 2 -dpr 2", ()),
])
def test_managed_ranks_follow_the_mode(cmd, managed):
    assert deploy(cmd).managed_ranks == managed


def test_single_mode_without_dp_flags():
    d = deploy("")
    assert (d.mode, d.dp_size, d.api_server_count, d.coordinator_here, d.local_ranks) == ("single", 1, 1, False, (0,))


def test_dense_internal_dp_is_accepted_with_coordinator_for_stats_only():
    d = deploy("-dp 2", DENSE)
    assert (d.mode, d.coordinator_here, d.waves) == ("internal", True, False)


def test_hybrid_with_one_local_rank_switches_to_external_with_a_warning():
    d = deploy("-dp 4 -dpl 1 -dpr 3")
    assert d.external and not d.hybrid
    assert any("switching to external" in w for w in d.warnings)


def test_api_server_count_zero_means_headless():
    d = deploy("-dp 4 -dpl 2 -dpr 2 --api-server-count 0")
    assert (d.mode, d.headless, d.api_server_count) == ("headless", True, 0)


# ---------------------------------------------------------------- multi-port children


def test_multi_port_child_rank_and_port_follow_the_start_rank():
    d = deploy("-dp 16 -dpl 4 -dpr 8 -dpm --port 8000")
    assert (d.children[2].port, d.children[2].deployment.dp_rank) == (8002, 10)


def test_multi_port_children_slice_device_ids_and_rank_zero_child_runs_coordinator():
    d = deploy("-dp 4 -dpl 2 -dpm -tp 2 --device-ids 4,5,6,7")
    assert [c.device_ids for c in d.children] == [(4, 5), (6, 7)]
    assert [c.deployment.coordinator_here for c in d.children] == [True, False]
    assert deploy("-dp 4 -dpl 2 -dpm -tp 2").children[1].device_ids == (2, 3)
