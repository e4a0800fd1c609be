"""The launch table (spec §3.4, §5.1, §5.4, §11) on the derivation vectors of §3.5, one per mode, plus invariants
over sets of node launches: every rank is started by exactly one node, every managed rank somewhere."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from asyncdp.cli import build_serve_config
from asyncdp.launcher.plan import API_SERVER, COORDINATOR, ENGINE, SERVER, LaunchTable, plan


@dataclass(frozen=True)
class Facts:
    is_moe: bool = True
    num_experts: int = 8


def table(cmd: str, *, moe: bool = True) -> LaunchTable:
    config = build_serve_config(shlex.split(cmd), env={}, model_facts=lambda _name: Facts(moe, 8 if moe else 0))
    assert config.deployment is not None
    return plan(config.deployment)


def roles(t: LaunchTable) -> list[str]:
    return [p.role for p in t.processes]


def links(t: LaunchTable) -> dict[str, tuple[str, str, str | None, int]]:
    return {link.name: (link.action, link.transport, link.host, link.port) for link in t.links}


def test_single_mode_is_one_in_process_api_server_and_one_engine_without_coordinator():
    t = table("")
    assert (t.mode, t.top, t.coordinator, t.rendezvous_here) == ("single", "api_server", "none", False)
    assert roles(t) == [API_SERVER, ENGINE]
    assert t.api_servers[0].in_process and t.api_servers[0].managed_ranks == (0,)
    assert links(t)["handshake"] == ("bind", "unix", None, 0)


def test_internal_dp4_starts_coordinator_then_four_api_servers_then_four_engines():
    t = table("-dp 4")
    assert (t.mode, t.top, t.coordinator, t.rendezvous_here, t.client_count) == ("internal", "launcher", "here",
                                                                                 True, 4)
    assert roles(t) == [COORDINATOR] + [API_SERVER] * 4 + [ENGINE] * 4
    assert [p.client_index for p in t.api_servers] == [0, 1, 2, 3]
    assert all(p.managed_ranks == (0, 1, 2, 3) and not p.in_process for p in t.api_servers)
    assert t.engine_ranks == (0, 1, 2, 3) and [p.local_index for p in t.role(ENGINE)] == [0, 1, 2, 3]
    assert [p.name for p in t.role(ENGINE)] == [f"asyncdp-engine-dp{r}" for r in range(4)]
    assert all(link.transport == "unix" for link in t.links)  # everything on this host
    assert t.stop_order == (API_SERVER, ENGINE, COORDINATOR)  # front-ends drain first (spec §12.5)


def test_internal_dp4_with_one_api_server_runs_it_in_the_launcher():
    t = table("-dp 4 --api-server-count 1")
    assert t.top == "api_server" and roles(t) == [COORDINATOR, API_SERVER] + [ENGINE] * 4
    assert t.api_servers[0].in_process and t.api_servers[0].log_prefix == "APIServer"


def test_dense_internal_dp_starts_a_coordinator_for_stats_but_hosts_no_rendezvous():
    t = table("-dp 2", moe=False)
    assert (t.coordinator, t.rendezvous_here) == ("here", False)


def test_multi_node_head_binds_the_handshake_on_the_rpc_port_and_tcp_links_for_remote_engines():
    t = table("-dp 4 -dpl 2 -dpa H -dpp 13345")
    assert (t.mode, t.top, t.coordinator, t.rendezvous_here) == ("internal", "launcher", "here", True)
    assert t.engine_ranks == (0, 1) and len(t.api_servers) == 4
    assert all(p.managed_ranks == (0, 1, 2, 3) for p in t.api_servers)  # the head's clients route to all ranks
    ls = links(t)
    assert ls["handshake"] == ("bind", "tcp", "H", 13345)
    assert ls["client"] == ("bind", "tcp", "H", 0)  # port 0: the binder reports the real port
    assert ls["coordinator_engine"] == ("bind", "tcp", "H", 0)
    assert ls["coordinator_client"] == ("bind", "unix", None, 0)  # internal mode: every client is on the head


def test_headless_node_starts_only_its_engines_and_joins_the_head():
    t = table("--headless -dp 4 -dpl 2 -dpr 2 -dpa H -dpp 13345")
    assert (t.mode, t.top, t.coordinator, t.rendezvous_here, t.client_count) == ("headless", "headless", "remote",
                                                                                 False, 0)
    assert roles(t) == [ENGINE, ENGINE] and t.engine_ranks == (2, 3)
    assert [p.local_index for p in t.role(ENGINE)] == [0, 1]
    assert links(t) == {"node": ("connect", "tcp", "H", 13345), "handshake": ("connect", "tcp", "H", 13345)}
    assert all(link.crosses_nodes for link in t.links)


def test_api_only_head_starts_coordinator_and_api_servers_but_no_engine():
    t = table("-dp 4 -dpl 0")
    assert roles(t) == [COORDINATOR] + [API_SERVER] * 4 and t.engine_ranks == ()
    assert t.rendezvous_here and links(t)["handshake"][:2] == ("bind", "tcp")
    assert all(p.managed_ranks == (0, 1, 2, 3) for p in t.api_servers)


def test_hybrid_node_0_manages_its_local_ranks_and_hosts_the_coordinator_on_tcp():
    t = table("-dp 4 -dpl 2 -dpr 0")
    assert (t.mode, t.coordinator, t.rendezvous_here) == ("hybrid", "here", True)
    assert roles(t) == [COORDINATOR, API_SERVER, API_SERVER, ENGINE, ENGINE]
    assert all(p.managed_ranks == (0, 1) for p in t.api_servers) and t.engine_ranks == (0, 1)
    ls = links(t)
    assert ls["client"] == ("bind", "unix", None, 0)  # its API servers manage local engines only
    assert ls["coordinator_client"][:2] == ("bind", "tcp")  # other nodes' API servers subscribe over TCP
    assert ls["handshake"][:2] == ("bind", "tcp")


def test_hybrid_node_with_start_rank_2_joins_the_head_and_handshakes_its_engines_locally_too():
    t = table("-dp 4 -dpl 2 -dpr 2 --data-parallel-hybrid-lb")
    assert (t.mode, t.coordinator, t.rendezvous_here) == ("hybrid", "remote", False)
    assert roles(t) == [API_SERVER, API_SERVER, ENGINE, ENGINE]
    assert all(p.managed_ranks == (2, 3) for p in t.api_servers) and t.engine_ranks == (2, 3)
    assert all(p.handshakes == ("handshake", "local_handshake") for p in t.role(ENGINE))  # spec §5.4
    ls = links(t)
    assert ls["handshake"][:2] == ("connect", "tcp") and ls["local_handshake"] == ("bind", "unix", None, 0)
    assert ls["coordinator_client"] == ("connect", "tcp", "127.0.0.1", 0)  # address learned from EngineReady


def test_start_rank_0_with_every_rank_local_is_internal():
    t = table("-dp 4 -dpl 4 -dpr 0")
    assert t.mode == "internal" and t.engine_ranks == (0, 1, 2, 3)
    assert all(link.transport == "unix" for link in t.links)


def test_hybrid_with_one_local_rank_runs_as_external_rank_3_without_coordinator():
    t = table("-dp 4 -dpl 1 -dpr 3")
    assert (t.mode, t.top, t.coordinator) == ("external", "api_server", "remote")
    assert roles(t) == [API_SERVER, ENGINE] and t.api_servers[0].managed_ranks == (3,)


def test_external_rank_1_manages_its_one_engine_and_learns_the_coordinator():
    t = table("-dp 2 --data-parallel-rank 1")
    assert (t.mode, t.coordinator, t.rendezvous_here) == ("external", "remote", False)
    assert t.engine_ranks == (1,) and t.api_servers[0].managed_ranks == (1,)
    assert links(t)["handshake"][:2] == ("connect", "tcp")


def test_external_rank_0_with_four_api_servers_hosts_coordinator_and_rendezvous():
    t = table("-dp 2 --data-parallel-rank 0 --api-server-count 4")
    assert (t.mode, t.top, t.coordinator, t.rendezvous_here) == ("external", "launcher", "here", True)
    assert roles(t) == [COORDINATOR] + [API_SERVER] * 4 + [ENGINE]
    assert all(p.managed_ranks == (0,) for p in t.api_servers)
    ls = links(t)
    assert ls["handshake"][:2] == ("bind", "tcp") and ls["coordinator_engine"][:2] == ("bind", "tcp")
    assert ls["coordinator_client"][:2] == ("bind", "tcp")


def test_multi_port_supervisor_starts_one_server_per_rank_on_consecutive_ports():
    t = table("-dp 8 -dpl 4 --node-rank 1 -dpm --port 8000")
    assert (t.mode, t.top, t.coordinator, t.client_count) == ("multi-port", "supervisor", "none", 0)
    assert roles(t) == [SERVER] * 4 and t.engine_ranks == (4, 5, 6, 7)
    assert [(p.name, p.port) for p in t.processes] == [(f"asyncdp-api-dp{4 + i}", 8000 + i) for i in range(4)]
    assert [c.mode for c in t.children] == ["external"] * 4
    assert [c.engine_ranks for c in t.children] == [(4,), (5,), (6,), (7,)]
    assert all(c.coordinator == "remote" for c in t.children)  # rank 0's child hosts it, on another node


def test_multi_port_rank_0_child_hosts_the_coordinator():
    t = table("-dp 4 -dpl 2 -dpm --port 9000")
    assert [c.coordinator for c in t.children] == ["here", "remote"]


def test_nnodes_head_and_headless_node_split_the_ranks():
    head = table("-dp 4 --nnodes 2 --node-rank 0")
    node = table("--headless -dp 4 --nnodes 2 --node-rank 1")
    assert (head.mode, head.engine_ranks, head.coordinator) == ("internal", (0, 1), "here")
    assert (node.mode, node.engine_ranks, node.coordinator) == ("headless", (2, 3), "remote")


# ---------------------------------------------------------------- invariants over a set of node launches


def _launches(kind: str, nodes: int, per_node: int, api: int | None) -> list[LaunchTable]:
    dp = nodes * per_node
    asc = "" if api is None else f" --api-server-count {api}"
    if kind == "internal":  # a head plus headless nodes
        cmds = [f"-dp {dp} -dpl {per_node}{asc}"] + [f"--headless -dp {dp} -dpl {per_node} -dpr {n * per_node}"
                                                     for n in range(1, nodes)]
    elif kind == "nnodes":
        cmds = [f"-dp {dp} --nnodes {nodes} --node-rank 0{asc}"] + [f"--headless -dp {dp} --nnodes {nodes} "
                                                                    f"--node-rank {n}" for n in range(1, nodes)]
    elif kind == "hybrid":
        cmds = [f"-dp {dp} -dpl {per_node} -dpr {n * per_node} --data-parallel-hybrid-lb{asc}"
                for n in range(nodes)]
    else:  # external: one endpoint per rank
        cmds = [f"-dp {dp} --data-parallel-rank {r}{asc}" for r in range(dp)]
    return [table(cmd) for cmd in cmds]


node_sets = st.tuples(st.sampled_from(["internal", "nnodes", "hybrid", "external"]), st.integers(1, 4),
                      st.integers(1, 3), st.one_of(st.none(), st.integers(1, 3))).filter(
    lambda s: s[1] * s[2] > 1 and not (s[0] == "hybrid" and s[2] == 1 and s[1] > 1))


@given(node_sets)
def test_every_rank_is_started_by_exactly_one_node(spec):
    kind, nodes, per_node, api = spec
    started = [r for t in _launches(kind, nodes, per_node, api) for r in t.engine_ranks]
    assert sorted(started) == list(range(nodes * per_node))


@given(node_sets)
def test_every_managed_rank_is_started_somewhere_and_one_node_hosts_the_coordinator(spec):
    kind, nodes, per_node, api = spec
    tables = _launches(kind, nodes, per_node, api)
    started = {r for t in tables for r in t.engine_ranks}
    assert {r for t in tables for p in t.api_servers for r in p.managed_ranks} <= started
    assert sum(t.coordinator == "here" for t in tables) == 1
    assert sum(t.rendezvous_here for t in tables) == 1  # MoE with dp > 1: one store, on the rank-0 node
    for t in tables:  # a node that does not host the coordinator learns it from its engines
        assert t.coordinator in ("here", "remote")
        assert [p.client_index for p in t.api_servers] == list(range(t.client_count))


@given(st.integers(2, 4), st.integers(2, 4))
def test_multi_port_supervisors_of_every_node_start_every_rank_once(nodes, per_node):
    dp = nodes * per_node
    tables = [table(f"-dp {dp} -dpl {per_node} --node-rank {n} -dpm --port {9000 + 100 * n}") for n in range(nodes)]
    assert sorted(r for t in tables for r in t.engine_ranks) == list(range(dp))
    assert sum(c.coordinator == "here" for t in tables for c in t.children) == 1
