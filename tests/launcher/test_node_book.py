"""The head's node book (asyncdp/launcher/node_book.py): who may join, who is ready, who is lost. Pure."""

from __future__ import annotations

import pytest

from asyncdp.config.summary import config_hash
from asyncdp.launcher.node_book import span
from asyncdp.messages import PROTOCOL_VERSION, NodeRow
from tests.launcher.node_books import SUMMARY, book, hello, node_hello


@pytest.mark.parametrize(("ranks", "text"), [([], "no ranks"), ([2], "rank 2"), ([3, 2], "ranks 2..3"),
                                             ([0, 2, 3], "ranks 0, 2, 3")])
def test_span_names_ranks_as_a_range_when_contiguous(ranks: list[int], text: str) -> None:
    assert span(ranks) == text


# ---------------------------------------------------------------------------------------------- admit_node


def test_admit_node_accepts_disjoint_in_range_ranks_with_the_heads_configuration() -> None:
    b = book()
    entry, problem = b.admit_node(node_hello())
    assert problem is None and entry is not None
    assert (entry.index, entry.role, entry.host, entry.pid, entry.ranks) == (1, "headless", "h1", 200, [2, 3])
    assert b.node_of(3) is entry and b.node_of(0) is b.nodes[0]


def test_admit_node_refuses_ranks_overlapping_the_heads_by_name() -> None:
    entry, problem = book().admit_node(node_hello(start=1, size=2))
    assert entry is None
    assert problem is not None and "overlaps the head node with ranks 0..1" in problem and "in rank 1" in problem


def test_admit_node_refuses_ranks_overlapping_an_earlier_headless_node() -> None:
    b = book(local=(0,))
    assert b.admit_node(node_hello(start=1, size=2))[1] is None
    entry, problem = b.admit_node(node_hello(start=2, size=2, pid=201))
    assert entry is None and problem is not None
    assert "overlaps the headless node with ranks 1..2 (h1, pid 200) in rank 2" in problem


@pytest.mark.parametrize(("start", "size"), [(3, 2), (-1, 2), (4, 1), (2, 0)])
def test_admit_node_refuses_ranks_outside_the_deployment(start: int, size: int) -> None:
    entry, problem = book().admit_node(node_hello(start=start, size=size))
    assert entry is None and problem is not None and "outside the deployment's ranks [0, 4)" in problem


def test_admit_node_mismatch_names_every_differing_field() -> None:
    other = {**SUMMARY, "dp_sync_interval": 16, "enable_expert_parallel": True}
    entry, problem = book().admit_node(node_hello(config_summary=other))
    assert entry is None and problem is not None
    assert problem.startswith("configuration mismatch: the headless node with ranks 2..3")
    assert "enable_expert_parallel=True vs False" in problem and "dp_sync_interval=16 vs 32" in problem
    assert "model=" not in problem and "dtype=" not in problem


def test_admit_node_mismatch_names_a_field_the_node_lacks() -> None:
    partial = {k: v for k, v in SUMMARY.items() if k != "dtype"}
    _, problem = book().admit_node(node_hello(config_summary=partial))
    assert problem is not None and "dtype=<missing> vs float32" in problem


def test_admit_node_refuses_another_protocol_version() -> None:
    entry, problem = book().admit_node(node_hello(protocol_version=PROTOCOL_VERSION + 1))
    assert entry is None and problem is not None
    assert f"protocol_version {PROTOCOL_VERSION + 1}, the head {PROTOCOL_VERSION}" in problem


@pytest.mark.parametrize("mode", ["hybrid", "external", "single"])
def test_admit_node_refuses_headless_nodes_outside_internal_mode(mode: str) -> None:
    entry, problem = book(mode=mode).admit_node(node_hello())
    assert entry is None and problem is not None
    assert f"joined a {mode}-LB deployment" in problem and "internal-LB" in problem


def test_a_refused_node_is_not_recorded() -> None:
    b = book()
    b.admit_node(node_hello(start=1))
    assert [n.index for n in b.nodes] == [0]


# ---------------------------------------------------------------------------------------------- admit_engine


def test_admit_engine_accepts_local_ranks_and_ranks_of_an_admitted_headless_node() -> None:
    b = book()
    b.admit_node(node_hello())
    assert b.admit_engine(hello(0, local=True, headless=False)) is None
    assert b.admit_engine(hello(2, local=False, headless=True)) is None
    assert set(b.connected) == {0, 2}


