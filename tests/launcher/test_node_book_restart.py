"""The head's node book when a node is lost or stopped and restarted in its place: a dense deployment takes
its ranks back, a MoE group does not, and a restarted node must bring the same ranks (asyncdp/launcher/node_book.py)."""

from __future__ import annotations

import pytest

from tests.launcher.node_books import SUMMARY, book, hello, node_hello


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
