"""End to end: a MoE rank server started with other flags than rank 0's is refused before it joins the DP group
(spec §4.2 E6, §5.3; tests/launcher/test_engine_config_check.py for the book's side).

An external-LB rank server (or a hybrid node, or a multi-port supervisor's child) handshakes its engines with the
head directly; the head used to compare their configuration only at ``Ready``, after the engines had joined the
group's rendezvous. A rank with another ``-dp`` then failed with a traceback (``ValueError: DP group member 1/2
does not match rank 1/3``), and one with another ``--dp-sync-interval`` joined the group and died of a mismatched
gloo collective (``terminate called ... EnforceNotMet``, exit -6) while the group was torn down. Now the engine's
``Hello`` carries its launch's configuration and the head refuses it by field at once: both servers exit 1 within
seconds, each naming the mismatch, without a traceback. A headless node is checked the same way, at its
``NodeHello``, before it starts an engine: one with another ``--scheduling-policy`` than the head's is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.multinode import Deployment, head, headless, start, wait_code

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MOE = "builtin:tiny-moe"
EXIT_WITHIN_S = 60.0  # the refusal comes before any model is loaded: seconds on a loaded 2-core machine


async def _both_exit_1(dep: Deployment) -> str:
    """Wait for every node of ``dep`` to exit, assert each exited 1 and left no process behind; their logs."""
    try:
        dep.remember_trees()
        codes = [await wait_code(node, EXIT_WITHIN_S, dep) for node in dep.nodes]
        left = dep.wait_gone(10.0)
    finally:
        dep.kill_all()
    logs = dep.logs()
    assert codes == [1] * len(dep.nodes), logs
    assert not left, logs
    return logs


@pytest.mark.parametrize(("flags", "field"), [
    (("-dp", "3"), "dp_size=3 vs 2"),
    (("-dp", "2", "--dp-sync-interval", "16"), "dp_sync_interval=16 vs 32"),
])
async def test_a_rank_server_with_other_flags_is_refused_by_field_before_it_joins_the_group(
        tmp_path: Path, flags: tuple[str, ...], field: str) -> None:
    dep = start(tmp_path, [head("-dp", "2", "--data-parallel-rank", "0", name="rank0"),
                           head(*flags, "--data-parallel-rank", "1", name="rank1")], model=MOE)
    logs = await _both_exit_1(dep)
    rank0, rank1 = (node.log() for node in dep.nodes)
    refusal = rf"configuration mismatch: engine rank 1 \(.*\) differs from the head in {re.escape(field)}"
    assert re.search(f"rank 1: the front-end refused the handshake: {refusal}", rank1), logs
    assert re.search(f"startup failed: handshake with engine rank 1: {refusal}", rank0), logs
    for text in (rank0, rank1):
        assert "Traceback" not in text and "terminate called" not in text and "code -6" not in text, logs


async def test_a_headless_node_with_another_scheduling_policy_is_refused_by_field(tmp_path: Path) -> None:
    """An API-only head that accepts ``priority`` (its API servers check it against the head's flag) and a headless
    node whose engines refuse it used to serve together (every ``priority: 5`` a 400 from the engine): now both exit
    1 at the node's NodeHello, before any engine starts, naming the field (this node's value first)."""
    dep = start(tmp_path, [head("-dp", "2", "-dpl", "0", "--scheduling-policy", "priority"),
                           headless("-dp", "2", "-dpl", "2")])
    logs = await _both_exit_1(dep)
    refusal = ("configuration mismatch: the headless node with ranks 0..1 (.*) differs from the head in "
               "scheduling_policy=fcfs vs priority")
    for node in dep.nodes:
        assert re.search(refusal, node.log()), logs
        assert "Traceback" not in node.log(), logs
