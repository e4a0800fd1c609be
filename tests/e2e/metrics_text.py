"""Reading the Prometheus text of ``/metrics`` in end-to-end tests: per-engine sums of one metric."""

from __future__ import annotations

import re

import httpx

_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def per_engine(text: str, name: str, **match: str) -> dict[str, float]:
    """Sum of ``name`` per ``engine`` label over all other labels (those in ``match`` must be equal)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None or m["name"] != name:
            continue
        labels = dict(_LABEL.findall(m["labels"] or ""))
        if any(labels.get(k) != v for k, v in match.items()):
            continue
        engine = labels.get("engine", "")
        out[engine] = out.get(engine, 0.0) + float(m["value"])
    return out


async def read_metrics(base_url: str) -> str:
    """One GET of /metrics on a fresh connection, so repeated reads can land on different API processes."""
    async with httpx.AsyncClient(base_url=base_url, timeout=5.0) as http:
        r = await http.get("/metrics", headers={"Connection": "close"})
        r.raise_for_status()
        return r.text


async def successes(base_url: str) -> dict[str, float]:
    """``vllm:request_success_total`` per engine, summed over ``finished_reason``."""
    return per_engine(await read_metrics(base_url), "vllm:request_success_total")
