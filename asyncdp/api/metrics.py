"""Prometheus metrics of an API-server process, with vLLM's names and labels (spec §12.3, §10).

The DP client owns one :class:`Metrics` and calls its ``record_*`` / ``set_*`` / ``inc_*`` methods; the HTTP
layer only calls :meth:`Metrics.render` for ``GET /metrics``. Labels are ``model_name`` and ``engine`` (the
global ``dp_rank`` as a string).

Several API processes on one node: when ``PROMETHEUS_MULTIPROC_DIR`` is set (read through
:func:`asyncdp.config.flags.prometheus_multiproc_dir`), values live in per-process files in that directory and
``render()`` aggregates every process's files, so any process answers for the node. Counters and histograms
are summed (each request is counted by the one client that owns it); engine-state gauges use "mostrecent"
(the engine sends its scheduler stats to one client per step, so the newest write wins); per-client gauges
such as in-flight counts are summed over live processes. Without the directory, a private registry is used.

"Newest" is by the engine's clock: each engine-state write carries the timestamp the rank stamped on the message
(``set_engine_state(..., at=)``), not the time this process got round to it, so a stale report that one API process
applies late (its event loop was busy) cannot override the newer one another process applied before it, and an
idle rank's gauges read 0 on every scrape. Local events (a rank ready, a rank dead) are written just after the
newest report this process applied for the rank.

Cumulative engine counters (preemptions, prefix-cache queries/hits) are added as deltas: the caller passes
what changed since the stats it last received, so sums over processes stay exact.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    values,
)
from prometheus_client.multiprocess import MultiProcessCollector

from asyncdp.api.metric_values import EngineSeries, fast_writer, set_at
from asyncdp.config.flags import prometheus_multiproc_dir

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets (seconds).
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)

# vLLM's 1-2-5 series for token counts (vLLM stops at max_model_len; the buckets above it stay empty).
_TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5))
_ITERATION_TOKEN_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)

_E = ("model_name", "engine")
# The ``finished_reason`` values of ``vllm:request_success_total`` (vLLM's FinishReason that asyncdp's engine
# produces; ``error``: a structured-output grammar that failed mid-generation).
FINISHED_REASONS = ("stop", "length", "abort", "error")


class Metrics:
    """All metrics of one API-server process. ``engine`` arguments are global dp ranks (int or str)."""

    def __init__(self, *, model_name: str, multiproc_dir: str | None = None) -> None:
        self.model_name = model_name
        self.multiproc_dir = multiproc_dir if multiproc_dir is not None else prometheus_multiproc_dir()
        if self.multiproc_dir is not None and not _multiprocess_values_enabled():
            # prometheus_client chose its value class at import, before the directory was known here.
            values.ValueClass = values.MultiProcessValue()
        # vLLM exposes no *_created series; dashboards written for it do not expect them.
        disable_created_metrics()
        # Metrics register into a private registry: several Metrics objects may live in one process (tests).
        self._registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[Any, int | str, tuple[str, ...]], Any] = {}  # as writers (see _c)
        self._series: dict[int | str, EngineSeries] = {}  # per engine: its writers by attribute (see _s)
        self._newest_at: dict[int | str, float] = {}  # per engine: the engine time of the newest state written
        r = self._registry

        def gauge(name: str, doc: str, mode: Any = "mostrecent", labels: Iterable[str] = _E) -> Gauge:
            return Gauge(name, doc, list(labels), registry=r, multiprocess_mode=mode)

        def counter(name: str, doc: str, labels: Iterable[str] = _E) -> Counter:
            return Counter(name, doc, list(labels), registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, list(_E), registry=r, buckets=buckets)

        self.num_requests_running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_cache_usage_perc = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.request_success = counter("vllm:request_success", "Count of successfully processed requests.",
                                       (*_E, "finished_reason"))
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.num_preemptions = counter("vllm:num_preemptions", "Cumulative number of preemptions.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self.time_to_first_token = histogram("vllm:time_to_first_token_seconds",
                                             "Histogram of time to first token in seconds.", _TTFT_BUCKETS)
        self.inter_token_latency = histogram("vllm:inter_token_latency_seconds",
                                             "Histogram of inter-token latency in seconds.", _ITL_BUCKETS)
        self.e2e_request_latency = histogram("vllm:e2e_request_latency_seconds",
                                             "Histogram of e2e request latency in seconds.", _LATENCY_BUCKETS)
        self.request_queue_time = histogram("vllm:request_queue_time_seconds",
                                            "Histogram of time spent in WAITING phase for request.",
                                            _LATENCY_BUCKETS)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                               _TOKEN_BUCKETS)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                          _ITERATION_TOKEN_BUCKETS)
        self.request_max_num_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.",
            _TOKEN_BUCKETS)
        self.request_params_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.", _N_BUCKETS)
        self.request_params_max_tokens = histogram("vllm:request_params_max_tokens",
                                                   "Histogram of the max_tokens request parameter.", _TOKEN_BUCKETS)
        self.request_generation_tokens = histogram("vllm:request_generation_tokens",
                                                   "Number of generation tokens processed.", _TOKEN_BUCKETS)
        self.request_time_per_output_token = histogram("vllm:request_time_per_output_token_seconds",
                                                       "Histogram of time_per_output_token_seconds per request.",
                                                       _ITL_BUCKETS)
        self.request_decode_time = histogram("vllm:request_decode_time_seconds",
                                             "Histogram of time spent in DECODE phase for request.", _LATENCY_BUCKETS)
        self.request_prefill_time = histogram("vllm:request_prefill_time_seconds",
                                              "Histogram of time spent in PREFILL phase for request.", _LATENCY_BUCKETS)
        self.request_inference_time = histogram("vllm:request_inference_time_seconds",
                                                "Histogram of time spent in RUNNING phase for request.",
                                                _LATENCY_BUCKETS)
        self.dp_wave = gauge("asyncdp:dp_wave", "MoE: the rank's current wave number.")
        self.dp_running = gauge("asyncdp:dp_running", "MoE: 1 while the rank's wave is running.")
        self.dp_waves_completed = counter("asyncdp:dp_waves_completed", "MoE: waves this rank has completed.")
        self.dp_dummy_steps = counter("asyncdp:dp_dummy_steps", "Dummy forward passes run by the rank.")
        self.dp_lb_decisions = counter("asyncdp:dp_lb_decisions", "Load-balancing decisions per engine.",
                                       (*_E, "reason"))
        self.dp_inflight_requests = gauge("asyncdp:dp_inflight_requests",
                                          "Requests in flight per engine from this node's clients.", "livesum")
        self.dp_coordinator_snapshot_age = gauge(
            "asyncdp:dp_coordinator_snapshot_age_seconds", "Seconds since the last coordinator stats snapshot.",
            "mostrecent", ("model_name",))
        self.dp_engine_up = gauge("asyncdp:dp_engine_up", "1 while the engine can serve, else 0.")
        self.dp_coordinator_up = gauge(
            "asyncdp:dp_coordinator_up", "1 while this API server follows the DP coordinator, else 0.",
            "mostrecent", ("model_name",))
        # Gauges whose value depends on the time of the scrape (an age) are refreshed by this hook at render.
        self._before_render: list[Callable[[], None]] = []

    def _l(self, engine: int | str) -> dict[str, str]:
        return {"model_name": self.model_name, "engine": str(engine)}

    def _c(self, metric: Any, engine: int | str, *extra: str) -> Any:
        """``metric``'s child for ``engine`` (and extra label values), as its writer
        (:func:`~asyncdp.api.metric_values.fast_writer`), cached: prometheus_client's ``labels()`` validates and
        stringifies its arguments on every call, which showed in per-request profiles. (The key holds the metric
        itself, hashed by identity: no ``id()`` call on the per-request path.)"""
        key = (metric, engine, extra)
        writer = self._children.get(key)
        if writer is None:
            child = metric.labels(self.model_name, str(engine), *extra)
            writer = self._children[key] = fast_writer(metric, child)
        return writer

    def _s(self, engine: int | str) -> EngineSeries:
        """``engine``'s children without extra labels, by attribute: one lookup per call, not one per series."""
        series = self._series.get(engine)
        if series is None:
            series = self._series[engine] = EngineSeries(self, engine)
        return series

    # ------------------------------------------------------------------ requests
    def add_tokens(self, engine: int | str, prompt_tokens: int, generation_tokens: int) -> None:
        """Count tokens as the engine delivers them: a request's prompt with its first token, every generated
        token as it arrives, whether or not the request later finishes (vLLM counts them per iteration)."""
        s = self._s(engine)
        if prompt_tokens:
            s.prompt_tokens.inc(prompt_tokens)
        if generation_tokens:
            s.generation_tokens.inc(generation_tokens)

    def record_iteration_tokens(self, engine: int | str, num_tokens: int) -> None:
        """One engine step's output to this client: the prompt tokens of the requests that got their first token
        in it plus the tokens generated (vLLM observes each output batch it processes)."""
        self._s(engine).iteration_tokens.observe(num_tokens)

    def record_first_token(self, engine: int | str, ttft_s: float) -> None:
        self._s(engine).time_to_first_token.observe(ttft_s)

    def record_token_gaps(self, engine: int | str, gap_s: float, n: int = 1) -> None:
        """``n`` tokens that arrived together, ``gap_s`` apart on average since the previous ones."""
        itl = self._s(engine).inter_token_latency
        for _ in range(n):
            itl.observe(gap_s)

    def record_request_finished(
        self, engine: int | str, finished_reason: str, e2e_s: float, queue_s: float | None = None, *,
        prompt_tokens: int = 0, generation_tokens: int = 0, decode_s: float = 0.0, prefill_s: float | None = None,
        max_tokens: int | None = None,
    ) -> None:
        """Count one request its engine finished (``stop``, ``length``, ``abort`` by an operator's pause, or
        ``error``) on the engine that owned it, with its sizes and phases as vLLM observes them (``decode_s``: first
        to last token; its mean time per output token is 0 with fewer than two tokens; ``prefill_s``: first
        scheduled to first token, when known; the running phase is prefill plus decode; ``max_tokens``: the
        request's limit, as vLLM resolves it). A request refused at admission, or one whose caller left, is not
        counted here (vLLM's ``request_success`` does not count them)."""
        self._c(self.request_success, engine, finished_reason).inc()
        s = self._s(engine)
        if max_tokens:
            s.request_params_max_tokens.observe(max_tokens)
        s.e2e_request_latency.observe(e2e_s)
        if queue_s is not None:
            s.request_queue_time.observe(queue_s)
        s.request_prompt_tokens.observe(prompt_tokens)
        s.request_generation_tokens.observe(generation_tokens)
        s.request_decode_time.observe(decode_s)
        tpot_s = decode_s / (generation_tokens - 1) if generation_tokens > 1 else 0.0
        s.request_time_per_output_token.observe(tpot_s)
        if prefill_s is not None:
            s.request_prefill_time.observe(prefill_s)
            s.request_inference_time.observe(prefill_s + decode_s)

    def record_sequence_group(self, engine: int | str, n: int, max_generation_tokens: int) -> None:
        """The sequences of one prompt all finished (vLLM's parent request): its ``n`` and its longest output."""
        s = self._s(engine)
        s.request_params_n.observe(n)
        s.request_max_num_generation_tokens.observe(max_generation_tokens)

    # ------------------------------------------------------------------ engine state
    def set_engine_state(self, engine: int | str, running: int, waiting: int, kv_usage: float,
                         at: float | None = None) -> None:
        """The rank's state as of ``at``: the engine's clock, stamped on the report (None: now, on this clock)."""
        at = self._state_time(engine, at)
        s = self._s(engine)
        set_at(s.num_requests_running, running, at)
        set_at(s.num_requests_waiting, waiting, at)
        set_at(s.kv_cache_usage_perc, kv_usage, at)

    def _state_time(self, engine: int | str, at: float | None) -> float:
        if at is None:
            return time.time()
        if at > self._newest_at.get(engine, 0.0):
            self._newest_at[engine] = at
        return at

    def _after_newest(self, engine: int | str) -> float:
        """The time of a local event (the rank ready, or dead): just after the newest report this process applied
        for the rank, so it beats every one of them and loses to any later report, from whichever process (a
        timestamp on this process's clock could lose to a report stamped by a rank whose clock runs ahead)."""
        return math.nextafter(max(self._newest_at.get(engine, 0.0), 1.0), math.inf)

    def add_engine_counters(
        self, engine: int | str, *, preemptions: int = 0, prefix_cache_queries: int = 0, prefix_cache_hits: int = 0,
    ) -> None:
        """Add deltas of the engine's cumulative counters since the caller's last stats."""
        if preemptions:
            self._c(self.num_preemptions, engine).inc(preemptions)
        if prefix_cache_queries:
            self._c(self.prefix_cache_queries, engine).inc(prefix_cache_queries)
        if prefix_cache_hits:
            self._c(self.prefix_cache_hits, engine).inc(prefix_cache_hits)

    def set_engine_up(self, engine: int | str, up: bool) -> None:
        self._c(self.dp_engine_up, engine).set(1 if up else 0)

    def init_engine(self, engine: int | str, *, is_moe: bool = False) -> None:
        """Create the engine's series at 0 once it is ready, as vLLM does for each engine: an idle rank's gauges
        read 0 instead of no data, and the first requests are not lost to ``rate()``, which needs a sample before
        the first increment. A MoE rank gets its wave gauges and counters too."""
        self.set_engine_state(engine, 0, 0, 0.0, at=self._after_newest(engine))
        if is_moe:
            self.set_wave(engine, 0, False, at=self._after_newest(engine))
            self._c(self.dp_waves_completed, engine)
            self._c(self.dp_dummy_steps, engine)
        self.set_inflight(engine, 0)
        for reason in FINISHED_REASONS:
            self._c(self.request_success, engine, reason)
        for metric in (self.prompt_tokens, self.generation_tokens, self.num_preemptions, self.prefix_cache_queries,
                       self.prefix_cache_hits, self.time_to_first_token, self.inter_token_latency,
                       self.e2e_request_latency, self.request_queue_time, self.request_prompt_tokens,
                       self.request_generation_tokens, self.request_time_per_output_token, self.request_decode_time,
                       self.request_prefill_time, self.request_inference_time, self.iteration_tokens,
                       self.request_max_num_generation_tokens, self.request_params_n, self.request_params_max_tokens):
            self._c(metric, engine)

    def clear_engine_state(self, engine: int | str, *, is_moe: bool = True) -> None:
        """A dead rank runs nothing: zero its state and (MoE) wave gauges, which would otherwise stay frozen at its
        last report (zeroed rather than removed: in multiprocess mode every process's last write is kept; every
        API process clears, so the one that applied the rank's newest report writes the newest 0). A dense rank
        never had wave gauges: none are created for it."""
        self.set_engine_state(engine, 0, 0, 0.0, at=self._after_newest(engine))
        if is_moe:
            self.set_wave(engine, 0, False, at=self._after_newest(engine))

    # ------------------------------------------------------------------ DP
    def inc_lb_decision(self, engine: int | str, reason: str) -> None:
        """``reason``: ``score`` (chosen by the policy), ``hint`` (pinned by a rank hint) or ``directory`` (the
        coordinator's prefix directory named the rank: several API servers, a new prefix)."""
        self._c(self.dp_lb_decisions, engine, reason).inc()

    def set_inflight(self, engine: int | str, n: int) -> None:
        self._s(engine).dp_inflight_requests.set(n)

    def set_snapshot_age(self, s: float) -> None:
        self.dp_coordinator_snapshot_age.labels(model_name=self.model_name).set(s)

    def set_coordinator_up(self, up: bool) -> None:
        self.dp_coordinator_up.labels(model_name=self.model_name).set(1 if up else 0)

    def on_render(self, refresh: Callable[[], None]) -> None:
        """Run ``refresh`` before every render: it sets gauges that are only true at the time of the scrape
        (the coordinator snapshot's age). In multiprocess mode the rendering process writes last, so the node's
        page shows the age this process sees, as its ``/server_info`` does."""
        self._before_render.append(refresh)

    def set_wave(self, engine: int | str, wave: int, running: bool, at: float | None = None) -> None:
        """The rank's wave as of ``at``, as in :meth:`set_engine_state`."""
        at = self._state_time(engine, at)
        set_at(self._c(self.dp_wave, engine), wave, at)
        set_at(self._c(self.dp_running, engine), 1 if running else 0, at)

    def inc_waves_completed(self, engine: int | str, n: int = 1) -> None:
        self._c(self.dp_waves_completed, engine).inc(n)

    def add_dummy_steps(self, engine: int | str, n: int) -> None:
        self._c(self.dp_dummy_steps, engine).inc(n)

    # ------------------------------------------------------------------ exposition
    def render(self) -> bytes:
        """Prometheus text exposition: this process's metrics, or the whole node's in multiprocess mode."""
        for refresh in self._before_render:
            refresh()
        if self.multiproc_dir is None:
            return generate_latest(self._registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.multiproc_dir)
        return generate_latest(registry)


def _multiprocess_values_enabled() -> bool:
    return values.ValueClass is not values.MutexValue


def mark_process_dead(pid: int, multiproc_dir: str | None = None) -> None:
    """Drop a dead API process's live gauges (call from the launcher when a child exits)."""
    from prometheus_client import multiprocess

    path = multiproc_dir if multiproc_dir is not None else prometheus_multiproc_dir()
    if path is not None:
        multiprocess.mark_process_dead(pid, path)
