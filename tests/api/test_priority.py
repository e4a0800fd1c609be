"""``priority`` (vLLM's): a 400 naming it under the default ``--scheduling-policy fcfs`` unless 0, with vLLM's
message; under ``priority`` it reaches the engine in ``SamplingParams`` (every sample of ``n`` alike)."""

from __future__ import annotations

import pytest

from tests.api.conftest import running

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("priority", [1, -2])
async def test_a_priority_under_fcfs_is_vllms_400_naming_it(priority: int) -> None:
    async with running() as srv:
        completion = await srv.http.post("/v1/completions", json={"prompt": "a", "priority": priority})
        chat = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "priority": priority})
    for r in (completion, chat):
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "priority"
        assert error["message"] == f"Got priority {priority} but Priority scheduling is not enabled."
    assert srv.fake.submitted == []


async def test_priority_0_or_null_is_served_under_fcfs() -> None:
    async with running() as srv:
        zero = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1, "priority": 0})
        null = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1, "priority": None})
    assert zero.status_code == 200 and null.status_code == 200
    assert [p.priority for _, _, p, _ in srv.fake.submitted] == [0, 0]


async def test_the_priority_reaches_the_sampling_params_under_the_priority_policy() -> None:
    async with running(scheduling_policy="priority") as srv:
        completion = await srv.http.post("/v1/completions", json={
            "prompt": "a", "max_tokens": 1, "n": 2, "priority": -7})
        chat = await srv.http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 1, "priority": 3})
        default = await srv.http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
        wrong = await srv.http.post("/v1/completions", json={"prompt": "a", "priority": 1.5})
    assert completion.status_code == 200 and chat.status_code == 200 and default.status_code == 200
    assert [p.priority for _, _, p, _ in srv.fake.submitted] == [-7, -7, 3, 0]
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "priority"
