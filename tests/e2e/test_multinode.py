"""End to end: the multi-node layouts of issue 8 on loopback, each node its own ``asyncdp serve`` process tree.

One module-scoped deployment per (layout, ``--api-server-count``) serves the topology, burst, streaming and
spread tests of that layout (pytest groups the tests by the fixture's parameter, so one deployment lives at a
time). CI runs one API-server count per layout; the other count, and the full burst size, are behind
``@pytest.mark.slow``. Counters are compared as deltas, so the tests do not depend on each other's order.

Layouts (tests/e2e/multinode.py): ``internal`` (head ranks 0-1 + headless 2-3), ``api_only`` (``-dp 2 -dpl 0``
+ headless ``-dpl 2``), ``by_node_rank`` (``--nnodes 2 --node-rank 0|1``) and ``hybrid`` (two ``-dph`` nodes,
each with its own port, balancing over its own ranks).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import anyio
import httpx
import pytest

from tests.e2e.conftest import MODEL, Server, descendants
from tests.e2e.metrics_text import successes
from tests.e2e.multinode import LAYOUTS, Deployment, deployment

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

CI_BURST = 40
SLOW_BURST = 200

# (layout, api-server count): one count per layout in CI, the other behind the slow marker
CASES = [
    pytest.param(("internal", 2), id="internal-C2"),
    pytest.param(("api_only", 1), id="api_only-C1"),
    pytest.param(("hybrid", 1), id="hybrid-C1"),
    pytest.param(("by_node_rank", 1), id="by_node_rank-C1"),
    pytest.param(("internal", 1), id="internal-C1", marks=pytest.mark.slow),
    pytest.param(("api_only", 2), id="api_only-C2", marks=pytest.mark.slow),
    pytest.param(("hybrid", 2), id="hybrid-C2", marks=pytest.mark.slow),
    pytest.param(("by_node_rank", 2), id="by_node_rank-C2", marks=pytest.mark.slow),
]

# per layout: the ranks each endpoint balances over, and each node's ranks (in launch order)
ENDPOINT_RANKS = {"internal": [[0, 1, 2, 3]], "api_only": [[0, 1]], "by_node_rank": [[0, 1, 2, 3]],
                  "hybrid": [[0, 1], [2, 3]]}
NODE_RANKS = {"internal": [[0, 1], [2, 3]], "api_only": [[], [0, 1]], "by_node_rank": [[0, 1], [2, 3]],
              "hybrid": [[0, 1], [2, 3]]}


class Layout:
    def __init__(self, name: str, api_count: int, dep: Deployment) -> None:
        self.name, self.api_count, self.dep = name, api_count, dep

    @property
    def mode(self) -> str:
        return "hybrid" if self.name == "hybrid" else "internal"


@pytest.fixture(scope="module", params=CASES)
def layout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layout]:
    name, api_count = request.param
    with deployment(tmp_path_factory.mktemp(f"{name}-{api_count}"), *LAYOUTS[name](api_count)) as dep:
        yield Layout(name, api_count, dep)


async def _server_infos(endpoint: Server, api_count: int) -> list[dict]:
    """2·C² sequential GETs on fresh connections (more, up to 100, until every API process answered)."""
    docs: list[dict] = []
    async with httpx.AsyncClient(base_url=endpoint.base_url, timeout=5.0,
                                 limits=httpx.Limits(max_keepalive_connections=0)) as http:
        async def get() -> None:
            r = await http.get("/server_info")
            r.raise_for_status()
            docs.append(r.json())

        for _ in range(2 * api_count**2):
            await get()
        while len({d["api_process_rank"] for d in docs}) < api_count and len(docs) < 100:
            await get()
    return docs


async def test_server_info_reports_api_process_count_and_rank_on_every_endpoint(layout: Layout) -> None:
    with anyio.fail_after(60):
        for endpoint in layout.dep.endpoints:
            docs = await _server_infos(endpoint, layout.api_count)
            assert {d["api_process_count"] for d in docs} == {layout.api_count}
            assert {d["api_process_rank"] for d in docs} == set(range(layout.api_count))
            assert {d["parallel_config"]["_api_process_count"] for d in docs} == {layout.api_count}
            assert {d["mode"] for d in docs} == {layout.mode}


async def test_server_info_managed_ranks_have_local_index_and_local_flag(layout: Layout) -> None:
    node_ranks = NODE_RANKS[layout.name]
    async with httpx.AsyncClient(timeout=5.0) as http:
        for i, (endpoint, ranks) in enumerate(zip(layout.dep.endpoints, ENDPOINT_RANKS[layout.name], strict=True)):
            info = (await http.get(f"{endpoint.base_url}/server_info")).json()
            own = set(node_ranks[i])  # the endpoints are the first nodes in launch order
            rows = info["managed_ranks"]
            assert [r["dp_rank"] for r in rows] == ranks
            assert [r["local_index"] for r in rows] == list(range(len(ranks)))
            assert [r["local"] for r in rows] == [r in own for r in ranks]
            assert {r["state"] for r in rows} == {"ready"}
            assert info["dp_size"] == (2 if layout.name == "api_only" else 4)


async def test_server_info_on_the_head_lists_every_node(layout: Layout) -> None:
    async with httpx.AsyncClient(timeout=5.0) as http:
        info = (await http.get(f"{layout.dep.head.base_url}/server_info")).json()
    nodes = sorted(info["nodes"], key=lambda n: n["node"])
    roles = {"hybrid": ["head", "hybrid"]}.get(layout.name, ["head", "headless"])
    assert [n["role"] for n in nodes] == roles
    assert [n["ranks"] for n in nodes] == NODE_RANKS[layout.name]
    assert [n["pid"] for n in nodes] == [n.process.pid for n in layout.dep.nodes]
    assert {n["state"] for n in nodes} == {"alive"}


async def test_server_info_on_every_other_endpoint_lists_every_node(layout: Layout) -> None:
    """Issue 8: /server_info on any API server shows the whole topology (only hybrid has a second endpoint)."""
    if len(layout.dep.endpoints) == 1:
        pytest.skip("one endpoint: the head's view is checked above")
    async with httpx.AsyncClient(timeout=5.0) as http:
        for endpoint in layout.dep.endpoints[1:]:
            info = (await http.get(f"{endpoint.base_url}/server_info")).json()
            nodes = sorted(info["nodes"], key=lambda n: n["node"])
            assert [(n["role"], n["ranks"], n["pid"]) for n in nodes] == [
                ("head", [0, 1], layout.dep.nodes[0].process.pid),
                ("hybrid", [2, 3], layout.dep.nodes[1].process.pid)], nodes


async def test_server_info_on_the_head_lists_every_process_of_the_deployment(layout: Layout) -> None:
    """pid, role, rank and node of every process of every node's tree, as /proc sees the trees."""
    async with httpx.AsyncClient(timeout=5.0) as http:
        info = (await http.get(f"{layout.dep.head.base_url}/server_info")).json()
    listed = {p["pid"]: p for p in info["processes"]}
    for index, node in enumerate(layout.dep.nodes):
        tree = {node.process.pid, *descendants(node.process.pid)}
        mine = {pid for pid, p in listed.items() if p["node"] == index}
        assert mine == tree, f"node {index}: listed {sorted(mine)}, its tree {sorted(tree)}: {info['processes']}"
    engines = sorted((p["rank"], p["node"]) for p in info["processes"] if p["role"] == "engine")
    assert engines == sorted((r, i) for i, ranks in enumerate(NODE_RANKS[layout.name]) for r in ranks)


