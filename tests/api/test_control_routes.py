"""/health, /server_info, /metrics and the pause API, on both backends."""

from __future__ import annotations

import pytest

from asyncdp.api import set_draining
from asyncdp.testing import FakeEngineClient
from tests.api.conftest import running

pytestmark = pytest.mark.anyio


async def test_health_is_200_while_the_client_can_serve() -> None:
    async with running() as srv:
        r = await srv.http.get("/health")
        srv.fake.shutting_down = True
        after = await srv.http.get("/health")
    assert r.status_code == 200
    assert after.status_code == 503


async def test_server_info_returns_the_clients_document_in_json() -> None:
    async with running(FakeEngineClient(num_ranks=2, start_rank=2)) as srv:
        plain = await srv.http.get("/server_info")
        as_json = await srv.http.get("/server_info", params={"config_format": "json"})
        bad = await srv.http.get("/server_info", params={"config_format": "yaml"})
    assert plain.json() == as_json.json() == srv.fake.server_info()
    assert [(r["dp_rank"], r["local_index"]) for r in plain.json()["managed_ranks"]] == [(2, 0), (3, 1)]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "config_format"


async def test_metrics_expose_vllm_names_with_engine_and_reason_labels() -> None:
    fake = FakeEngineClient(num_ranks=2)
    async with running(fake) as srv:
        await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 3},
                            headers={"X-data-parallel-rank": "1"})
        await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 9, "stop": " "})
        fake.metrics.set_engine_state(1, running=2, waiting=5, kv_usage=0.25)
        fake.metrics.set_engine_up(0, True)
        r = await srv.http.get("/metrics")
    text = r.text
    assert r.headers["content-type"].startswith("text/plain")
    for name in ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:num_preemptions_total", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "asyncdp:dp_wave", "asyncdp:dp_running", "asyncdp:dp_waves_completed_total",
                 "asyncdp:dp_dummy_steps_total", "asyncdp:dp_lb_decisions_total", "asyncdp:dp_inflight_requests",
                 "asyncdp:dp_coordinator_snapshot_age_seconds", "asyncdp:dp_engine_up"]:
        assert f"# TYPE {name}" in text, name
    assert 'vllm:request_success_total{engine="1",finished_reason="length",model_name="fake-model"} 1.0' in text
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="fake-model"} 1.0' in text
    assert 'vllm:num_requests_waiting{engine="1",model_name="fake-model"} 5.0' in text
    assert 'vllm:generation_tokens_total{engine="1",model_name="fake-model"} 3.0' in text
    assert "_created" not in text


async def test_pause_resume_and_is_paused_are_utility_calls() -> None:
    async with running() as srv:
        before = await srv.http.get("/is_paused")
        paused = await srv.http.post("/pause", params={"mode": "keep"})
        during = await srv.http.get("/is_paused")
        bad_mode = await srv.http.post("/pause", params={"mode": "later"})
        resumed = await srv.http.post("/resume")
        after = await srv.http.get("/is_paused")
        default_mode = await srv.http.post("/pause")
    assert before.json() == {"is_paused": False}
    assert paused.status_code == 200 and during.json() == {"is_paused": True}
    assert bad_mode.status_code == 400 and bad_mode.json()["error"]["param"] == "mode"
    assert resumed.status_code == 200 and after.json() == {"is_paused": False}
    assert default_mode.status_code == 200
    assert [(m, kw) for (m, _, kw) in srv.fake.utility_calls if m == "pause"] == [
        ("pause", {"mode": "keep"}), ("pause", {"mode": "abort"})]


async def test_utility_failure_while_shutting_down_is_503() -> None:
    async with running() as srv:
        srv.fake.shutting_down = True
        r = await srv.http.post("/pause")
    assert r.status_code == 503


async def test_load_returns_the_clients_load_document_in_json() -> None:
    async with running(FakeEngineClient(num_ranks=2, start_rank=4)) as srv:
        r = await srv.http.get("/load")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == srv.fake.load()
    assert [(rank["dp_rank"], rank["local_index"]) for rank in r.json()["ranks"]] == [(4, 0), (5, 1)]


@pytest.mark.parametrize("route", ["/health", "/ping"])
async def test_health_during_shutdown_says_the_server_is_shutting_down_not_that_no_engine_can_serve(route) -> None:
    async with running() as srv:
        srv.fake.healthy = False
        dead = await srv.http.get(route)
        srv.fake.healthy = True
        srv.fake.shutting_down = True  # the API process began to drain: its client refuses new requests
        stopping = await srv.http.get(route)
        srv.fake.shutting_down = False
        set_draining(srv.app)  # HTTP itself stops taking requests
        draining = await srv.http.get(route)
    assert dead.status_code == 503 and dead.json()["error"]["message"] == "No engine can serve requests."
    for r in (stopping, draining):
        assert r.status_code == 503 and r.json()["error"]["message"] == "The server is shutting down.", r.text


async def test_health_gives_the_clients_own_reason_for_a_503() -> None:
    # A stuck sibling API process turns /health to 503 while every engine serves: the message used to say
    # "No engine can serve requests." all the same.
    class _StuckSibling(FakeEngineClient):
        def health_problem(self) -> str | None:
            return "API server 1 of this node is not responding"

    async with running(_StuckSibling()) as srv:
        r = await srv.http.get("/health")
    assert r.status_code == 503 and r.json()["error"]["message"] == "API server 1 of this node is not responding"
