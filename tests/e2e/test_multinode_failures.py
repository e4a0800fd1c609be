"""End to end: launch order, shutdown, node loss and refused joins across nodes (issue 8, spec §5.3, §12.5, §13).

Each test runs its own small deployment (``-dp 2``: one rank on the head, one on a headless node), because each
ends it (the MoE node loss is in test_multinode_moe.py, on that module's deployment). "Killing a node" means
SIGKILL of every process of its tree as recorded from /proc (children lead their own sessions, so one process
group does not cover a node).
"""

from __future__ import annotations

import os
import signal
import time
from functools import partial
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest

from tests.e2e.conftest import MODEL, Server
from tests.e2e.metrics_text import per_engine, read_metrics, successes
from tests.e2e.multinode import (
    Deployment,
    deployment,
    head,
    headless,
    kill_tree,
    launch_node,
    start,
    stream_completion,
    wait_code,
    wait_healthy,
    wait_server_info,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

HEAD = head("-dp", "2", "-dpl", "1")
HEADLESS = headless("-dp", "2", "-dpl", "1", "-dpr", "1")
DRAIN = 48  # tokens: short enough to finish within --shutdown-timeout 5 on a loaded CPU


async def _sigterm_during_pinned_stream(tg: anyio.abc.TaskGroup, http: httpx.AsyncClient, dep: Deployment,
                                        node: Server, out: list[tuple[object, ...]], max_tokens: int) -> None:
    """Start a stream pinned to rank 1 in ``tg`` (its outcome goes to ``out``); once its first token arrived, with
    every node's process tree remembered (the no-orphans check), SIGTERM ``node``."""
    started = anyio.Event()
    tg.start_soon(partial(stream_completion, http, started, out, data_parallel_rank=1, max_tokens=max_tokens))
    await started.wait()
    dep.remember_trees()
    node.process.send_signal(signal.SIGTERM)


async def test_headless_node_started_first_waits_and_joins_and_sigterm_drains_across_nodes(tmp_path: Path) -> None:
    """Launch order does not matter; SIGTERM on the head with --shutdown-timeout 5 lets a stream on the headless
    rank finish, then stops the whole deployment in order: the headless node gets NodeShutdown and exits 0."""
    specs = (headless("-dp", "2", "-dpl", "1", "-dpr", "1", "--shutdown-timeout", "5"),
             head("-dp", "2", "-dpl", "1", "--shutdown-timeout", "5"))
    with deployment(tmp_path, *specs, wait_before=("headless",)) as dep:
        hl, hd = dep.node("headless"), dep.node("head")
        assert "joined the head" in hl.log()
        out: list[tuple[object, ...]] = []
        async with httpx.AsyncClient(base_url=hd.base_url, timeout=60.0) as http:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    await _sigterm_during_pinned_stream(tg, http, dep, hd, out, DRAIN)
        assert out == [("done", DRAIN, "length")], f"{out}\n{dep.logs()}"
        codes = [await wait_code(hd, 20, dep), await wait_code(hl, 20, dep)]
        assert codes == [0, 0], f"exit codes head, headless: {codes}\n{dep.logs()}"
        assert "shuts the deployment down" in hl.log(), dep.logs()
        dep.assert_clean()


async def test_sigkilled_head_tree_makes_the_headless_node_exit_nonzero_within_10s(tmp_path: Path) -> None:
    with deployment(tmp_path, HEAD, HEADLESS) as dep:
        hl = dep.node("headless")
        hl.remember_tree()
        kill_tree(dep.node("head"))
        code = await wait_code(hl, 10, dep)
        assert code != 0
        assert "lost the head front-end" in hl.log(), dep.logs()
        left = await anyio.to_thread.run_sync(dep.wait_gone, 5.0)
        assert not left, f"left after the head died: {left}\n{dep.logs()}"


@pytest.mark.parametrize("kill", ["tree", "launcher"])
async def test_sigkilled_headless_node_leaves_the_balancer_and_the_head_keeps_serving(tmp_path: Path,
                                                                                     kill: str) -> None:
    """Dense: in-flight requests on the lost rank fail with an error (no hang), new requests succeed on rank 0,
    /server_info shows rank 1 dead and its node lost, /health stays 200. ``launcher``: only the node's launcher
    is killed; its engine gets SIGTERM from the kernel (and EOF on its control channel) and may abort its
    requests itself before it goes: they still fail with an error naming the rank, never a 200 cut short."""
    with deployment(tmp_path, HEAD, HEADLESS, ready_timeout_s=120) as dep:
        hd, hl = dep.node("head"), dep.node("headless")
        out: list[tuple[object, ...]] = []
        async with httpx.AsyncClient(base_url=hd.base_url, timeout=30.0) as http:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    events = [anyio.Event() for _ in range(2)]
                    for ev in events:
                        tg.start_soon(partial(stream_completion, http, ev, out, data_parallel_rank=1))
                    for ev in events:
                        await ev.wait()
                    if kill == "tree":
                        kill_tree(hl)
                    else:
                        hl.remember_tree()
                        hl.process.send_signal(signal.SIGKILL)
            assert len(out) == 2, out
            assert all(o[0] == "error" and "engine rank 1" in str(o[1]) for o in out), out
            with anyio.fail_after(15):  # within the heartbeat timeout (EOF: at once)
                while True:
                    info = (await http.get("/server_info")).json()
                    if [r["state"] for r in info["managed_ranks"]] == ["ready", "dead"]:
                        break
                    await anyio.sleep(0.2)
            assert [n["state"] for n in sorted(info["nodes"], key=lambda n: n["node"])] == ["alive", "lost"]
            assert [p["rank"] for p in info["processes"] if p["role"] == "engine"] == [0], info["processes"]
            assert (await http.get("/health")).status_code == 200
            for i in range(6):
                r = await http.post("/v1/completions", json={"model": MODEL, "prompt": f"after {i}",
                                                             "max_tokens": 5})
                assert r.status_code == 200, r.text
        assert not await anyio.to_thread.run_sync(hl.wait_gone, 5.0), dep.logs()
        dep.drop("headless")  # killed on purpose: only the head is stopped and checked
        dep.stop()


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
async def test_a_headless_node_restarted_with_the_same_flags_takes_its_rank_back(tmp_path: Path, how: str) -> None:
    """Dense (spec §13: orchestrators restart a whole node): the node restarted in place of the one killed (or
    stopped in order: ``NodeStopping``, then its link closes) is admitted again, its engine registers with the
    coordinator and the API server, rank 1 is ``ready`` again in /server_info with ``asyncdp:dp_engine_up`` 1, and
    requests pinned to it succeed. The head used to refuse the restarted node ("a running deployment takes no rank
    back"), which exited 1. Prints how long the new node took from its start to its rank serving."""
    with deployment(tmp_path, HEAD, HEADLESS, ready_timeout_s=120) as dep:
        hd, hl = dep.node("head"), dep.node("headless")
        async with httpx.AsyncClient(base_url=hd.base_url, timeout=30.0) as http:
            if how == "sigkill":
                kill_tree(hl)
            else:
                hl.process.send_signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(partial(hl.process.wait, timeout=30))
                assert hl.process.returncode == 0, hl.log()[-4000:]
            dep.drop("headless")
            await wait_server_info(http, dep, "managed_ranks", ["ready", "dead"], 15)
            started = time.monotonic()
            again = launch_node(HEADLESS, dep.rpc, tmp_path / "headless-again.log", dep.model)
            dep.nodes.append(again)  # stopped with the others at the end, and checked the same way
            dep.specs.append(HEADLESS)
            info = await wait_server_info(http, dep, "managed_ranks", ["ready", "ready"], 90)
            took_s = time.monotonic() - started
            assert [n["state"] for n in sorted(info["nodes"], key=lambda n: n["node"])] == ["alive", "alive"]
            assert [p["pid"] for p in info["processes"] if p["role"] == "headless_launcher"] == [again.process.pid]
            assert sorted(p["rank"] for p in info["processes"] if p["role"] == "engine") == [0, 1]
            assert per_engine(await read_metrics(hd.base_url), "asyncdp:dp_engine_up") == {"0": 1.0, "1": 1.0}
            for i in range(4):
                r = await http.post("/v1/completions", json={"model": MODEL, "prompt": f"back {i}", "max_tokens": 5,
                                                             "data_parallel_rank": 1})
                assert r.status_code == 200, r.text
            assert (await successes(hd.base_url)).get("1", 0.0) >= 4
        assert "engine rank 1 is back" in hd.log() and "joined again" in hd.log(), dep.logs()
        if how == "sigterm":
            assert "stopped in order" in hd.log() and "lost the headless node" not in hd.log(), dep.logs()
        print(f"\nrejoin ({how}): rank 1 ready at the head {took_s:.1f} s after the new headless node started")
        dep.stop()


async def test_a_headless_node_stopping_in_order_gets_no_new_requests_while_its_own_drain(tmp_path: Path) -> None:
    """SIGTERM on a dense headless node with --shutdown-timeout 5: its rank tells the API servers it is stopping
    (``RankDraining``), so new requests go to rank 0 while its own requests drain. Before, about half of them went
    to the draining rank and got 503 "engine rank 1 is shutting down" though rank 0 was free. The node tells the
    head too (``NodeStopping``): the head logs its departure at INFO as an orderly one, where it used to log ERROR
    "lost the headless node"."""
    longer = ("--max-model-len", "2048")  # room for a stream that outlasts the drain
    specs = (head("-dp", "2", "-dpl", "1", *longer),
             headless("-dp", "2", "-dpl", "1", "-dpr", "1", "--shutdown-timeout", "5", *longer))
    with deployment(tmp_path, *specs) as dep:
        hd, hl = dep.node("head"), dep.node("headless")
        out: list[tuple[object, ...]] = []
        async with httpx.AsyncClient(base_url=hd.base_url, timeout=60.0) as http:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    # long enough that rank 1 still drains while the requests below are answered (checked)
                    await _sigterm_during_pinned_stream(tg, http, dep, hl, out, 2000)
                    while "engine rank 1 is stopping" not in hd.log():  # noqa: ASYNC110 - another process
                        await anyio.sleep(0.05)  # poll interval of a log file, bounded by the deadline above
                    answers = [await http.post("/v1/completions", json={"model": MODEL, "prompt": f"during {i}",
                                                                         "max_tokens": 2}) for i in range(8)]
                    draining = "engine rank 1 is gone" not in hd.log()  # the answers came during the drain
        assert [r.status_code for r in answers] == [200] * 8, [r.text for r in answers]
        assert draining, dep.logs()
        # the pinned stream finishes, or is cut at the drain deadline with the reason: never a 200 cut short
        assert len(out) == 1 and (out[0] == ("done", 2000, "length") or (
            out[0][0] == "error" and "engine rank 1 stopped" in str(out[0][1]))), out
        assert await wait_code(hl, 20, dep) == 0, dep.logs()
        with anyio.fail_after(10):  # the head sees the node link close at once
            while "(a signal to the node)" not in hd.log() or "stopped in order" not in hd.log():  # noqa: ASYNC110
                await anyio.sleep(0.05)  # poll interval of another process's log file, bounded by the deadline
        assert "engine rank 1 is dead" not in hd.log(), dep.logs()  # an orderly stop, not a death
        assert "lost the headless node" not in hd.log(), dep.logs()  # nor a loss
        dep.drop("headless")
        dep.stop()


async def test_a_headless_node_whose_engine_is_killed_in_its_own_drain_is_an_error_at_the_head(tmp_path: Path) -> None:
    """SIGTERM on a dense headless node (``NodeStopping``) whose engine cannot drain (SIGSTOPped): at the node's
    deadline (--shutdown-timeout 1 + 5 s) its engine is killed and the node exits 1. The head used to log that
    departure at INFO as "stopped in order"; the node's last frame (``NodeStopped``) now tells it the drain went
    wrong: ERROR, naming the rank killed and its exit code."""
    specs = (HEAD, headless("-dp", "2", "-dpl", "1", "-dpr", "1", "--shutdown-timeout", "1"))
    with deployment(tmp_path, *specs) as dep:
        hd, hl = dep.node("head"), dep.node("headless")
        async with httpx.AsyncClient(base_url=hd.base_url, timeout=30.0) as http:
            info = (await http.get("/server_info")).json()
            engine = next(p["pid"] for p in info["processes"] if p["role"] == "engine" and p["rank"] == 1)
            dep.remember_trees()
            os.kill(engine, signal.SIGSTOP)  # it cannot drain: its node's deadline has to kill it
            hl.process.send_signal(signal.SIGTERM)
            assert await wait_code(hl, 30, dep) == 1, dep.logs()
            with anyio.fail_after(10):  # the head sees the node link close at once
                while " leaves the balancer" not in hd.log():  # noqa: ASYNC110 - another process's log file
                    await anyio.sleep(0.05)  # poll interval, bounded by the deadline above
            lines = [line for line in hd.log().splitlines() if "leaves the balancer" in line]
            assert len(lines) == 1 and "ERROR" in lines[0] and "stopped, not in order" in lines[0], dep.logs()
            assert f"engine rank 1 (asyncdp-engine-dp1, pid {engine}) was killed, exit code -9" in lines[0], lines
            assert "stopped in order" not in hd.log(), dep.logs()
            assert (await http.get("/health")).status_code == 200  # dense: rank 0 serves on
        assert not await anyio.to_thread.run_sync(hl.wait_gone, 5.0), dep.logs()
        dep.drop("headless")
        dep.stop()


async def _both_fail(tmp_path: Path, head_args: tuple[str, ...], headless_args: tuple[str, ...]) -> Deployment:
    dep = start(tmp_path, (head(*head_args), headless(*headless_args)))
    try:
        codes = [await wait_code(n, 60, dep) for n in dep.nodes]
        assert codes == [1, 1], f"exit codes head, headless: {codes}\n{dep.logs()}"
        left = await anyio.to_thread.run_sync(dep.wait_gone, 5.0)
        assert not left, dep.logs()
        return dep
    finally:
        dep.kill_all()


async def test_headless_node_with_a_different_sync_interval_fails_startup_on_both_sides(tmp_path: Path) -> None:
    dep = await _both_fail(tmp_path, ("-dp", "2", "-dpl", "1", "--dp-sync-interval", "32"),
                           ("-dp", "2", "-dpl", "1", "-dpr", "1", "--dp-sync-interval", "16"))
    for n in dep.nodes:
        assert "dp_sync_interval" in n.log(), dep.logs()


async def test_headless_node_overlapping_the_heads_ranks_is_refused_by_name(tmp_path: Path) -> None:
    dep = await _both_fail(tmp_path, ("-dp", "2", "-dpl", "1"), ("-dp", "2", "-dpl", "1", "-dpr", "0"))
    for n in dep.nodes:
        assert "overlaps" in n.log() and "rank 0" in n.log(), dep.logs()


async def test_moe_head_keeps_heartbeating_to_a_headless_node_while_it_hosts_the_rendezvous(tmp_path: Path) -> None:
    hb = ("--enable-expert-parallel", "--dp-heartbeat-interval-s", "0.2", "--dp-heartbeat-timeout-s", "1.5")
    dep = start(tmp_path, (head("-dp", "2", "-dpl", "1", *hb), headless("-dp", "2", "-dpl", "1", "-dpr", "1", *hb)),
                model="builtin:tiny-moe")
    try:
        exited = await anyio.to_thread.run_sync(wait_healthy, dep, 120.0)
        assert "lost the head front-end" not in dep.node("headless").log(), dep.logs()
        assert exited is None, dep.logs()
        dep.stop()
    finally:
        dep.kill_all()