@pytest.mark.parametrize("rank", [-1, 4, 10])
def test_admit_engine_refuses_a_rank_out_of_range_e5(rank: int) -> None:
    problem = book().admit_engine(hello(rank, local=False, headless=True))
    assert problem == f"engine rank {rank}: dp_rank {rank} is outside [0, 4)"


def test_admit_engine_refuses_a_duplicate_rank_naming_both_connections_e4() -> None:
    b = book()
    assert b.admit_engine(hello(1, local=True, headless=False, pid=301, host="h0")) is None
    problem = b.admit_engine(hello(1, local=True, headless=False, pid=302, host="h0"))
    assert problem == ("engine rank 1: dp_rank 1 connected twice (first from h0, pid 301; again from h0, "
                       "pid 302)")


def test_admit_engine_refuses_another_protocol_version() -> None:
    problem = book().admit_engine(hello(0, local=True, headless=False, protocol_version=PROTOCOL_VERSION + 1))
    assert problem == f"engine rank 0: protocol_version {PROTOCOL_VERSION + 1} != {PROTOCOL_VERSION}"


def test_admit_engine_refuses_a_local_remote_mismatch_both_ways() -> None:
    b = book()
    b.admit_node(node_hello())
    assert b.admit_engine(hello(0, local=False, headless=True)) == (
        "engine rank 0: connected with local=False, but rank 0 runs on the head")
    assert b.admit_engine(hello(2, local=True, headless=False)) == (
        "engine rank 2: connected with local=True, but rank 2 runs on another node")


def test_admit_engine_refuses_a_wrong_headless_flag() -> None:
    b = book()
    b.admit_node(node_hello())
    p1 = b.admit_engine(hello(2, local=False, headless=False))
    assert p1 is not None and "headless=False" in p1 and "expects headless=True" in p1
    p2 = b.admit_engine(hello(0, local=True, headless=True))
    assert p2 is not None and "expects headless=False" in p2


def test_admit_engine_refuses_a_remote_rank_no_admitted_node_brings_in_internal_mode() -> None:
    b = book()
    assert b.admit_engine(hello(3, local=False, headless=True)) == (
        "engine rank 3: no admitted headless node brings rank 3")
    assert 3 not in b.connected


def test_hybrid_remote_engines_are_grouped_into_nodes_by_launcher_pid() -> None:
    b = book(mode="hybrid")
    assert b.admit_engine(hello(3, local=False, headless=False, launcher_pid=500)) is None
    assert b.admit_engine(hello(2, local=False, headless=False, launcher_pid=500)) is None
    assert b.admit_engine(hello(0, local=True, headless=False)) is None
    assert [(n.index, n.role, n.pid, n.ranks) for n in b.nodes] == [(0, "head", 100, [0, 1]),
                                                                   (1, "hybrid", 500, [2, 3])]


# ---------------------------------------------------------------------------------------------- engine_ready


def test_engine_ready_records_ranks_without_a_hash_unchecked() -> None:
    b = book()
    assert b.engine_ready(1, None, {"anything": 1}) is None
    assert b.ready == {1}


def test_engine_ready_mismatch_with_rank_0_names_the_fields_e6_in_either_order() -> None:
    other = {**SUMMARY, "dp_sync_interval": 8}
    b = book()
    assert b.engine_ready(1, config_hash(other), other) is None  # before rank 0: nothing to compare yet
    problem = b.engine_ready(0, config_hash(SUMMARY), SUMMARY)
    assert problem == "configuration mismatch: engine rank 1 differs from rank 0 in dp_sync_interval=8 vs 32"
    b2 = book()
    assert b2.engine_ready(0, config_hash(SUMMARY), SUMMARY) is None
    assert b2.engine_ready(1, config_hash(other), other) == problem
    assert 1 not in b2.ready


def test_engine_ready_agreeing_ranks_are_all_ready_and_missing_shrinks() -> None:
    b = book()
    rank0 = hello(0, local=True, headless=False)
    assert b.admit_engine(rank0) is None
    for r in (2, 0, 1):
        assert b.engine_ready(r, config_hash(SUMMARY), SUMMARY) is None
    assert b.missing() == [3]
    b.engine_gone(rank0)
    assert b.missing() == [0, 3]


# ---------------------------------------------------------------------------------------------- loss, views


def test_lose_node_marks_it_lost_and_its_ranks_not_ready() -> None:
    b = book()
    entry, _ = b.admit_node(node_hello())
    assert entry is not None
    for r in range(4):
        b.engine_ready(r, None, {})
    assert b.lose_node(entry) == [2, 3]
    assert entry.state == "lost" and b.missing() == [2, 3] and b.node_of(2) is None


