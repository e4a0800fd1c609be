"""End to end: after a MoE wave ends, every API process's ``GET /load`` shows it ended (dp=2, expert parallel, two
API processes).

A rank reports a wave's end in stats it sends to one API process only; before, the other process's ``/load`` kept
showing the ranks' last wave running (or never saw their wave at all). ``/metrics`` (node-wide) shows the same.
Each read is a fresh connection, so reads land on either API process; both must have answered.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.e2e.conftest import serve
from tests.e2e.metrics_text import per_engine, read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MOE = "builtin:tiny-moe"


async def load_of_each_process(base_url: str) -> dict[int, dict[str, Any]]:
    """One ``/load`` document per API process (polled on fresh connections until both answered)."""
    seen: dict[int, dict[str, Any]] = {}
    async with httpx.AsyncClient(base_url=base_url, timeout=5.0) as http:
        while len(seen) < 2:  # (bounded by the caller's fail_after)
            doc = (await http.get("/load", headers={"Connection": "close"})).json()
            seen[doc["api_process_rank"]] = doc
    return seen


async def test_every_api_process_shows_the_wave_ended_on_every_rank(tmp_path: Path) -> None:
    with serve(tmp_path, "-dp", "2", "--enable-expert-parallel", "--api-server-count", "2", model=MOE) as server:
        with anyio.fail_after(60):
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30.0) as http:
                for wave in range(3):  # requests on fresh connections: both API processes serve some
                    async with anyio.create_task_group() as tg:
                        for i in range(4):
                            tg.start_soon(functools.partial(
                                http.post, "/v1/completions", headers={"Connection": "close"},
                                json={"model": MOE, "prompt": f"wave {wave} {i}", "max_tokens": 4}))
            docs: dict[int, dict[str, Any]] = {}

            def settled() -> bool:
                """The group paused (top-level wave) and every rank of every process shows that wave, ended."""
                return len(docs) == 2 and all(not d["wave"]["running"] and d["wave"]["current"] > 0 and all(
                    (r["wave"], r["wave_running"]) == (d["wave"]["current"], False) for r in d["ranks"])
                    for d in docs.values())

            with anyio.move_on_after(20):  # a rank's last stats may trail the coordinator's snapshot briefly
                while not settled():
                    docs = await load_of_each_process(server.base_url)
                    if not settled():
                        await anyio.sleep(0.1)
            assert settled(), {p: (d["wave"], [(r["dp_rank"], r["wave"], r["wave_running"]) for r in d["ranks"]])
                               for p, d in docs.items()}
            current = docs[0]["wave"]["current"]
            assert docs[1]["wave"]["current"] == current
            text = await read_metrics(server.base_url)
            assert per_engine(text, "asyncdp:dp_wave") == {"0": current, "1": current}
            assert per_engine(text, "asyncdp:dp_running") == {"0": 0, "1": 0}
