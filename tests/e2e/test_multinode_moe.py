"""End to end: a MoE group that spans two launches (``-dp 2 -dpl 1`` on the head + a headless node with rank 1).

The head hosts the rendezvous store, the group runs gloo across the two process trees, waves and the pause
consensus cross the node link. One module-scoped deployment per expert-parallel setting (CI: with
``--enable-expert-parallel``; without it behind the slow marker): greedy tokens pinned to either rank, and
unpinned concurrent ones, equal a single-node dp=1 run of the same model and prompts (in-process ``LLM``, all
experts in one process). The last test of the module ends the deployment: the headless node's death tears the
group down.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import anyio
import httpx
import pytest

from asyncdp import LLM, SamplingParams
from tests.e2e.multinode import (
    Deployment,
    deployment,
    head,
    headless,
    kill_tree,
    stream_completion,
    wait_code,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MOE = "builtin:tiny-moe"
PROMPTS = ["The expert says", "Mixture of experts", "abc"]
TOKENS = 12
# The head imports torch (asyncdp.model.distributed, for the rendezvous store) on its event loop after the headless
# node joined; on loaded cores that stalls its node-link heartbeats past the default 5 s timeout and both sides
# give up (a product defect, reported). A longer timeout lets startup through; a SIGKILLed node is seen by EOF.
MOE_HB = ("--dp-heartbeat-timeout-s", "30")


@pytest.fixture(scope="module")
def expected() -> list[str]:
    with LLM(MOE, torch_threads=1) as llm:
        return [o.outputs[0].text for o in llm.generate(
            PROMPTS, SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True))]


@pytest.fixture(scope="module", params=[pytest.param(True, id="ep"),
                                        pytest.param(False, id="no-ep", marks=pytest.mark.slow)])
def group(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    flags = ("--enable-expert-parallel",) if request.param else ()
    specs = (head("-dp", "2", "-dpl", "1", *flags, *MOE_HB),
             headless("-dp", "2", "-dpl", "1", "-dpr", "1", *flags, *MOE_HB))
    with deployment(tmp_path_factory.mktemp("moe2"), *specs, model=MOE) as dep:
        yield dep


def _body(prompt: str, **extra: object) -> dict[str, object]:
    return {"model": MOE, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0.0, "ignore_eos": True, **extra}


async def test_server_info_shows_the_group_across_both_nodes(group: Deployment) -> None:
    ep = "--enable-expert-parallel" in group.specs[0].args
    async with httpx.AsyncClient(base_url=group.head.base_url, timeout=10.0) as http:
        info = (await http.get("/server_info")).json()
    assert info["is_moe"] is True and info["enable_expert_parallel"] is ep
    assert info["wave"] is not None
    assert [(r["dp_rank"], r["local"], r["state"]) for r in info["managed_ranks"]] == [
        (0, True, "ready"), (1, False, "ready")]
    assert [(n["role"], n["ranks"]) for n in sorted(info["nodes"], key=lambda n: n["node"])] == [
        ("head", [0]), ("headless", [1])]


async def test_greedy_tokens_pinned_to_either_node_equal_a_single_node_dp1_run(group: Deployment,
                                                                              expected: list[str]) -> None:
    async with httpx.AsyncClient(base_url=group.head.base_url, timeout=60.0) as http:
        with anyio.fail_after(90):
            for rank in (0, 1):  # both halves of the group agree with dp=1
                for prompt, want in zip(PROMPTS, expected, strict=True):
                    r = await http.post("/v1/completions", json=_body(prompt, data_parallel_rank=rank))
                    assert r.status_code == 200, r.text
                    assert r.json()["choices"][0]["text"] == want, (rank, prompt)


async def test_concurrent_unpinned_greedy_tokens_equal_a_single_node_dp1_run(group: Deployment,
                                                                            expected: list[str]) -> None:
    got: dict[int, str] = {}
    async with httpx.AsyncClient(base_url=group.head.base_url, timeout=60.0) as http:
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                for i, prompt in enumerate(PROMPTS * 2):
                    async def one(i: int = i, prompt: str = prompt) -> None:
                        r = await http.post("/v1/completions", json=_body(prompt))
                        assert r.status_code == 200, r.text
                        got[i] = r.json()["choices"][0]["text"]

                    tg.start_soon(one)
    assert [got[i] for i in range(len(PROMPTS) * 2)] == expected * 2


async def test_sigkilled_headless_node_tears_the_group_down_and_the_head_exits_1(group: Deployment) -> None:
    """Every in-flight request (on either rank) ends with an error; the head exits 1 within 5 s; nothing is left.
    This ends the module's deployment."""
    hd, hl = group.node("head"), group.node("headless")
    out: list[tuple[object, ...]] = []
    async with httpx.AsyncClient(base_url=hd.base_url, timeout=30.0) as http:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                events = [anyio.Event() for _ in range(4)]
                for i, ev in enumerate(events):
                    tg.start_soon(partial(stream_completion, http, ev, out, model=MOE,
                                          data_parallel_rank=i % 2))
                for ev in events:
                    await ev.wait()
                hd.remember_tree()
                kill_tree(hl)
    assert len(out) == 4 and all(o[0] == "error" for o in out), out
    code = await wait_code(hd, 5, group)
    assert code == 1, group.logs()
    left = await anyio.to_thread.run_sync(group.wait_gone, 5.0)
    assert not left, f"left after the teardown: {left}\n{group.logs()}"
