"""/metrics against the truth of a counted workload, on a real dp=2 deployment behind two API-server processes.

The workload is known request by request (completions and chats, streamed and not, ``n=2``, a stop string, cut by
``max_tokens``, two prompts sharing a prefix, 400s, a disconnect mid-stream, a ``pause?mode=abort``), so every
series can be compared with what must be there: successes per ``finished_reason``, token counters against the
``usage`` the responses reported, histogram counts against the requests and tokens that feed them, prefix-cache
queries and hits, gauges back to 0 when idle. Each read of /metrics is a fresh connection, so reads land on either
API process; each must show the same node-wide numbers. The exposition itself must parse, with HELP and TYPE for
every family, no duplicate series and one label set per family.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MODEL, serve
from tests.e2e.metrics_text import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

Sample = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> dict[Sample, float]:
    """Every sample of a valid exposition; fails on a duplicate series, a family without HELP or TYPE, or a family
    whose series do not share one label set."""
    out: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        assert f"# HELP {family.name}" in text and f"# TYPE {family.name}" in text, family.name
        label_sets = {frozenset(s.labels) - {"le"} for s in family.samples}
        assert len(label_sets) <= 1, (family.name, label_sets)
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def total(got: dict[Sample, float], name: str, **match: str) -> float:
    return sum(v for (n, labels), v in got.items() if n == name and match.items() <= dict(labels).items())


def per_engine(got: dict[Sample, float], name: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (n, labels), v in got.items():
        if n == name:
            out[dict(labels)["engine"]] += v
    return dict(out)


async def scrape(base_url: str) -> dict[Sample, float]:
    return parse(await read_metrics(base_url))


async def settled(base_url: str) -> dict[Sample, float]:
    """Poll until two reads (likely from different API processes) agree and every rank is idle; return the last."""
    with anyio.fail_after(10):
        while True:
            a, b = await scrape(base_url), await scrape(base_url)
            counters = [k for k in a if k[0].endswith(("_total", "_count", "_sum"))]
            idle = all(v == 0 for k, v in b.items() if k[0] in (
                "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "asyncdp:dp_inflight_requests"))
            if idle and all(a[k] == b.get(k) for k in counters):
                return b
            await anyio.sleep(0.1)


class Truth:
    """What the responses said: successes per reason, sequences, prompt and generated tokens."""

    def __init__(self) -> None:
        self.reasons: dict[str, int] = defaultdict(int)
        self.prompt_tokens = 0  # counted once per sequence, as the metric counts them
        self.generation_tokens = 0

    def completion(self, body: dict) -> None:
        choices, usage = body["choices"], body["usage"]
        for c in choices:
            self.reasons[c["finish_reason"]] += 1
        self.prompt_tokens += usage["prompt_tokens"] * len(choices)
        self.generation_tokens += usage["completion_tokens"]


async def stream_events(http: httpx.AsyncClient, path: str, body: dict, *, stop_after: int | None = None,
                        on_event: Callable[[], object] = lambda: None) -> list[dict]:
    events = []
    async with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[len("data: "):]))
                on_event()
                if stop_after is not None and len(events) == stop_after:
                    break
    return events


async def test_metrics_match_a_counted_workload(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "2", "--api-server-count", "2") as server:
        base = server.base_url
        with anyio.fail_after(60):
            idle = await settled(base)
            for engine in ("0", "1"):  # every engine's series exist before its first request, at 0
                labels = {"engine": engine, "model_name": MODEL}
                for reason in ("stop", "length", "abort"):
                    assert total(idle, "vllm:request_success_total", finished_reason=reason, **labels) == 0
                for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                             "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                             "vllm:e2e_request_latency_seconds_count"):
                    assert (name, tuple(sorted(labels.items()))) in idle, (name, engine)
            truth = Truth()
            first_tokens = 0
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                for i in range(3):  # cut by max_tokens
                    r = await http.post("/v1/completions", json={"model": MODEL, "prompt": f"count {i}",
                                                                 "max_tokens": 4, "ignore_eos": True})
                    truth.completion(r.json())
                r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "two of them", "n": 2,
                                                             "max_tokens": 3, "ignore_eos": True})
                truth.completion(r.json())
                for i in range(2):  # streamed chats, usage in the last chunk
                    events = await stream_events(http, "/v1/chat/completions", {
                        "model": MODEL, "messages": [{"role": "user", "content": f"chat {i}"}], "max_tokens": 5,
                        "ignore_eos": True, "stream_options": {"include_usage": True}})
                    truth.reasons[next(c["finish_reason"] for e in events for c in e["choices"]
                                       if c.get("finish_reason"))] += 1
                    usage = events[-1]["usage"]
                    truth.prompt_tokens += usage["prompt_tokens"]
                    truth.generation_tokens += usage["completion_tokens"]
                greedy = {"model": MODEL, "prompt": "stop here", "max_tokens": 8, "ignore_eos": True,
                          "temperature": 0}
                r = await http.post("/v1/completions", json=greedy)
                truth.completion(r.json())
                text = r.json()["choices"][0]["text"]
                r = await http.post("/v1/completions", json={**greedy, "stop": [text[2:4]]})
                assert r.json()["choices"][0]["finish_reason"] == "stop"
                truth.completion(r.json())
                prefix = list(range(65, 65 + 80))  # 80 token ids: 5 blocks of 16
                for tail in (1, 2):  # both on rank 0: the second finds the prefix cached
                    r = await http.post("/v1/completions", json={"model": MODEL, "prompt": [*prefix, tail],
                                                                 "max_tokens": 2, "ignore_eos": True},
                                        headers={"X-data-parallel-rank": "0"})
                    truth.completion(r.json())
                for bad in ({"max_tokens": -1}, {"max_tokens": 2, "temperature": -1}):
                    r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", **bad})
                    assert r.status_code == 400
                first_tokens = sum(truth.reasons.values())
                done = await settled(base)

                def grew(name: str, **match: str) -> float:
                    return total(done, name, **match) - total(idle, name, **match)

                for reason in ("stop", "length", "abort"):
                    assert grew("vllm:request_success_total", finished_reason=reason) == truth.reasons[reason], \
                        reason
                assert grew("vllm:prompt_tokens_total") == truth.prompt_tokens
                assert grew("vllm:generation_tokens_total") == truth.generation_tokens
                successes = sum(truth.reasons.values())
                assert grew("vllm:e2e_request_latency_seconds_count") == successes
                assert grew("vllm:request_queue_time_seconds_count") == successes
                assert grew("vllm:request_prompt_tokens_sum") == truth.prompt_tokens
                assert grew("vllm:request_generation_tokens_sum") == truth.generation_tokens
                assert grew("vllm:request_time_per_output_token_seconds_count") == successes
                assert grew("vllm:request_decode_time_seconds_count") == successes
                assert grew("vllm:request_prefill_time_seconds_count") == successes
                assert grew("vllm:request_inference_time_seconds_count") == successes
                assert grew("vllm:time_to_first_token_seconds_count") == first_tokens
                assert grew("vllm:inter_token_latency_seconds_count") == truth.generation_tokens - first_tokens
                for h in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                          "request_queue_time_seconds", "request_prompt_tokens", "request_generation_tokens",
                          "request_time_per_output_token_seconds", "request_decode_time_seconds",
                          "request_prefill_time_seconds", "request_inference_time_seconds"):
                    assert total(done, f"vllm:{h}_bucket", le="+Inf") == total(done, f"vllm:{h}_count"), h
                # every prompt token is looked up in the prefix cache once; the second prefixed prompt hits 80
                assert grew("vllm:prefix_cache_queries_total") == truth.prompt_tokens
                assert grew("vllm:prefix_cache_hits_total", engine="0") >= 80

                # a disconnect: its tokens count, it is no success
                events = await stream_events(http, "/v1/completions", {
                    "model": MODEL, "prompt": [70] * 10, "max_tokens": 400, "ignore_eos": True}, stop_after=3)
                assert len(events) == 3
                after_disconnect = await settled(base)
                def since_done(name: str) -> float:
                    return total(after_disconnect, name) - total(done, name)

                assert since_done("vllm:request_success_total") == 0
                assert since_done("vllm:e2e_request_latency_seconds_count") == 0
                assert since_done("vllm:prompt_tokens_total") == 10
                assert since_done("vllm:generation_tokens_total") >= 3

                # an operator's abort: a success with reason "abort"
                async with anyio.create_task_group() as tg:
                    got: list[list[dict]] = []
                    streaming = anyio.Event()

                    async def long_stream() -> None:
                        got.append(await stream_events(http, "/v1/completions", {
                            "model": MODEL, "prompt": "long", "max_tokens": 450, "ignore_eos": True},
                            on_event=streaming.set))

                    tg.start_soon(long_stream)
                    await streaming.wait()
                    assert (await http.post("/pause", params={"mode": "abort"})).status_code == 200
                assert (await http.post("/resume")).status_code == 200
                assert got[0][-1]["choices"][0]["finish_reason"] == "abort"
                paused = await settled(base)
                assert total(paused, "vllm:request_success_total", finished_reason="abort") == \
                    total(after_disconnect, "vllm:request_success_total", finished_reason="abort") + 1

                # requests queued while paused show as waiting, though no output carries the rank's stats
                assert (await http.post("/pause", params={"mode": "keep"})).status_code == 200
                async with anyio.create_task_group() as tg:
                    for i in range(2):
                        tg.start_soon(functools.partial(http.post, "/v1/completions", json={
                            "model": MODEL, "prompt": f"held {i}", "max_tokens": 2}))
                    while True:  # (bounded by the test's fail_after)
                        if total(await scrape(base), "vllm:num_requests_waiting") == 2:
                            break
                        await anyio.sleep(0.05)
                    assert (await http.post("/resume")).status_code == 200
                await settled(base)
