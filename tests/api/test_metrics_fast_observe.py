"""The metrics' per-request fast path records exactly what prometheus_client's own calls record: a histogram
observation through ``FastHistogram`` (a bisection for the bucket) lands in the same bucket with the same sum as
``Histogram.observe`` for every amount (on a bound, next to one, beyond the last, negative, infinite, NaN, an int),
and an engine's series are still made on first use only (a series shows on ``/metrics`` once recorded)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from asyncdp.api import metrics as metrics_module
from asyncdp.api.metric_values import FastHistogram
from asyncdp.api.metrics import Metrics

BUCKET_SETS = {
    "ttft": metrics_module._TTFT_BUCKETS,
    "itl": metrics_module._ITL_BUCKETS,
    "latency": metrics_module._LATENCY_BUCKETS,
    "tokens": metrics_module._TOKEN_BUCKETS,
    "iteration": metrics_module._ITERATION_TOKEN_BUCKETS,
    "n": metrics_module._N_BUCKETS,
}


def _amounts(buckets: tuple[float, ...]) -> list[float]:
    near = [x for b in buckets for x in (b, math.nextafter(b, -math.inf), math.nextafter(b, math.inf))]
    return [0, 0.0, -1.0, 1, 7, 3.0e-4, 1e12, math.inf, -math.inf, math.nan, *near]


def _child(buckets: tuple[float, ...]) -> object:
    h = Histogram("h", "doc", ["engine"], registry=CollectorRegistry(), buckets=buckets)
    return h.labels("0")


def _state(child: object) -> tuple[list[float], float]:
    return [b.get() for b in child._buckets], child._sum.get()  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(BUCKET_SETS))
def test_each_amount_lands_where_prometheus_client_puts_it(name):
    buckets = BUCKET_SETS[name]
    for amount in _amounts(buckets):
        fast_child, reference = _child(buckets), _child(buckets)
        fast = FastHistogram.of(fast_child)
        assert isinstance(fast, FastHistogram)
        fast.observe(amount)
        reference.observe(amount)  # type: ignore[attr-defined]
        got, want = _state(fast_child), _state(reference)
        assert got[0] == want[0], (name, amount)
        assert got[1] == want[1] or (math.isnan(got[1]) and math.isnan(want[1])), (name, amount)


def test_a_child_without_the_expected_internals_is_used_as_it_is():
    class Plain:
        def observe(self, amount: float) -> None:
            pass

    plain = Plain()
    assert FastHistogram.of(plain) is plain


def _series_names(m: Metrics) -> set[str]:
    return {s.name for family in text_string_to_metric_families(m.render().decode()) for s in family.samples}


def test_an_engines_series_are_made_on_first_use_only():
    m = Metrics(model_name="m", multiproc_dir=None)
    m.record_first_token(0, 0.002)
    names = _series_names(m)
    assert "vllm:time_to_first_token_seconds_count" in names
    assert "vllm:e2e_request_latency_seconds_count" not in names
    assert "vllm:prompt_tokens_total" not in names
    m.add_tokens(0, 5, 0)
    m.record_request_finished(0, "length", 0.01, 0.001, prompt_tokens=5, generation_tokens=1, prefill_s=0.002)
    samples = {(s.name, s.labels.get("engine")): s.value
               for family in text_string_to_metric_families(m.render().decode()) for s in family.samples}
    assert samples[("vllm:prompt_tokens_total", "0")] == 5
    assert samples[("vllm:e2e_request_latency_seconds_count", "0")] == 1
    assert samples[("vllm:request_prefill_time_seconds_sum", "0")] == 0.002
