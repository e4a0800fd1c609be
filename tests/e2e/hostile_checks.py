"""How the hostile-input battery (tests/e2e/test_hostile_input.py) sends a family of cases and judges the
answers: the contract for each answer (no 5xx, no transport failure, the expected status, OpenAI-shaped
errors, well-formed SSE), and ``settle_problems``, the deployment's state after a family (every API process
attached to the coordinator, nothing left in flight); the schemathesis run uses it too."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import orjson

from tests.e2e.conftest import Server
from tests.e2e.hostile_cases import Case
from tests.e2e.metrics_text import per_engine

MAX_QUEUED = 8
API_COUNT = 2
REQUEST_TIMEOUT_S = 10.0
FAMILY_DEADLINE_S = 25.0


def sse_problems(text: str) -> list[str]:
    """Every ``data:`` line of a stream must be one JSON object or ``[DONE]``; an error event is a problem."""
    out = []
    for line in text.split("\n"):
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        try:
            event = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            out.append(f"unparsable SSE line {line[:120]!r}")
            continue
        if isinstance(event, dict) and "error" in event:
            out.append(f"error event {line[:200]}")
    return out


def error_shape_problem(r: httpx.Response) -> str | None:
    try:
        body = r.json()
    except ValueError:
        return f"error body is not JSON: {r.text[:200]!r}"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not {"message", "type", "param", "code"} <= err.keys():
        return f"error body is not OpenAI-shaped: {r.text[:200]}"
    if not isinstance(err["message"], str) or not isinstance(err["type"], str):
        return f"error message/type are not strings: {r.text[:200]}"
    return None


Validate = Callable[[httpx.Response], list[str]]  # what is wrong with a 200 answer's body


async def check(http: httpx.AsyncClient, case: Case, validate: Validate | None = None) -> str | None:
    """The problem with the server's answer to ``case``, or None when it keeps the contract (and, for a 200,
    ``validate`` finds nothing wrong with its body)."""
    headers = {"Connection": "close", **dict(case.headers)}
    try:
        r = await http.request(case.method, case.path, content=case.content, headers=headers)
    except httpx.TimeoutException:
        return f"{case.name}: no answer within {REQUEST_TIMEOUT_S} s"
    except httpx.TransportError as exc:
        return f"{case.name}: transport error {exc!r}"
    if r.status_code >= 500:
        return f"{case.name}: {r.status_code} {r.text[:300]}"
    if case.expect is not None and r.status_code not in case.expect:
        return f"{case.name}: expected {sorted(case.expect)}, got {r.status_code} {r.text[:200]}"
    if r.status_code >= 400:
        problem = error_shape_problem(r)
        return f"{case.name}: {r.status_code} {problem}" if problem else None
    problems = sse_problems(r.text) if r.headers.get("content-type", "").startswith("text/event-stream") else []
    if validate is not None and r.status_code == 200:
        problems += validate(r)
    return f"{case.name}: {problems[:3]}" if problems else None


async def api_views(server: Server) -> dict[int, dict[str, Any]]:
    """``/server_info`` of every API process (by ``api_process_rank``), from fresh connections (bounded)."""
    views: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + 15.0  # a stuck process costs a 5 s timeout per connection that lands on it
    async with httpx.AsyncClient(base_url=server.base_url, timeout=5.0) as http:
        for _ in range(40):
            if time.monotonic() > deadline:
                break
            try:
                info = (await http.get("/server_info", headers={"Connection": "close"})).json()
            except httpx.HTTPError:
                continue  # an API process that does not answer is missing from the views
            views[info["api_process_rank"]] = info
            if len(views) == info["api_process_count"]:
                break
    return views


async def settle_problems(server: Server) -> list[str]:
    """What is wrong with the deployment's state after a family: in flight left, a detached API process."""
    deadline = time.monotonic() + 10.0
    while True:
        problems = []
        views = await api_views(server)
        if len(views) != API_COUNT:
            problems.append(f"reached API processes {sorted(views)} of {API_COUNT}")
        for rank, info in sorted(views.items()):
            if info["coordinator"]["state"] != "alive":
                problems.append(f"API process {rank} sees the coordinator {info['coordinator']}")
            inflight = {r["dp_rank"]: r["inflight"] for r in info["managed_ranks"]}
            if any(inflight.values()):
                problems.append(f"API process {rank} has in flight {inflight}")
        async with httpx.AsyncClient(base_url=server.base_url, timeout=5.0) as http:
            for _ in range(4):
                try:
                    text = (await http.get("/metrics", headers={"Connection": "close"})).text
                except httpx.HTTPError as exc:
                    problems.append(f"GET /metrics failed: {exc!r}")
                    continue
                gauge = per_engine(text, "asyncdp:dp_inflight_requests")  # no series yet: nothing admitted
                if sum(gauge.values()):
                    problems.append(f"asyncdp:dp_inflight_requests = {gauge}")
        if not problems or time.monotonic() > deadline:
            return problems
        await anyio.sleep(0.2)  # poll: a slot is released just after the response is sent


async def run_family(server: Server, cases: list[Case], *, timeout_s: float = REQUEST_TIMEOUT_S,
                     validate: Validate | None = None) -> None:
    problems: list[str] = []
    deadline = time.monotonic() + FAMILY_DEADLINE_S
    async with httpx.AsyncClient(base_url=server.base_url, timeout=timeout_s) as http:
        for i, case in enumerate(cases):
            if time.monotonic() > deadline:
                problems.append(f"deadline: {len(cases) - i} cases not sent")
                break
            if (problem := await check(http, case, validate)) is not None:
                problems.append(problem)
                if "no answer" in problem or "transport error" in problem:
                    problems.append(f"stopped after a lost request: {len(cases) - i - 1} cases not sent")
                    break
    problems += await settle_problems(server)
    assert not problems, f"{len(problems)} problems of {len(cases)} requests:\n" + "\n".join(problems)
