"""What the batch may and may not change for one request, on the real tiny model in float32 on CPU: greedy tokens
never; logprobs only by rounding (a batched matrix multiply sums in another order than a single row), a few 1e-6,
documented in docs/reference/http-api.md ("Logprobs and the batch")."""

import random

import pytest

from asyncdp import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_greedy_tokens_are_the_same_in_any_batch_and_logprobs_differ_only_by_rounding():
    rng = random.Random(0)
    target = [rng.randint(32, 126) for _ in range(40)]
    others = [[rng.randint(32, 126) for _ in range(rng.randint(5, 60))] for _ in range(7)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=3)
    with LLM("builtin:tiny-dense", dtype="float32", enable_prefix_caching=False) as llm:
        alone = llm.generate([target], params)[0].outputs[0]
        for size in (2, 8):
            batched = llm.generate([target, *others[:size - 1]], params)[0].outputs[0]
            assert batched.token_ids == alone.token_ids
            gaps = [abs(a.logprob - b.logprob) for a, b in zip(alone.logprobs, batched.logprobs, strict=True)]
            assert max(gaps) < 1e-4  # measured: up to 3.6e-6
