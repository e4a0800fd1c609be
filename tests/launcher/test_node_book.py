"""The head's node book (asyncdp/launcher/node_book.py): who may join, who is ready, who is lost. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from asyncdp.config.summary import config_hash
from asyncdp.launcher.node_book import NodeBook, span
from asyncdp.messages import PROTOCOL_VERSION, Hello, NodeHello, NodeRow

SUMMARY: dict[str, Any] = {"model": "tiny", "dtype": "float32", "dp_size": 4, "enable_expert_parallel": False,
                           "dp_sync_interval": 32, "protocol_version": PROTOCOL_VERSION}


def book(mode: str = "internal", local: tuple[int, ...] = (0, 1), dp: int = 4, *, is_moe: bool = False) -> NodeBook:
    return NodeBook(dp_size=dp, mode=mode, local_ranks=local, summary=SUMMARY, host="h0", pid=100, is_moe=is_moe)


def node_hello(start: int = 2, size: int = 2, **kw: Any) -> NodeHello:
    fields: dict[str, Any] = {"start_rank": start, "size_local": size, "host": "h1", "pid": 200,
                              "protocol_version": PROTOCOL_VERSION, "config_summary": dict(SUMMARY)}
    return NodeHello(**{**fields, **kw})


def hello(rank: int, *, local: bool, headless: bool, pid: int = 300, **kw: Any) -> Hello:
    return Hello(protocol_version=kw.pop("protocol_version", PROTOCOL_VERSION), dp_rank=rank, local=local,
                 headless=headless, host=kw.pop("host", "h1"), pid=pid, **kw)


# ---------------------------------------------------------------------------------------------- span


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


@pytest.mark.parametrize("orderly", [False, True])
def test_a_dense_node_restarted_with_the_same_ranks_takes_them_back(orderly: bool) -> None:
    """Spec §13: orchestrators restart a whole node of a dense deployment. The head used to refuse it ("a running
    deployment takes no rank back"): its entry now comes back alive with the new launcher, and its engines join."""
    b = book(local=(0, 1))
    first, _ = b.admit_node(node_hello())
    assert first is not None
    for rank in (0, 1):
        assert b.engine_ready(rank, None, {}) is None
    assert b.admit_engine(hello(2, local=False, headless=True)) is None and b.engine_ready(2, None, {}) is None
    assert b.lose_node(first, orderly=orderly) == [2, 3] and b.missing() == [2, 3]
    entry, problem = b.admit_node(node_hello(pid=201))
    assert problem is None and entry is first
    assert (entry.index, entry.state, entry.pid, entry.ranks) == (1, "alive", 201, [2, 3])
    assert b.admit_engine(hello(2, local=False, headless=True, pid=301)) is None  # not "connected twice"
    assert b.engine_ready(2, None, {}) is None and b.missing() == [3]
    assert [r.state for r in b.rows()] == ["alive", "alive"]


def test_the_lost_nodes_late_engine_end_leaves_the_restarted_ones_rank_ready() -> None:
    b = book()
    first, _ = b.admit_node(node_hello())
    assert first is not None
    old = hello(2, local=False, headless=True, pid=300)
    assert b.admit_engine(old) is None and b.engine_ready(2, None, {}) is None
    b.lose_node(first)
    b.admit_node(node_hello(pid=201))
    new = hello(2, local=False, headless=True, pid=301)
    assert b.admit_engine(new) is None and b.engine_ready(2, None, {}) is None
    b.engine_gone(old)  # the lost engine's handshake link ends only now (a lost host)
    assert b.connected[2] is new and 2 in b.ready
    b.engine_gone(new)
    assert 2 not in b.connected and 2 not in b.ready


@pytest.mark.parametrize(("start", "size", "named"), [(1, 2, "rank 2"), (3, 1, "rank 3"), (2, 1, "rank 2")])
def test_a_node_overlapping_a_lost_nodes_ranks_with_other_ranks_is_refused_naming_the_flags(
        start: int, size: int, named: str) -> None:
    b = book(local=(0,))
    first, _ = b.admit_node(node_hello())
    assert first is not None
    b.lose_node(first)
    entry, problem = b.admit_node(node_hello(start=start, size=size, pid=201))
    assert entry is None and problem == (
        f"{named} left this deployment when the headless node with ranks 2..3 (h1, pid 200) was lost; a node "
        "restarted in its place must bring the same ranks, ranks 2..3 (--data-parallel-start-rank 2 "
        "--data-parallel-size-local 2)")
    assert b.admit_node(node_hello(start=1, size=1, pid=202))[1] is None  # a rank never lost still joins


def test_a_restarted_node_overlapping_a_live_node_or_with_another_configuration_is_refused() -> None:
    b = book(local=(0,))
    first, _ = b.admit_node(node_hello())
    assert first is not None
    b.lose_node(first)
    other = {**SUMMARY, "dp_sync_interval": 16}
    entry, problem = b.admit_node(node_hello(pid=201, config_summary=other))
    assert entry is None and problem is not None
    assert problem.startswith("configuration mismatch: the headless node with ranks 2..3 (h1, pid 201)")
    assert b.admit_node(node_hello(pid=202))[1] is None  # the same ranks and configuration: back
    entry, problem = b.admit_node(node_hello(pid=203))  # a second restart while the first one lives
    assert entry is None and problem is not None
    assert "overlaps the headless node with ranks 2..3 (h1, pid 202) in ranks 2..3" in problem


@pytest.mark.parametrize("orderly", [False, True])
def test_a_moe_group_takes_no_rank_back_and_says_to_restart_the_deployment(orderly: bool) -> None:
    b = book(local=(0,), is_moe=True)
    first, _ = b.admit_node(node_hello())
    assert first is not None
    b.lose_node(first, orderly=orderly)
    how = "stopped" if orderly else "was lost"
    entry, problem = b.admit_node(node_hello(pid=201))
    assert entry is None and problem == (
        f"ranks 2..3 left this deployment when the headless node with ranks 2..3 (h1, pid 200) {how}, and a "
        "running deployment takes no rank back: restart the whole deployment, head included, to serve them again")
    assert b.admit_engine(hello(2, local=False, headless=True)) == f"engine rank 2: rank 2{problem[len('ranks 2..3'):]}"


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


def test_an_engine_of_a_lost_node_needs_a_restarted_node_in_internal_mode() -> None:
    b = book()
    entry, _ = b.admit_node(node_hello())
    assert entry is not None
    b.lose_node(entry)
    assert b.admit_engine(hello(2, local=False, headless=True)) == (
        "engine rank 2: no admitted headless node brings rank 2")


def test_a_restarted_hybrid_nodes_engines_take_its_ranks_and_entry_back() -> None:
    b = book(mode="hybrid")  # a hybrid node's engines say Hello before their launcher's NodeHello
    assert b.admit_engine(hello(2, local=False, headless=False, launcher_pid=500)) is None
    assert b.admit_engine(hello(3, local=False, headless=False, launcher_pid=500)) is None
    lost = b.node_of(3)
    assert lost is not None
    b.lose_node(lost)
    assert b.admit_engine(hello(3, local=False, headless=False, pid=301, launcher_pid=501)) is None
    assert b.admit_engine(hello(2, local=False, headless=False, pid=302, launcher_pid=501)) is None
    assert [(n.index, n.role, n.pid, n.ranks, n.state) for n in b.nodes] == [
        (0, "head", 100, [0, 1], "alive"), (1, "hybrid", 501, [2, 3], "alive")]
    topology = node_hello(role="hybrid", pid=501)  # its launcher's node link, once it serves
    assert b.admit_node(topology) == (lost, None)
    moe = book(mode="hybrid", is_moe=True)
    assert moe.admit_engine(hello(3, local=False, headless=False, launcher_pid=500)) is None
    gone = moe.node_of(3)
    assert gone is not None
    moe.lose_node(gone)
    problem = moe.admit_engine(hello(3, local=False, headless=False, pid=301, launcher_pid=501))
    assert problem is not None and "a running deployment takes no rank back" in problem


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