def test_lose_node_after_node_shutdown_is_stopped_not_lost() -> None:
    b = book()
    entry, _ = b.admit_node(node_hello())
    assert entry is not None
    b.lose_node(entry, orderly=True)
    assert entry.state == "stopped"


def test_waiting_line_names_ranks_not_ready_and_those_not_connected() -> None:
    b = book()
    b.admit_node(node_hello())
    b.admit_engine(hello(0, local=True, headless=False))
    b.engine_ready(0, None, {})
    b.admit_engine(hello(2, local=False, headless=True))
    assert b.waiting_line() == "ranks 1..3 not ready; ranks 1, 3 not connected yet"
    for r in (1, 3):
        b.connected[r] = hello(r, local=r < 2, headless=r >= 2)
    assert b.waiting_line() == "ranks 1..3 not ready"


def test_timeout_line_names_the_ranks_that_never_arrived_and_the_node_to_start_e9() -> None:
    b = book(local=(0,), dp=3)
    b.admit_engine(hello(0, local=True, headless=False))
    assert b.timeout_line(10.0, "10.0.0.1", 29550) == (
        "ranks 0..2 not ready; ranks 1..2 not connected yet after --engine-ready-timeout-s (10 s): ranks 1..2 never "
        "arrived; start the headless node that runs ranks 1..2 (--headless --data-parallel-start-rank 1) with "
        "-dpa 10.0.0.1 -dpp 29550, or raise --engine-ready-timeout-s if they start slowly")


def test_timeout_line_names_the_launch_of_the_deployments_mode_and_never_the_heads_own_ranks() -> None:
    line = book(mode="hybrid", local=(0, 1)).timeout_line(600.0, "h", 1)
    assert "ranks 2..3 never arrived; start the hybrid node that runs ranks 2..3 (--data-parallel-hybrid-lb " \
           "--data-parallel-start-rank 2) with -dpa h -dpp 1" in line, line


def test_timeout_line_says_ranks_that_connected_are_slow() -> None:
    b = book(local=(0, 1), dp=2)
    for r in (0, 1):
        b.admit_engine(hello(r, local=True, headless=False))
    b.engine_ready(0, None, {})
    assert b.timeout_line(5.0, "h", 1) == ("rank 1 not ready after --engine-ready-timeout-s (5 s): raise it if "
                                           "they only load slowly, or see their logs")


def test_rows_list_every_node_for_server_info() -> None:
    b = book()
    entry, _ = b.admit_node(node_hello())
    assert entry is not None
    b.lose_node(entry)
    assert b.rows() == [NodeRow(node=0, role="head", host="h0", pid=100, ranks=[0, 1], state="alive"),
                        NodeRow(node=1, role="headless", host="h1", pid=200, ranks=[2, 3], state="lost")]


def test_an_api_only_head_has_an_empty_node_of_its_own() -> None:
    b = book(local=(), dp=2)
    entry, problem = b.admit_node(node_hello(start=0, size=2))
    assert problem is None and entry is not None
    assert b.rows()[0].ranks == [] and b.node_of(0) is entry


def test_a_hybrid_node_joining_after_its_engines_completes_their_entry_with_its_processes() -> None:
    from asyncdp.messages import ProcessRow

    b = book(mode="hybrid")
    assert b.admit_engine(hello(2, local=False, headless=False, launcher_pid=500)) is None
    api = ProcessRow(role="api_server", rank=None, client_index=0, pid=500, host="h1", ports={})
    entry, problem = b.admit_node(node_hello(role="hybrid", pid=500, processes=[api]))
    assert problem is None and entry is not None
    assert [(n.index, n.role, n.pid, n.ranks) for n in b.nodes] == [(0, "head", 100, [0, 1]),
                                                                   (1, "hybrid", 500, [2, 3])]
    assert entry.processes == [api]


def test_a_hybrid_node_overlapping_another_launchs_ranks_or_of_another_mode_is_refused() -> None:
    b = book(mode="hybrid")
    assert b.admit_engine(hello(2, local=False, headless=False, launcher_pid=500)) is None
    entry, problem = b.admit_node(node_hello(role="hybrid", pid=600))  # ranks 2..3 came from launcher 500
    assert entry is None and problem is not None and "overlaps" in problem and "pid 500" in problem
    entry, problem = b.admit_node(node_hello(start=2, size=1, role="external", pid=700))
    assert entry is None and problem is not None and "every node must use the same LB mode" in problem
