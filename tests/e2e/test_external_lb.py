"""End to end: external load balancing, one ``asyncdp serve`` per MoE rank (spec §11.2, §12, §13; issue 9).

Two rank servers of ``builtin:tiny-moe`` (``-dp 2 --data-parallel-rank r -dpa 127.0.0.1 -dpp RPC``) form one MoE
group on loopback; rank 0 hosts the handshake listener and the wave-only coordinator. A module-scoped group per
``--api-server-count`` (1 and 2) serves the tests that do not end it; the rank-loss test starts its own group.

The servers are launched like :func:`tests.e2e.conftest.serve` launches one (new session, process tree recorded
from /proc, clean stop asserted: exit 0, no process left, no traceback), but at ports the test picks, because the
ranks must share the handshake port. A launch that loses the race for a port is retried once on fresh ports.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.e2e.conftest import BASE_ARGS, READY_TIMEOUT_S, ROOT, Server, free_port
from tests.e2e.metrics_text import per_engine, read_metrics, successes

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MOE = "builtin:tiny-moe"
PORT_RACE = re.compile(r"cannot listen on .*in use|Address already in use")


def launch(log_path: Path, model: str, *args: str, port: int | None = None) -> Server:
    """``python -m asyncdp serve MODEL --host 127.0.0.1 BASE_ARGS ARGS`` in a new session; ``args`` name the port.

    The returned :class:`Server`'s ``port`` is ``port``, else the value of the first ``--port`` in ``args``."""
    port = int(args[args.index("--port") + 1]) if port is None else port
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "asyncdp", "serve", model, "--host", "127.0.0.1", *BASE_ARGS, *args]
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=ROOT)
    return Server(port=port, process=proc, log_path=log_path, args=tuple(args))


def wait_all_healthy(servers: list[Server], timeout_s: float = READY_TIMEOUT_S) -> bool:
    """True once every server's /health is 200; False as soon as one exits first. Fails at the deadline."""
    deadline = time.monotonic() + timeout_s
    pending = list(servers)
    with httpx.Client(timeout=2.0) as http:
        while pending and time.monotonic() < deadline:
            for server in list(pending):
                if server.process.poll() is not None:
                    return False
                try:
                    if http.get(f"{server.base_url}/health").status_code == 200:
                        server.remember_tree()
                        pending.remove(server)
                except httpx.TransportError:
                    pass
            if pending:
                try:  # the poll interval, and an early exit if the first pending server dies
                    pending[0].process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
    if pending:
        pytest.fail(f"not healthy within {timeout_s} s\n" + "\n".join(s.log()[-3000:] for s in pending))
    return True


def kill_all(servers: list[Server]) -> None:
    for server in servers:
        server.kill_all()


def stop_all(servers: list[Server], timeout_s: float = 20.0) -> None:
    """SIGTERM every server at once (an orderly stop of the whole group); each exits 0, nothing is left."""
    for server in servers:
        server.remember_tree()
    for server in servers:
        server.process.send_signal(signal.SIGTERM)
    for server in servers:
        try:
            code = server.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"server {server.port} did not exit within {timeout_s} s of SIGTERM\n{server.log()[-4000:]}")
        assert code == 0, f"server {server.port} exited with {code}\n{server.log()[-4000:]}"
    for server in servers:
        assert not server.wait_gone(), f"processes left\n{server.log()[-4000:]}"
        assert "Traceback" not in server.log(), f"a traceback was logged\n{server.log()[-4000:]}"


def _start_external(log_dir: Path, model: str, api_servers: int) -> list[Server]:
    rpc = free_port()
    ports = [free_port() for _ in range(2)]
    tag = uuid.uuid4().hex[:6]
    return [launch(log_dir / f"rank{r}-{tag}.log", model, "-dp", "2", "--data-parallel-rank", str(r),
                   "--port", str(ports[r]), "-dpa", "127.0.0.1", "-dpp", str(rpc),
                   "--api-server-count", str(api_servers))
            for r in range(2)]


@contextmanager
def external_group(log_dir: Path, api_servers: int = 1, model: str = MOE) -> Iterator[list[Server]]:
    """Both rank servers of a dp=2 external-LB group, healthy; stopped together (exit 0 each) afterwards unless
    the test ended them itself."""
    servers = _start_external(log_dir, model, api_servers)
    try:
        if not wait_all_healthy(servers) and any(PORT_RACE.search(s.log()) for s in servers):
            kill_all(servers)  # lost a race for one of the ports: once more, on fresh ones
            servers = _start_external(log_dir, model, api_servers)
            wait_all_healthy(servers)
        for s in servers:
            if s.process.poll() is not None:
                pytest.fail(f"server exited with {s.process.returncode} before ready\n{s.log()[-4000:]}")
        yield servers
        if any(s.process.poll() is None for s in servers):
            stop_all(servers)
    finally:
        if any(s.process.poll() is None or s.remaining() for s in servers):
            kill_all(servers)


