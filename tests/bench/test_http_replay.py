"""bench/http_replay.py without a server: the request a record becomes, SSE and Prometheus parsing, the counters'
differences, the metrics of a replay, and the replay itself over httpx's MockTransport (a fake server that streams
what a completions endpoint streams); one slow test runs bench/routing_real.py on a real tiny-dense -dp 2."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import msgspec
import pytest

from asyncdp.bench.materialise import Materialiser
from asyncdp.bench.records import resolve
from asyncdp.bench.simulate import RequestEvent, RunLog
from asyncdp.bench.workloads import build
from asyncdp.errors import ConfigError
from bench import http_replay as hr
from bench import server_counters as sc

ROOT = Path(__file__).resolve().parents[2]
TINY = {"groups": 2, "prompts_per_group": 2, "system_len": 48, "question_len": 8, "output_len": 4,
        "arrival": "burst", "dp": 2}

METRICS_TEXT = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 300.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 50.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0
vllm:request_success_total{engine="1",finished_reason="length",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 7.0
"""


def tiny_workload(**options):
    return resolve(hr.fit_to_model(build("w1", "quick", 1, {**TINY, **options})))


# ---------------------------------------------------------------------- pure parts


def test_a_record_becomes_a_streamed_token_id_completion_of_exactly_its_output_length():
    body = hr.completion_body("m", [5, 6, 7], 12)
    assert body["prompt"] == [5, 6, 7]
    assert body["max_tokens"] == body["min_tokens"] == 12
    assert body["ignore_eos"] is True and body["temperature"] == 0.0 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_fit_to_model_draws_prompts_from_the_byte_vocabulary_and_refuses_records_too_long():
    workload = hr.fit_to_model(build("w1", "quick", 1, TINY))
    assert workload.vocab_size == hr.TINY_VOCAB and workload.max_model_len == hr.TINY_MAX_MODEL_LEN
    tokens = [t for r in workload.records for t in Materialiser(workload.seed, workload.vocab_size).prompt(r)]
    assert max(tokens) < hr.TINY_VOCAB
    with pytest.raises(ConfigError, match="record 0 needs 57\\+4 tokens, more than max_model_len 60"):
        hr.fit_to_model(build("w1", "quick", 1, TINY), max_model_len=60)


def test_only_loopback_base_urls_are_accepted():
    hr.check_loopback("http://127.0.0.1:8000")
    for url in ("http://localhost:8000", "http://10.0.0.1:8000", "https://example.com"):
        with pytest.raises(ConfigError, match="only sends to 127.0.0.1"):
            hr.check_loopback(url)


def test_sse_lines_parse_to_chunks_the_done_marker_or_nothing():
    assert hr.parse_sse_line('data: {"choices": []}') == {"choices": []}
    assert hr.parse_sse_line("data: [DONE]") == hr.DONE
    assert hr.parse_sse_line("") is None
    assert hr.parse_sse_line(": keep-alive") is None


def test_tokens_come_from_choice_chunks_usage_and_not_from_the_final_usage_chunk():
    assert hr.chunk_tokens({"choices": [{"text": "a"}], "usage": {"completion_tokens": 3}}) == 3
    assert hr.chunk_tokens({"choices": [], "usage": {"completion_tokens": 9}}) is None
    assert hr.chunk_tokens({"choices": [{"text": "a"}], "usage": None}) is None
    assert hr.error_text({"error": {"message": "boom", "code": 500}}) == "boom"
    assert hr.error_text({"choices": []}) is None


def test_prometheus_text_parses_to_samples_by_name_and_labels():
    samples = sc.parse_prometheus(METRICS_TEXT)
    assert samples[("vllm:prefix_cache_hits_total", frozenset({("engine", "1"), ("model_name", "m")}))] == 50.0
    assert sc.by_engine(samples, sc.SUCCESS) == {"0": 4.0, "1": 2.0}
    assert len(samples) == 7


def test_counters_difference_per_engine_and_give_hit_rate_and_load_ratio():
    before = sc.ServerCounters.from_text(METRICS_TEXT)
    assert (before.queries, before.hits) == (400.0, 50.0)
    after = sc.ServerCounters(queries=1400.0, hits=650.0, requests_by_engine={"0": 10.0, "1": 2.0, "2": 4.0})
    delta = after.minus(before)
    assert (delta.queries, delta.hits, delta.hit_rate) == (1000.0, 600.0, 0.6)
    assert delta.requests_by_engine == {"0": 6.0, "1": 0.0, "2": 4.0}
    assert delta.load_ratio(dp_size=2) == 6.0 / 5.0
    assert sc.ServerCounters().hit_rate == 0.0 and sc.ServerCounters().load_ratio(2) == 0.0


