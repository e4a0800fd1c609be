"""The router's own ``GET /load``: its endpoints' last answers and their age, which are usable, and the ranks in the
telemetry contract's shape, so that another router can put this one behind it (checked here in-process: an outer
poller reads the inner router's ``/load`` through httpx's ASGI transport)."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from asyncdp.router.poller import Poller
from asyncdp.router.proxy import RouterApp
from asyncdp.router.score import EndpointLoad, checked_load, score
from asyncdp.router.telemetry import router_load
from tests.router.upstream import IDLE_LOAD, echo_upstream, routed, stop

A, B = "http://a:1", "http://b:2"


def rank(dp_rank: int, waiting: int, up: bool = True) -> dict[str, object]:
    return {"dp_rank": dp_rank, "up": up, "waiting": waiting, "running": 1, "inflight": 0, "kv_cache_usage": 0.1,
            "prefill_tokens": 0, "age_s": 0.01}


def test_each_endpoint_shows_its_last_answer_its_age_and_whether_it_is_used() -> None:
    a, b = EndpointLoad(A), EndpointLoad(B)
    a.observe({"seq": 7, "ranks": [rank(0, 2), rank(1, 0)]}, now_s=10.0)
    b.observe({"seq": 3, "ranks": [rank(0, 5)]}, now_s=8.0)
    b.observe_failure("GET /load failed: ConnectError: refused")
    doc = router_load([a, b], now_s=10.5, stale_after_s=1.0, seq=4)
    assert (doc["seq"], doc["mode"], doc["age_s"], doc["num_usable"]) == (4, "router", 0.5, 1)
    ea, eb = doc["endpoints"]
    assert ea == {"url": A, "usable": True, "score": 4.0, "age_s": 0.5, "error": None, "num_inflight": 0,
                  "sent_since_seq": 0, "load": {"seq": 7, "ranks": [rank(0, 2), rank(1, 0)]}}
    assert eb["usable"] is False and eb["score"] is None and eb["age_s"] == 2.5
    assert eb["error"] == "GET /load failed: ConnectError: refused" and eb["load"]["seq"] == 3  # kept
    assert [(r["endpoint"], r["dp_rank"], r["up"]) for r in doc["ranks"]] == [(A, 0, True), (A, 1, True),
                                                                              (B, 0, False)]


def test_a_stale_endpoints_ranks_are_down_and_before_any_answer_there_is_nothing() -> None:
    a = EndpointLoad(A)
    doc = router_load([a], now_s=1.0, stale_after_s=1.0, seq=0)
    assert doc["age_s"] is None and doc["ranks"] == [] and doc["endpoints"][0]["load"] is None
    a.observe({"seq": 1, "ranks": [rank(0, 0)]}, now_s=1.0)
    assert router_load([a], now_s=1.5, stale_after_s=1.0, seq=1)["ranks"][0]["up"] is True
    assert router_load([a], now_s=3.0, stale_after_s=1.0, seq=1)["ranks"][0]["up"] is False


def test_the_document_passes_the_contract_check_and_scores_as_the_sum_of_the_used_endpoints() -> None:
    a, b = EndpointLoad(A), EndpointLoad(B)
    a.observe({"seq": 1, "ranks": [rank(0, 2)]}, now_s=0.0)
    b.observe({"seq": 1, "ranks": [rank(0, 4)]}, now_s=0.0)
    as_endpoint = EndpointLoad("http://router:1")
    as_endpoint.observe(checked_load(router_load([a, b], now_s=0.1, stale_after_s=1.0, seq=2)), now_s=0.1)
    assert score(as_endpoint, 0.1, 1.0) == score(a, 0.1, 1.0) + score(b, 0.1, 1.0) == 8.0  # type: ignore[operator]
    b.mark_down("ConnectError")
    as_endpoint.observe(checked_load(router_load([a, b], now_s=0.2, stale_after_s=1.0, seq=3)), now_s=0.2)
    assert score(as_endpoint, 0.2, 1.0) == 3.0


@pytest.mark.anyio
async def test_an_outer_router_polls_the_inner_routers_load_and_its_seq_moves_with_the_endpoints() -> None:
    endpoint_seq = 1

    def endpoints(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"seq": endpoint_seq, "ranks": [rank(0, 1)]})

    inner = Poller([A], poll_interval_s=0.05, stale_after_s=1.0)
    app = RouterApp(inner, httpx.AsyncClient(), connect_timeout_s=1.0)
    outer = Poller(["http://inner:1"], poll_interval_s=0.05, stale_after_s=1.0)
    async with (httpx.AsyncClient(transport=httpx.MockTransport(endpoints)) as to_endpoints,
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as to_inner):
        await inner.poll_once(to_endpoints, 0)
        await outer.poll_once(to_inner, 0)
        first = inner.seq
        assert outer.candidates() == [0] and outer.endpoints[0].last_error is None
        await inner.poll_once(to_endpoints, 0)  # the same endpoint seq: nothing changed
        assert inner.seq == first
        endpoint_seq = 2
        await inner.poll_once(to_endpoints, 0)
        assert inner.seq == first + 1
        load = (await to_inner.get("http://inner:1/load")).json()
        assert load["seq"] == first + 1 and load["endpoints"][0]["load"]["seq"] == 2
    await app.http.aclose()


@pytest.mark.anyio
async def test_a_real_router_answers_its_load(tmp_path: Path) -> None:
    async with echo_upstream() as upstream, routed(tmp_path / "router.log", upstream.url) as router:
        with anyio.fail_after(20):
            async with httpx.AsyncClient(base_url=router.base_url, timeout=10) as http:
                r = await http.get("/load")
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        doc = checked_load(r.json())
        assert doc["num_usable"] == 1 and doc["seq"] >= 1 and doc["age_s"] is not None
        assert doc["endpoints"][0]["url"] == upstream.url and doc["endpoints"][0]["load"] == IDLE_LOAD
        assert [r["endpoint"] for r in doc["ranks"]] == [upstream.url]
        assert await stop(router) == 0
