"""End to end: a hybrid-LB node (``--data-parallel-hybrid-lb``, its own endpoint over its own ranks) SIGKILLed and
restarted with the same command line takes its ranks back, while the head's endpoint serves throughout (spec §13:
orchestrators restart a whole node of a dense deployment; docs/howto/hybrid-lb.md, "When a node fails").

Two nodes on loopback, ``-dp 4 -dpl 2``: the head (ranks 0..1, the coordinator, the handshake listener) and
``node1`` (ranks 2..3 behind its own port). Requests go to the head all along from a background task; every one
must succeed.
"""

from __future__ import annotations

import signal
import time
from functools import partial
from pathlib import Path

import anyio
import httpx
import pytest

from tests.e2e.conftest import MODEL, Server
from tests.e2e.multinode import Deployment, deployment, head, kill_tree, relaunch, wait_server_info

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

HYBRID = ("-dp", "4", "-dpl", "2", "--data-parallel-hybrid-lb")  # (with one local rank, hybrid is external LB)
HEAD = head(*HYBRID, "-dpr", "0", name="head")
NODE1 = head(*HYBRID, "-dpr", "2", name="node1")


async def _keep_asking(http: httpx.AsyncClient, first: anyio.Event, stop: anyio.Event, statuses: list[int]) -> None:
    """Completions on the head's endpoint, one after the other, until ``stop``; ``first`` once one was answered."""
    while not stop.is_set():
        r = await http.post("/v1/completions", json={"model": MODEL, "prompt": f"meanwhile {len(statuses)}",
                                                     "max_tokens": 2})
        statuses.append(r.status_code)
        first.set()


async def _wait_healthy(node: Server, timeout_s: float, dep: Deployment) -> None:
    async with httpx.AsyncClient(base_url=node.base_url, timeout=2.0) as http:
        with anyio.move_on_after(timeout_s):
            while True:
                try:
                    if (await http.get("/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass  # not listening yet
                if node.process.poll() is not None:
                    pytest.fail(f"the restarted node exited with {node.process.returncode}\n{dep.logs()}")
                await anyio.sleep(0.2)
    pytest.fail(f"the restarted node not healthy within {timeout_s} s\n{dep.logs()}")


async def test_a_hybrid_node_sigkilled_and_restarted_with_the_same_command_takes_its_rank_back(tmp_path: Path) -> None:
    """The head sees node1 lost, then alive again with the new launcher's pid and its engines; node1's own endpoint
    answers again (official ``openai`` client) with its ranks ready in its /server_info; no request to the head
    failed meanwhile. Prints how long the restarted node took from its start to serving."""
    with deployment(tmp_path, HEAD, NODE1, ready_timeout_s=120) as dep:
        hd, n1 = dep.node("head"), dep.node("node1")
        statuses: list[int] = []
        first, stop = anyio.Event(), anyio.Event()
        async with httpx.AsyncClient(base_url=hd.base_url, timeout=30.0) as http:
            with anyio.fail_after(150):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(partial(_keep_asking, http, first, stop, statuses))
                    await first.wait()
                    kill_tree(n1)
                    dep.drop("node1")
                    await wait_server_info(http, dep, "nodes", ["alive", "lost"], 15)
                    before = len(statuses)  # answered while node1 was up, or lost
                    started = time.monotonic()
                    again = relaunch(n1, tmp_path / "node1-again.log", dep.model)
                    dep.nodes.append(again)  # stopped with the head at the end, and checked the same way
                    dep.specs.append(NODE1)
                    await _wait_healthy(again, 90, dep)
                    took_s = time.monotonic() - started
                    info = await wait_server_info(http, dep, "nodes", ["alive", "alive"], 30)
                    stop.set()
            assert len(statuses) > before > 0 and set(statuses) == {200}, statuses
            assert [n["pid"] for n in sorted(info["nodes"], key=lambda n: n["node"])] == [hd.process.pid,
                                                                                        again.process.pid]
            engines = sorted((p["rank"], p["node"]) for p in info["processes"] if p["role"] == "engine")
            assert engines == [(0, 0), (1, 0), (2, 1), (3, 1)], info["processes"]
        assert again.port == n1.port  # the same command line, its port included
        async with httpx.AsyncClient(base_url=again.base_url, timeout=30.0) as http:
            own = (await http.get("/server_info")).json()
            assert [(r["dp_rank"], r["state"]) for r in own["managed_ranks"]] == [(2, "ready"), (3, "ready")], own
        async with again.openai() as client:
            for i in range(3):
                done = await client.completions.create(model=MODEL, prompt=f"back {i}", max_tokens=3)
                assert done.choices[0].finish_reason == "length"
        assert "ready again" in hd.log(), dep.logs()
        print(f"\nhybrid rejoin: node1 serving {took_s:.1f} s after its restart; {len(statuses)} requests to the "
              "head meanwhile, all 200")
        dep.stop()


async def test_a_hybrid_node_stopped_on_its_own_signal_is_a_stop_at_the_head_not_a_loss(tmp_path: Path) -> None:
    """node1 gets SIGTERM alone: it says ``NodeStopping``, drains, says ``NodeStopped`` and exits 0; the head logs
    that it is stopping and then "stopped in order" at INFO, and shows it ``stopped``. The head used to log ERROR
    "lost the hybrid node ...: its node link closed" for this orderly stop (only headless nodes said so)."""
    with deployment(tmp_path, HEAD, NODE1, ready_timeout_s=120) as dep:
        hd, n1 = dep.node("head"), dep.node("node1")
        async with httpx.AsyncClient(base_url=hd.base_url, timeout=30.0) as http:
            n1.process.send_signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(partial(n1.process.wait, timeout=30)) == 0, n1.log()[-4000:]
            dep.drop("node1")
            await wait_server_info(http, dep, "nodes", ["alive", "stopped"], 15)
            r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "still here", "max_tokens": 2})
            assert r.status_code == 200, r.text
        log = hd.log()
        assert "is stopping (a signal to the node)" in log and "stopped in order" in log, dep.logs()
        assert "lost the hybrid node" not in log and "lost the" not in log, dep.logs()
        assert "engine rank 2 left in order" in log and "engine rank 2 lost" not in log, dep.logs()
        dep.stop()