def test_summarise_takes_times_from_the_client_and_hit_rate_and_balance_from_the_server():
    log = RunLog(dp_size=2, events=[
        RequestEvent(0, 0, -1, 0.0, 100, True, t_first_s=0.5, t_last_s=1.5, output_tokens=11),
        RequestEvent(1, 0, -1, 1.0, 100, True, t_first_s=2.0, t_last_s=3.0, output_tokens=11),
        RequestEvent(2, 0, -1, 1.0, 100, True, error="HTTP 500"),
    ])
    got = hr.summarise(log, sc.ServerCounters(200.0, 50.0, {"0": 2.0, "1": 0.0}))
    assert got["ttft_mean_s"] == pytest.approx(0.75) and got["ttft_p99_s"] == pytest.approx(1.0)
    assert got["tpot_mean_s"] == pytest.approx(0.1)
    assert got["prefix_hit_rate"] == 0.25 and got["max_mean_load_ratio"] == 2.0
    assert (got["completed"], got["failed"]) == (2.0, 1.0)


def test_ratios_divide_by_the_base_and_give_nan_where_it_is_zero():
    got = hr.ratios({"vllm": {"x": 2.0, "y": 0.0}, "a": {"x": 1.0, "y": 3.0}}, "vllm", ("x", "y"))
    assert got["a"]["x"] == 0.5 and got["vllm"]["x"] == 1.0 and math.isnan(got["a"]["y"])


def test_w2_is_not_given_a_dp_option_it_lacks_and_a_preset_on_a_workload_without_presets_says_so():
    ap = argparse.ArgumentParser()
    hr.add_workload_args(ap)
    # w2 has no dp option: the replay no longer gives it one, so what stops it is its own need (a measured R_sat)
    with pytest.raises(ConfigError, match="needs the measured R_sat"):
        hr.workload_from_args(ap.parse_args(["--workload", "w2"]))
    with pytest.raises(ConfigError, match="w1 has no presets"):
        build("w1@nosuch", "quick", 1)


def test_cli_args_give_a_resolved_dp2_workload_with_the_kv_hint_and_server_flags_to_match():
    ap = argparse.ArgumentParser()
    hr.add_workload_args(ap)
    workload = hr.workload_from_args(ap.parse_args(["--options", json.dumps(TINY), "--kv-blocks", "40"]))
    assert workload.resolved and workload.dp_size == 2 and workload.kv_blocks_per_rank == 40
    assert len(workload.records) == 4 and workload.vocab_size == hr.TINY_VOCAB
    flags = hr.server_flags(workload, kv_blocks=999, max_num_seqs=8, max_num_batched_tokens=512)
    assert flags[:2] == ["-dp", "2"]
    assert flags[flags.index("--num-kv-blocks") + 1] == "40"  # the workload's hint wins over the profile's
    assert flags[flags.index("--max-num-seqs") + 1] == "8"
    assert flags[flags.index("--max-model-len") + 1] == "2048"


def test_a_mooncake_trace_becomes_a_dp2_workload_whose_shared_ids_share_prompt_tokens(tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 100, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]},
            {"timestamp": 350, "input_length": 520, "output_length": 3, "hash_ids": [7, 9]}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ap = argparse.ArgumentParser()
    hr.add_workload_args(ap)
    workload = hr.workload_from_args(ap.parse_args(["--trace", str(trace)]))
    assert workload.dp_size == 2 and [r.t_arrival_ms for r in workload.records] == [0.0, 250.0]
    first, second = (Materialiser(workload.seed, workload.vocab_size).prompt(r) for r in workload.records)
    assert len(first) == 600 and first[:512] == second[:512] and first[512:520] != second[512:]


# ---------------------------------------------------------------------- the replay over a fake server


class FakeServer:
    """Streams ``max_tokens`` chunks with continuous usage (or ``short`` fewer, or an HTTP ``status``), counts
    prompt tokens as prefix-cache queries and requests per engine (alternating), and serves /metrics."""

    def __init__(self, *, short: int = 0, status: int = 200, hang_s: float = 0.0,
                 stall_after: int | None = None) -> None:
        self.short, self.status, self.hang_s = short, status, hang_s
        self.stall_after = stall_after  # stream this many token chunks, then hang_s before the rest
        self.bodies: list[dict] = []
        self.queries = 0
        self.done: dict[str, int] = {"0": 0, "1": 0}

    def metrics(self) -> str:
        lines = [f'vllm:prefix_cache_queries_total{{engine="0"}} {self.queries}',
                 f'vllm:prefix_cache_hits_total{{engine="0"}} {self.queries // 4}']
        lines += [f'vllm:request_success_total{{engine="{e}"}} {n}' for e, n in self.done.items()]
        return "\n".join(lines) + "\n"

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.metrics())
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.hang_s and self.stall_after is None:
            await anyio.sleep(self.hang_s)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "nope"}})
        n = body["max_tokens"] - self.short
        chunks = [{"choices": [{"index": 0, "text": "x"}],
                   "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": i}} for i in range(1, n + 1)]
        chunks.append({"choices": [], "usage": {"completion_tokens": n}})
        self.queries += len(body["prompt"])
        self.done[str(len(self.bodies) % 2)] += 1
        lines = [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]
        if self.stall_after is not None:
            return httpx.Response(200, content=self._stalling(lines), headers={"content-type": "text/event-stream"})
        return httpx.Response(200, content=b"".join(lines), headers={"content-type": "text/event-stream"})

    async def _stalling(self, lines):
        for k, line in enumerate(lines):
            if k == self.stall_after:
                await anyio.sleep(self.hang_s)
            yield line