async def _burst(endpoint: Server, n: int, tag: str) -> list[str | None]:
    results: list[str | None] = []
    async with endpoint.openai() as client:
        async def one(i: int) -> None:
            r = await client.completions.create(model=MODEL, prompt=f"{tag} request number {i}", max_tokens=5,
                                                temperature=1.0)
            results.append(r.choices[0].finish_reason)

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
    return results


async def _bursts_succeed_and_spread(layout: Layout, burst: int) -> None:
    """Two bursts per endpoint succeed; per-engine successes from each endpoint's /metrics cover only its own
    ranks, add up to what it served, and are within 2x of each other."""
    endpoints = layout.dep.endpoints
    before = [await successes(e.base_url) for e in endpoints]
    with anyio.fail_after(60 + burst):
        for round_ in range(2):
            async with anyio.create_task_group() as tg:  # every endpoint at once (hybrid: both nodes)
                for i, e in enumerate(endpoints):
                    async def run(e: Server = e, tag: str = f"{round_}-{i}") -> None:
                        results = await _burst(e, burst, tag)
                        assert len(results) == burst
                        assert set(results) <= {"length", "stop"}

                    tg.start_soon(run)
    for e, ranks, old in zip(endpoints, ENDPOINT_RANKS[layout.name], before, strict=True):
        for _ in range(2 * layout.api_count):  # fresh connections: the reads land on every API process
            after = await successes(e.base_url)
            assert set(after) == {str(r) for r in ranks}, f"{e.base_url} reports engines {sorted(after)}"
            delta = {k: after[k] - old.get(k, 0.0) for k in after}
            assert sum(delta.values()) == 2 * burst, delta
            assert max(delta.values()) <= 2 * min(delta.values()), f"spread beyond 2x: {delta}"


async def test_two_bursts_of_completions_succeed_and_spread_over_the_endpoints_ranks(layout: Layout) -> None:
    await _bursts_succeed_and_spread(layout, CI_BURST)


@pytest.mark.slow
async def test_two_bursts_of_200_completions_succeed_and_spread_over_the_endpoints_ranks(layout: Layout) -> None:
    await _bursts_succeed_and_spread(layout, SLOW_BURST)


async def test_greedy_streamed_text_equals_non_streamed_on_every_endpoint(layout: Layout) -> None:
    prompts = ["The capital of France is", "Once upon a time", "abc"]
    with anyio.fail_after(60):
        for endpoint in layout.dep.endpoints:
            async with endpoint.openai() as client:
                for prompt in prompts:
                    r = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
                    s = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                                        stream=True)
                    streamed = "".join([c.choices[0].text async for c in s if c.choices])
                    assert r.choices[0].text and streamed == r.choices[0].text


async def test_head_health_is_200_and_every_headless_tree_is_alive(layout: Layout) -> None:
    async with httpx.AsyncClient(timeout=5.0) as http:
        for endpoint in layout.dep.endpoints:
            assert (await http.get(f"{endpoint.base_url}/health")).status_code == 200
    for node in layout.dep.nodes:
        assert node.process.poll() is None
        assert os.getpgid(node.process.pid) == node.process.pid
