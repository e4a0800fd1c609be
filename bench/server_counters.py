"""The server-side counters a replay differences (bench/http_replay.py): the prefix-cache tokens queried and hit, and
the requests each rank completed, read from ``GET /metrics`` (Prometheus text) before and after a run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio
import httpx

HIT_QUERIES = "vllm:prefix_cache_queries_total"
HIT_HITS = "vllm:prefix_cache_hits_total"
SUCCESS = "vllm:request_success_total"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_prometheus(text: str) -> Samples:
    """Prometheus text exposition as ``{(sample name, labels): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): float(s.value)
            for family in text_string_to_metric_families(text) for s in family.samples}


def by_engine(samples: Samples, name: str) -> dict[str, float]:
    """Counter ``name`` summed per ``engine`` label (over every other label)."""
    out: dict[str, float] = {}
    for (n, labels), value in samples.items():
        if n == name:
            engine = dict(labels).get("engine", "")
            out[engine] = out.get(engine, 0.0) + value
    return out


@dataclass(frozen=True)
class ServerCounters:
    """The server's cumulative counters that a replay differences: prefix-cache tokens and requests per rank."""

    queries: float = 0.0
    hits: float = 0.0
    requests_by_engine: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_text(cls, text: str) -> ServerCounters:
        s = parse_prometheus(text)
        return cls(sum(by_engine(s, HIT_QUERIES).values()), sum(by_engine(s, HIT_HITS).values()),
                   by_engine(s, SUCCESS))

    def minus(self, before: ServerCounters) -> ServerCounters:
        engines = sorted(set(self.requests_by_engine) | set(before.requests_by_engine))
        return ServerCounters(self.queries - before.queries, self.hits - before.hits,
                              {e: self.requests_by_engine.get(e, 0.0) - before.requests_by_engine.get(e, 0.0)
                               for e in engines})

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries > 0 else 0.0

    def load_ratio(self, dp_size: int) -> float:
        """The busiest rank's completed requests over the mean of ``dp_size`` ranks."""
        counts = list(self.requests_by_engine.values())
        total = sum(counts)
        return max(counts) / (total / dp_size) if total > 0 else 0.0


async def scrape(client: httpx.AsyncClient) -> ServerCounters:
    with anyio.fail_after(10.0):
        resp = await client.get("/metrics")
    resp.raise_for_status()
    return ServerCounters.from_text(resp.text)


async def settled(client: httpx.AsyncClient, before: ServerCounters, completed: int,
                  deadline_s: float = 5.0) -> ServerCounters:
    """The counters once the server has counted ``completed`` more requests (its stats ride on the engine's
    outputs and can trail the last token a little), or whatever they are at the deadline."""
    after = await scrape(client)
    with anyio.move_on_after(deadline_s):
        while sum(after.minus(before).requests_by_engine.values()) < completed:
            await anyio.sleep(0.1)
            after = await scrape(client)
    return after