async def fake_replay(workload, fake, **kw):
    return await hr.replay("http://127.0.0.1:1", workload, transport=httpx.MockTransport(fake.handle), **kw)


@pytest.mark.anyio
async def test_replay_sends_every_record_as_its_materialised_prompt_and_counts_its_tokens():
    workload, fake = tiny_workload(), FakeServer()
    rep = await fake_replay(workload, fake)
    mat = Materialiser(workload.seed, workload.vocab_size)
    assert sorted(b["prompt"] for b in fake.bodies) == sorted(mat.prompt(r) for r in workload.records)
    assert [e.req_id for e in rep.log.events] == [0, 1, 2, 3]
    assert all(e.error is None and e.output_tokens == 4 and e.t_send_s <= e.t_first_s <= e.t_last_s
               for e in rep.log.events)
    total = sum(r.input_length for r in workload.records)
    assert (rep.server.queries, rep.server.hits) == (total, total // 4)
    assert rep.metrics()["completed"] == 4 and rep.metrics()["max_mean_load_ratio"] == 1.0


@pytest.mark.anyio
async def test_replay_sends_a_dependent_turn_only_after_its_predecessor_finished():
    workload = tiny_workload()
    records = list(workload.records)
    records[1] = msgspec.structs.replace(records[1], after_req=0, think_ms=20.0)
    workload = msgspec.structs.replace(workload, records=tuple(records))
    fake = FakeServer()
    rep = await fake_replay(workload, fake)
    first, second = rep.log.events[0], rep.log.events[1]
    assert second.t_send_s >= first.t_last_s + 0.02
    assert fake.bodies[-1]["prompt"] == Materialiser(workload.seed, workload.vocab_size).prompt(records[1])


@pytest.mark.anyio
async def test_a_short_stream_or_an_http_error_is_an_error_event_not_a_measurement():
    rep = await fake_replay(tiny_workload(), FakeServer(short=2))
    assert {e.error for e in rep.log.events} == {"got 2 tokens, expected 4"}
    rep = await fake_replay(tiny_workload(), FakeServer(status=400))
    assert all(e.error is not None and e.error.startswith("HTTP 400") for e in rep.log.events)
    assert rep.metrics()["completed"] == 0 and rep.metrics()["failed"] == 4


@pytest.mark.anyio
async def test_requests_unfinished_at_the_deadline_are_deadline_errors():
    rep = await fake_replay(tiny_workload(), FakeServer(hang_s=30.0), deadline_s=0.2)
    assert [e.error for e in rep.log.events] == ["deadline"] * 4


@pytest.mark.anyio
async def test_a_stream_cut_off_by_the_deadline_is_a_deadline_error_not_a_completion():
    rep = await fake_replay(tiny_workload(), FakeServer(stall_after=2, hang_s=30.0), deadline_s=0.3)
    assert all(e.output_tokens == 2 and e.t_first_s is not None for e in rep.log.events)  # streamed in part
    assert [e.error for e in rep.log.events] == ["deadline"] * 4
    assert rep.metrics()["completed"] == 0 and rep.metrics()["failed"] == 4


# ---------------------------------------------------------------------- the real thing (slow)


@pytest.mark.slow
def test_routing_real_runs_two_policies_on_a_real_server_and_reports_ratios(tmp_path):
    out = tmp_path / "out.json"
    options = {"groups": 2, "prompts_per_group": 3, "system_len": 64, "question_len": 8, "output_len": 4}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "routing_real.py"), "--policies", "vllm,asyncdp",
                           "--options", json.dumps(options), "--rate", "20", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert set(result["policies"]) == {"vllm", "asyncdp"}
    assert all(m["completed"] == 6 and m["prefix_hit_rate"] > 0 for m in result["policies"].values())
    assert result["ratio_to_vllm"]["vllm"]["ttft_mean_s"] == 1.0
    assert "ratio to vllm" in proc.stdout


def test_sim_validation_prints_measured_over_predicted_and_each_policy_over_the_first():
    from bench import sim_validation as sv

    pred = dict.fromkeys(sv.KEYS, 0.5)
    meas = {**pred, "ttft_mean_s": 1.0, "prefix_hit_rate": 0.25}
    text = sv.side_by_side(pred, meas)
    assert "ttft_mean_s" in text.splitlines()[1] and text.splitlines()[1].endswith("2.00")
    assert text.splitlines()[-1].endswith("0.50")  # prefix_hit_rate, the last key
    out = {"vllm": {"predicted": pred, "measured": pred},
           "asyncdp": {"predicted": {**pred, "ttft_mean_s": 0.25}, "measured": {**pred, "ttft_mean_s": 0.4}}}
    assert "0.50 vs 0.80" in sv.policy_ratios(out).splitlines()[-1]
