"""End to end: a MoE group that spans two launches (``-dp 2 -dpl 1`` on the head + a headless node with rank 1).

The head hosts the rendezvous store, the group runs gloo across the two process trees, waves and the pause
consensus cross the node link. Greedy tokens pinned to either rank equal a single-node dp=1 run of the same model
and prompts (in-process ``LLM``, all experts in one process). CI runs the expert-parallel group; the group without
``--enable-expert-parallel`` is behind the slow marker.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from asyncdp import LLM, SamplingParams
from tests.e2e.multinode import deployment, head, headless

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MOE = "builtin:tiny-moe"
PROMPTS = ["The expert says", "Mixture of experts", "abc"]
TOKENS = 12
# The head imports torch on its event loop once the headless node joined; on loaded cores that stalls its
# node-link heartbeats past the default 5 s timeout (a product defect, reported): a longer timeout for startup.
MOE_HB = ("--dp-heartbeat-timeout-s", "30")


@pytest.fixture(scope="module")
def expected() -> list[str]:
    with LLM(MOE, torch_threads=1) as llm:
        return [o.outputs[0].text for o in llm.generate(
            PROMPTS, SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True))]


@pytest.mark.parametrize("ep", [pytest.param(True, id="ep"),
                                pytest.param(False, id="no-ep", marks=pytest.mark.slow)])
async def test_two_node_moe_greedy_tokens_equal_a_single_node_dp1_run(tmp_path: Path, expected: list[str],
                                                                     ep: bool) -> None:
    flags = ("--enable-expert-parallel",) if ep else ()
    specs = (head("-dp", "2", "-dpl", "1", *flags, *MOE_HB),
             headless("-dp", "2", "-dpl", "1", "-dpr", "1", *flags, *MOE_HB))
    with deployment(tmp_path, *specs, model=MOE) as dep:
        async with httpx.AsyncClient(base_url=dep.head.base_url, timeout=60.0) as http:
            info = (await http.get("/server_info")).json()
            assert info["is_moe"] is True and info["enable_expert_parallel"] is ep
            assert [(r["dp_rank"], r["local"], r["state"]) for r in info["managed_ranks"]] == [
                (0, True, "ready"), (1, False, "ready")]
            with anyio.fail_after(90):
                for rank in (0, 1):  # pinned to each node's rank: both halves of the group agree with dp=1
                    for prompt, want in zip(PROMPTS, expected, strict=True):
                        r = await http.post("/v1/completions", json={
                            "model": MOE, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0.0,
                            "ignore_eos": True, "data_parallel_rank": rank})
                        assert r.status_code == 200, r.text
                        assert r.json()["choices"][0]["text"] == want, (rank, prompt)
                # unpinned and concurrent: waves across the node link still give the same tokens
                got: dict[int, str] = {}
                async with anyio.create_task_group() as tg:
                    for i, prompt in enumerate(PROMPTS * 2):
                        async def one(i: int = i, prompt: str = prompt) -> None:
                            r = await http.post("/v1/completions", json={
                                "model": MOE, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0.0,
                                "ignore_eos": True})
                            assert r.status_code == 200, r.text
                            got[i] = r.json()["choices"][0]["text"]

                        tg.start_soon(one)
                assert [got[i] for i in range(len(PROMPTS) * 2)] == expected * 2
