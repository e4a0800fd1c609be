"""An engine's ``Hello`` carries its launch's configuration, and the front-end refuses a rank configured otherwise
before ``HandshakeInit`` (spec §4.2 E6, §5.3): before the engine joins the DP group, whose collectives would
mismatch first (tests/e2e/test_rank_config_mismatch.py shows what that did to a MoE group). Pure, and the role."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncdp import messages as m
from asyncdp.config.roles import LaunchPlan, engine_role
from asyncdp.launcher.node import book_for
from tests.config.command_lines import DENSE, serve
from tests.config.test_roles import launch_plan
from tests.launcher.node_books import SUMMARY, book, hello, node_hello


def test_an_external_rank_configured_otherwise_is_refused_at_hello_naming_every_field() -> None:
    b = book(mode="external", local=(0,), dp=2, is_moe=True)
    other = {**SUMMARY, "dp_size": 3, "dp_sync_interval": 16}
    problem = b.admit_engine(hello(1, local=False, headless=False, config_summary=other))
    assert problem == ("configuration mismatch: engine rank 1 (h1, pid 300) differs from the head in "
                       "dp_size=3 vs 4, dp_sync_interval=16 vs 32")
    assert 1 not in b.connected  # refused: the rank may come again, configured right


def test_a_rank_with_the_heads_configuration_is_admitted() -> None:
    b = book(mode="hybrid", local=(0, 1))
    assert b.admit_engine(hello(2, local=False, headless=False, config_summary=dict(SUMMARY))) is None
    assert 2 in b.connected


def test_a_hello_without_a_configuration_is_left_to_the_ready_check() -> None:
    b = book(mode="external", local=(0,), dp=2)
    assert b.admit_engine(hello(1, local=False, headless=False)) is None


def test_a_hybrid_nodes_own_front_end_names_itself() -> None:
    own = dataclasses.replace(book(mode="hybrid", local=(2, 3)), role="hybrid")
    problem = own.admit_engine(hello(2, local=True, headless=False, config_summary={**SUMMARY, "model": "other"}))
    assert problem is not None and "differs from this node's front-end in model=other vs tiny" in problem


def test_engine_role_carries_the_launch_summary_to_the_engine_across_the_control_channel() -> None:
    plan = launch_plan("-dp 2 --data-parallel-rank 1")
    role = engine_role(plan, 1, handshake_addr="tcp:h:1", torch_threads=1, config_summary=SUMMARY)
    assert role.config_summary == SUMMARY
    hello_msg = m.WorkerHello(role=role, name="asyncdp-engine-dp1", parent_pid=1)
    assert m.decode_control(m.encode(hello_msg)) == hello_msg
    assert engine_role(plan, 1, handshake_addr="tcp:h:1", torch_threads=1).config_summary == {}


@dataclass(frozen=True)
class _Facts:
    max_position_embeddings: int = 512
    num_experts: int = 0


def _launch_summary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cmd: str) -> tuple[LaunchPlan, dict]:
    """The plan and ``NodeHello`` summary of ``asyncdp serve <dense model> cmd`` (the model's facts injected)."""
    import asyncdp.model as model
    from asyncdp.launcher.launch_plan import plan_from_config, plan_summary

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(model, "resolve_model", lambda name: tmp_path)
    monkeypatch.setattr(model, "read_model_info", lambda path: _Facts())
    monkeypatch.setattr(model, "resolve_tokenizer", lambda tok, path: path)
    plan = plan_from_config(serve(cmd, DENSE))
    return plan, plan_summary(plan)


@pytest.mark.parametrize(("head_policy", "node_policy"), [("priority", "fcfs"), ("fcfs", "priority")])
def test_a_headless_node_scheduling_otherwise_than_the_head_is_refused_by_field(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, head_policy: str, node_policy: str) -> None:
    """The API servers check a request's ``priority`` against the head's --scheduling-policy, the engines schedule
    (and refuse) by their own launch's. An API-only head with ``priority`` and a headless node with ``fcfs`` served
    together: the API accepted ``priority: 5`` and every rank refused it (a 400 from the engine; with ranks of both
    policies, 200 or 400 by the rank the balancer picked). The reverse refused every priority at the API while the
    ranks preempted by another rule than the head's. Now the head refuses the node, naming the field."""
    head_plan, head_summary = _launch_summary(monkeypatch, tmp_path, f"-dp 2 -dpl 0 --scheduling-policy {head_policy}")
    _, node_summary = _launch_summary(monkeypatch, tmp_path,
                                      f"-dp 2 -dpl 2 --headless --scheduling-policy {node_policy}")
    b = book_for(head_plan, head_summary)
    entry, problem = b.admit_node(node_hello(start=0, size=2, config_summary=node_summary))
    assert entry is None
    assert problem == ("configuration mismatch: the headless node with ranks 0..1 (h1, pid 200) differs from the "
                       f"head in scheduling_policy={node_policy} vs {head_policy}")
    assert b.admit_node(node_hello(start=0, size=2, config_summary=head_summary))[1] is None  # agreeing: joins
