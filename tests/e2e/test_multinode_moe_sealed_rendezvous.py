"""End to end, two launches on loopback with one secret (``ASYNCDP_DP_SECRET``): a MoE group whose rank 0 is on
the head and rank 1 on a headless node forms through the sealed rendezvous store (each node derives the store's
names and keys from the secret on its own, so the group forming at all shows they agree), and a stranger that
finds the store among the head's ports reads only opaque names and sealed values: no torch key name, no rank
address."""

from __future__ import annotations

import datetime
import socket

import httpx
import pytest
import torch.distributed as dist

from tests.e2e.link_auth import listening_tcp_ports
from tests.e2e.multinode import deployment, head, headless

pytestmark = [pytest.mark.e2e]

MOE = "builtin:tiny-moe"
SECRET = "the-e2e-moe-deployment-secret"
MOE_HB = ("--dp-heartbeat-timeout-s", "30")  # as in test_multinode_moe: the head imports torch after the node joined
LOOPBACK = socket.inet_aton("127.0.0.1")


def _stores(ports: set[int]) -> list[dist.TCPStore]:
    """Those of ``ports`` that answer as a TCPStore (the others are the deployment's links, which drop us). A store
    on loopback answers in milliseconds; a link that drops us is retried by torch until the timeout (6 s cost 8.5 s
    a port), hence 2 s."""
    found = []
    for port in sorted(ports):
        try:
            found.append(dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=2)))
        except (RuntimeError, OSError):
            continue
    return found


def test_a_moe_group_across_two_nodes_forms_through_the_sealed_store_and_a_stranger_reads_nothing(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCDP_DP_SECRET", SECRET)
    specs = (head("-dp", "2", "-dpl", "1", "--api-server-count", "1", "--enable-expert-parallel", *MOE_HB),
             headless("-dp", "2", "-dpl", "1", "-dpr", "1", "--enable-expert-parallel", *MOE_HB))
    with deployment(tmp_path_factory.mktemp("moe-sealed"), *specs, model=MOE) as dep:
        info = httpx.get(f"{dep.head.base_url}/server_info", timeout=10).json()
        assert [(r["dp_rank"], r["state"]) for r in info["managed_ranks"]] == [(0, "ready"), (1, "ready")]
        (stranger,) = _stores(listening_tcp_ports([dep.head.process.pid]) - {dep.head.port, dep.rpc})
        names = stranger.list_keys()
        assert len(names) >= 4, names  # both ranks' addresses, in the default group and in the control group
        for name in names:
            assert name.startswith("asyncdp/") and "cpu" not in name, names
            assert LOOPBACK not in stranger.get(name)
        for rank in (0, 1):  # the group serves on both nodes
            r = httpx.post(f"{dep.head.base_url}/v1/completions", headers={"X-data-parallel-rank": str(rank)},
                           json={"model": MOE, "prompt": "The expert says", "max_tokens": 4}, timeout=60)
            assert r.status_code == 200, r.text
        dep.stop()
    assert not any("not authenticated" in n.log() for n in dep.nodes)