@pytest.fixture(scope="module", params=[1, 2], ids=["1api", "2api"])
def group(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    with external_group(tmp_path_factory.mktemp(f"ext{request.param}"), request.param) as servers:
        yield servers


def api_count(servers: list[Server]) -> int:
    return int(servers[0].args[servers[0].args.index("--api-server-count") + 1])


async def _get_json(base_url: str, path: str) -> Any:
    async with httpx.AsyncClient(base_url=base_url, timeout=10.0) as http:
        r = await http.get(path, headers={"Connection": "close"})  # fresh connections reach every API process
        assert r.status_code == 200, r.text
        return r.json()


# ---------------------------------------------------------------------------------------------------------------
# /server_info, traffic, parity, hints


async def test_each_rank_server_describes_itself_as_external_with_its_rank(group: list[Server]) -> None:
    count = api_count(group)
    for rank, server in enumerate(group):
        seen_api_ranks = set()
        for _ in range(4 * count):  # fresh connections: with 2 API servers both answer sooner or later
            info = await _get_json(server.base_url, "/server_info")
            assert info["mode"] == "external"
            assert info["dp_size"] == 2 and info["dp_size_local"] == 1 and info["dp_start_rank"] == rank
            assert [(r["dp_rank"], r["local_index"]) for r in info["managed_ranks"]] == [(rank, 0)]
            assert info["api_process_count"] == count
            assert 0 <= info["api_process_rank"] < count
            assert info["wave"] is not None
            # processes: every asyncdp process of this node it knows (on loopback rank 0 also knows rank 1's
            # engine from the handshake), its own rank's engine among them
            assert rank in [p["rank"] for p in info["processes"] if p["role"] == "engine"]
            seen_api_ranks.add(info["api_process_rank"])
        assert seen_api_ranks <= set(range(count))


async def test_25_concurrent_completions_twice_per_server_all_succeed_on_its_rank_only(group: list[Server]) -> None:
    for rank, server in enumerate(group):
        before = await successes(server.base_url)
        async with server.openai(timeout=60.0) as client:
            for round_ in range(2):
                texts: list[str] = []

                async def one(prompt: str, texts: list[str] = texts) -> None:
                    c = await client.completions.create(model=MOE, prompt=prompt, max_tokens=8,
                                                        extra_body={"ignore_eos": True})
                    assert c.usage is not None and c.usage.completion_tokens == 8
                    texts.append(c.choices[0].text)

                with anyio.fail_after(90):
                    async with anyio.create_task_group() as tg:
                        for i in range(25):
                            tg.start_soon(one, f"rank {rank} round {round_} request {i}")
                assert len(texts) == 25
        after = await successes(server.base_url)
        assert set(after) == {str(rank)}, after  # this server's /metrics shows only its own engine
        assert after[str(rank)] - before.get(str(rank), 0.0) == 50


async def test_streamed_text_equals_non_streamed_text_for_greedy_prompts(group: list[Server]) -> None:
    prompts = ["The expert says", "Mixture of experts", "abc"]
    for server in group:
        async with server.openai(timeout=60.0) as client:
            for prompt in prompts:
                params: dict[str, Any] = dict(model=MOE, prompt=prompt, max_tokens=12, temperature=0.0,
                                              extra_body={"ignore_eos": True})
                plain = (await client.completions.create(**params)).choices[0].text
                streamed = []
                async for chunk in await client.completions.create(stream=True, **params):
                    if chunk.choices:
                        streamed.append(chunk.choices[0].text)
                assert "".join(streamed) == plain and plain


async def test_a_rank_hint_naming_the_other_rank_is_a_400_that_names_the_served_rank(group: list[Server]) -> None:
    async with httpx.AsyncClient(base_url=group[0].base_url, timeout=30.0) as http:
        r = await http.post("/v1/completions", headers={"X-data-parallel-rank": "1"},
                            json={"model": MOE, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 400, r.text
        assert "serves only data-parallel rank 0" in r.json()["error"]["message"]
        ok = await http.post("/v1/completions", headers={"X-data-parallel-rank": "0"},
                             json={"model": MOE, "prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200, ok.text
    async with httpx.AsyncClient(base_url=group[1].base_url, timeout=30.0) as http:
        # rank 1's server: local index 0, or the global form naming rank 1; the global form of rank 0 is refused
        for headers in ({"X-data-parallel-rank": "0"}, {"X-data-parallel-global-rank": "1"}):
            ok = await http.post("/v1/completions", headers=headers, json={"model": MOE, "prompt": "hi",
                                                                           "max_tokens": 2})
            assert ok.status_code == 200, (headers, ok.text)
        r = await http.post("/v1/completions", headers={"X-data-parallel-global-rank": "0"},
                            json={"model": MOE, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 400 and "is not served by this endpoint" in r.json()["error"]["message"], r.text


# ---------------------------------------------------------------------------------------------------------------
# waves


async def _wait_group_paused(servers: list[Server], timeout_s: float = 15.0) -> None:
    with anyio.fail_after(timeout_s):
        while True:
            running = [per_engine(await read_metrics(s.base_url), "asyncdp:dp_running") for s in servers]
            if all(r and not any(r.values()) for r in running):
                return
            await anyio.sleep(0.1)


async def test_all_ranks_pause_after_traffic_and_a_request_to_one_server_wakes_the_group(
        group: list[Server]) -> None:
    await _wait_group_paused(group)
    text = await read_metrics(group[1].base_url)
    dummies_before = per_engine(text, "asyncdp:dp_dummy_steps_total").get("1", 0.0)
    waves_before = per_engine(text, "asyncdp:dp_waves_completed_total").get("1", 0.0)
    async with httpx.AsyncClient(base_url=group[0].base_url, timeout=30.0) as http:
        r = await http.post("/v1/completions", json={"model": MOE, "prompt": "wake up", "max_tokens": 6,
                                                     "ignore_eos": True})
        assert r.status_code == 200, r.text
    # Rank 1 had no request of its own, yet it joined the wave: dummy steps, then the wave completes there too.
    with anyio.fail_after(15.0):
        while True:
            text = await read_metrics(group[1].base_url)
            dummies = per_engine(text, "asyncdp:dp_dummy_steps_total").get("1", 0.0)
            waves = per_engine(text, "asyncdp:dp_waves_completed_total").get("1", 0.0)
            if dummies > dummies_before and waves > waves_before:
                break
            await anyio.sleep(0.1)
    await _wait_group_paused(group)


# ---------------------------------------------------------------------------------------------------------------
# GET /load


LOAD_KEYS = {"seq", "age_s", "mode", "dp_size", "api_process_rank", "api_process_count", "wave", "coordinator",
             "ranks"}
RANK_KEYS = {"dp_rank", "local_index", "up", "waiting", "running", "kv_cache_usage", "prefill_tokens", "cache_fill",
             "prefix_cache_queries",
             "prefix_cache_hits", "inflight", "wave", "wave_running", "age_s"}


def check_load(load: dict[str, Any], *, rank: int, dp_size: int, api_servers: int, mode: str = "external") -> None:
    """The telemetry contract of ``GET /load`` for an endpoint that manages exactly rank ``rank``."""
    assert set(load) >= LOAD_KEYS, load
    assert isinstance(load["seq"], int) and load["seq"] >= 0
    assert load["age_s"] is None or (isinstance(load["age_s"], (int, float)) and load["age_s"] >= 0)
    assert load["mode"] == mode and load["dp_size"] == dp_size
    assert load["api_process_count"] == api_servers and 0 <= load["api_process_rank"] < api_servers
    assert set(load["wave"]) == {"current", "running"} and isinstance(load["wave"]["running"], bool)
    if load["coordinator"] is not None:  # external rank servers may get no coordinator snapshots
        assert isinstance(load["coordinator"]["seq"], int) and load["coordinator"]["age_s"] >= 0
    (one,) = load["ranks"]
    assert set(one) >= RANK_KEYS, one
    assert one["dp_rank"] == rank and one["local_index"] == 0 and one["up"] is True
    for key in ("waiting", "running", "prefill_tokens", "inflight", "prefix_cache_queries", "prefix_cache_hits"):
        assert isinstance(one[key], int) and one[key] >= 0, (key, one)
    assert one["prefix_cache_hits"] <= one["prefix_cache_queries"]
    assert 0.0 <= one["kv_cache_usage"] <= 1.0 and 0.0 <= one["cache_fill"] <= 1.0
    assert isinstance(one["wave"], int) and isinstance(one["wave_running"], bool)
    assert one["age_s"] is None or one["age_s"] >= 0


async def test_load_answers_the_telemetry_contract_on_every_rank_server(group: list[Server]) -> None:
    for rank, server in enumerate(group):
        for _ in range(2 * api_count(group)):
            check_load(await _get_json(server.base_url, "/load"), rank=rank, dp_size=2,
                       api_servers=api_count(group))


async def test_load_seq_increases_over_polls_and_200_polls_are_cheap(group: list[Server]) -> None:
    server = group[0]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10.0) as http:
        # seq is per API process (each has its own view; with several, connections land on any of them): it
        # must be monotonic for each process, and grow for the one that sees the traffic's stats.
        seqs: dict[int, list[int]] = {}

        async def poll() -> None:
            doc = (await http.get("/load")).json()
            seqs.setdefault(doc["api_process_rank"], []).append(doc["seq"])

        await poll()
        with anyio.fail_after(30.0):
            async with anyio.create_task_group() as tg:  # traffic: the rank's stats arrive and bump seq
                tg.start_soon(functools.partial(http.post, "/v1/completions", timeout=30.0, json={
                    "model": MOE, "prompt": "load me", "max_tokens": 20, "ignore_eos": True}))
                while not any(s[-1] > s[0] for s in seqs.values()):
                    await anyio.sleep(0.05)
                    await poll()
        assert all(s == sorted(s) for s in seqs.values()), seqs
        t0 = time.perf_counter()
        for _ in range(200):
            r = await http.get("/load")
            assert r.status_code == 200
        took = time.perf_counter() - t0
    print(f"\n/load: 200 sequential polls over one connection took {took * 1000:.0f} ms "
          f"({took * 5:.2f} ms each, --api-server-count {api_count(group)})")


async def test_the_example_router_sends_requests_through_the_least_loaded_rank(group: list[Server]) -> None:
    """The router of docs/howto/external-lb.md serves every request through the live endpoints, and an endpoint
    that is down from the start (nothing listens on its port) is skipped, not waited for."""
    script = ROOT / "docs" / "howto" / "external_lb_router.py"
    down = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, str(script), down, *(s.base_url for s in group), "--model", MOE, "--requests", "6",
           "--max-tokens", "4", "--timeout-s", "60"]
    done = await anyio.run_process(cmd, check=False, cwd=ROOT)
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    served = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(served) == 6 and all(s["status"] == 200 for s in served), out
    assert {s["backend"] for s in served} <= {s.base_url for s in group}
    doc = (ROOT / "docs" / "howto" / "external-lb.md").read_text()
    sample = re.search(r'^# (\{"request": 0.*\})$', doc, re.M)
    assert sample is not None, "external-lb.md no longer shows the router's output: update this test"
    assert all(list(s) == list(json.loads(sample.group(1))) for s in served), out  # the doc's keys, in order


# ---------------------------------------------------------------------------------------------------------------
# rank loss and refusals


async def _stream_until_error(base_url: str, i: int, started: anyio.Event, outcomes: list[str]) -> None:
    """One long streamed completion; records how it ended: ``error-event``, ``transport-error``, ``http-<code>``
    or ``finished`` (the last one is what must not happen)."""
    body = {"model": MOE, "prompt": f"doomed {i}", "max_tokens": 400, "ignore_eos": True, "stream": True}
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as http, \
                http.stream("POST", "/v1/completions", json=body) as stream:
            if stream.status_code != 200:
                outcomes.append(f"http-{stream.status_code}")
                return
            async for line in stream.aiter_lines():
                started.set()
                if line.startswith("data: ") and line != "data: [DONE]" and "error" in json.loads(line[6:]):
                    outcomes.append("error-event")
                    return
                if line == "data: [DONE]":
                    outcomes.append("finished")
                    return
        outcomes.append("closed-without-done")
    except httpx.TransportError:
        outcomes.append("transport-error")
    finally:
        started.set()


async def test_sigkill_of_one_ranks_engine_ends_every_server_within_5s_with_every_stream_errored(
        tmp_path: Path) -> None:
    with external_group(tmp_path) as servers:
        info = await _get_json(servers[1].base_url, "/server_info")
        engine1 = next(p["pid"] for p in info["processes"] if p["role"] == "engine" and p["rank"] == 1)
        outcomes: list[str] = []
        health: dict[int, list[int | str]] = {s.port: [] for s in servers}
        with anyio.fail_after(40):
            async with anyio.create_task_group() as tg:
                events = []
                for server in servers:
                    for i in range(3):
                        events.append(anyio.Event())
                        tg.start_soon(_stream_until_error, server.base_url, i, events[-1], outcomes)
                for event in events:
                    await event.wait()
                for server in servers:
                    server.remember_tree()
                killed_at = time.monotonic()
                os.kill(engine1, signal.SIGKILL)
                async with httpx.AsyncClient(timeout=1.0) as http:
                    while any(s.process.poll() is None for s in servers):
                        for s in servers:
                            try:
                                health[s.port].append((await http.get(f"{s.base_url}/health")).status_code)
                            except httpx.TransportError as e:
                                health[s.port].append(type(e).__name__)  # the listener is gone
                        await anyio.sleep(0.05)
                gone_after = time.monotonic() - killed_at
        codes = [s.process.wait(timeout=1) for s in servers]
        print(f"\ngroup ended {gone_after:.2f} s after the SIGKILL; /health seen: {health}; streams: {outcomes}")
        assert codes == [1, 1], codes
        assert gone_after < 5.0, gone_after
        assert len(outcomes) == 6 and "finished" not in outcomes, outcomes
        for port, seen in health.items():
            after_first_failure = seen[next((i for i, c in enumerate(seen) if c != 200), len(seen)):]
            assert 200 not in after_first_failure, (port, seen)  # once unhealthy, never healthy again
            # 503, then the server gone: a closed port, or a connection it dropped as the process ended mid-request
            assert set(after_first_failure) <= {503, "ConnectError", "RemoteProtocolError", "ReadError"}, (port, seen)
        for s in servers:
            assert not s.wait_gone(2.0), s.log()[-4000:]


def _until_logged(server: Server, text: str, timeout_s: float = 20.0) -> None:
    """Until ``text`` is in ``server``'s log, or it exited, or ``timeout_s`` passed (the assertions after tell)."""
    deadline = time.monotonic() + timeout_s
    while text not in server.log() and server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


# Signalled first, then what the other rank server's log shows once the group's end reached it before its own
# signal: rank 0 first, rank 1's engine ended with the group; rank 1 first, its engine left the group, which rank 0
# (the coordinator and the handshake) sees before its signal.
PEER_GONE = {0: "left with its MoE group", 1: "leaving the group"}


@pytest.mark.parametrize("first", [0, 1], ids=["rank0-first", "rank1-first"])
def test_sigterm_to_a_rank_server_after_its_peer_left_the_group_in_either_order_stops_both_with_exit_0(
        tmp_path: Path, first: int) -> None:
    # The signals of a whole group's stop can reach its rank servers a moment apart (a loaded machine, an
    # orchestrator stopping them one by one): the one signalled late was shutting down too, so it exits 0 as well
    # (spec §8.7). The second signal goes out once the first server's departure has reached the group.
    with external_group(tmp_path) as servers:
        for server in servers:
            server.remember_tree()
        servers[first].process.send_signal(signal.SIGTERM)
        _until_logged(servers[1], PEER_GONE[first])
        servers[1 - first].process.send_signal(signal.SIGTERM)
        for server in servers:
            code = server.process.wait(timeout=30)
            assert code == 0, f"server {server.port} exited with {code}\n{server.log()[-4000:]}"
        for server in servers:
            assert not server.wait_gone(), f"processes left\n{server.log()[-4000:]}"
            assert "Traceback" not in server.log(), server.log()[-4000:]


def test_sigterm_to_one_rank_server_alone_ends_the_other_with_exit_1_within_5s(tmp_path: Path) -> None:
    # A group cannot go on without a rank: the rank server that was not asked to stop reports the group's end as a
    # failure once the grace for its own signal is over (spec §8.7 and the failure table: within 5 s).
    with external_group(tmp_path) as servers:
        for server in servers:
            server.remember_tree()
        servers[0].process.send_signal(signal.SIGTERM)
        assert servers[0].process.wait(timeout=30) == 0, servers[0].log()[-4000:]
        stopped_at = time.monotonic()
        code = servers[1].process.wait(timeout=30)
        after = time.monotonic() - stopped_at
        assert code == 1, servers[1].log()[-4000:]
        assert after < 5.0, after
        assert "was not asked to stop within" in servers[1].log(), servers[1].log()[-4000:]
        for server in servers:
            assert not server.wait_gone(), f"processes left\n{server.log()[-4000:]}"


def test_a_dense_model_with_a_data_parallel_rank_exits_2_saying_to_launch_independent_servers(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "asyncdp", "serve", "builtin:tiny-dense", "--host", "127.0.0.1", *BASE_ARGS,
           "-dp", "2", "--data-parallel-rank", "0", "--port", str(free_port()), "-dpa", "127.0.0.1",
           "-dpp", str(free_port())]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "launch independent" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
