"""A rank's readiness does not wait for the grammar library's warm-up, and a grammar that comes before the warm-up
ended waits for it.

Every rank with llguidance and a masking executor built the library's tokenizer before it reported ready: 0.3 s
for SmolLM2's 49k vocabulary on an idle core (a second or more on a loaded one), in every rank's startup, whether a
structured-output request ever came or not. Now it is built in a background thread after ``Ready`` and
``EngineReady``; a structured-output request whose grammar is compiled meanwhile waits for that build (one lock)
instead of building the tokenizer a second time.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from engine_testing import encode, scripted_core

from asyncdp import messages as m
from asyncdp.config.flags import EngineConfig
from asyncdp.config.roles import EngineRole
from asyncdp.engine.grammar_warm_up import start_grammar_warm_up
from asyncdp.engine.rank import EngineRank, RankConfig
from asyncdp.engine.rank_process import rank_config, start_rank
from asyncdp.engine.sim_executor import SimExecutor
from asyncdp.engine.structured import GrammarMatchers
from asyncdp.sampling_params import SamplingParams, StructuredOutputs
from asyncdp.testing import FakeRankClient
from asyncdp.testing.rank_cluster import RankResult
from asyncdp.transport import connect, listen_links

pytest.importorskip("llguidance", reason="structured outputs need llguidance")

YES_OR_NO = StructuredOutputs(choice=("yes", "no"))


class HeldBuild:
    """``GrammarMatchers._build_tokenizer`` held until ``release``: ``entered`` once a build started, ``builds``
    how many did."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.builds = 0
        build = GrammarMatchers._build_tokenizer

        def held(matchers: GrammarMatchers) -> Any:
            self.builds += 1
            self.entered.set()
            self.released.wait()
            return build(matchers)

        monkeypatch.setattr(GrammarMatchers, "_build_tokenizer", held)

    async def wait_entered(self) -> None:
        with anyio.fail_after(30):
            while not await anyio.to_thread.run_sync(self.entered.wait, 0.5):
                pass


@pytest.mark.anyio
async def test_a_rank_reports_ready_while_its_grammar_warm_up_is_still_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm-up of a masking rank is held: the rank still sends Ready and EngineReady (before, start_rank
    waited for the warm-up and never returned), and the warm-up runs in the background."""
    held = HeldBuild(monkeypatch)
    monkeypatch.setattr(SimExecutor, "applies_token_masks", True, raising=False)  # a masking rank, without torch
    front_end = await listen_links("unix", directory=str(tmp_path), prefix="fe", name="front-end")
    client = await listen_links("unix", directory=str(tmp_path), prefix="client", name="client")
    got: dict[str, m.Message] = {}
    engine_ready = anyio.Event()

    async def front_end_side(link: Any) -> None:
        assert isinstance(await link.receive(), m.Hello)
        await link.send(m.HandshakeInit(clients=[m.ClientAddr(client_index=0, addr=client.addr)], coordinator=None,
                                        dp_group=None, client_count=1))
        got["front-end"] = await link.receive()
        await anyio.sleep_forever()

    async def client_side(link: Any) -> None:
        got["client"] = await link.receive()
        engine_ready.set()
        await anyio.sleep_forever()

    role = EngineRole(dp_rank=0, dp_size=1, engine=EngineConfig(model="builtin:tiny-dense", executor="sim"),
                      handshake_addr=front_end.addr)
    rank = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(front_end.serve, front_end_side)
            tg.start_soon(client.serve, client_side)
            handshake = await connect(front_end.addr, name="handshake")
            with anyio.fail_after(60):
                rank = await start_rank(rank_config(role), handshake)
                await engine_ready.wait()
                await held.wait_entered()
            assert not held.released.is_set()
            assert isinstance(got["front-end"], m.Ready) and isinstance(got["client"], m.EngineReady)
            tg.cancel_scope.cancel()
            await handshake.aclose()
    finally:
        held.released.set()
        if rank is not None:
            rank.close()
            rank.core.shutdown()
            for link in rank.links.clients.values():
                await link.aclose()


def test_a_grammar_compiled_during_the_warm_up_waits_for_it_and_the_tokenizer_is_built_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = HeldBuild(monkeypatch)
    core, ex = scripted_core({})
    ex.applies_token_masks = True  # type: ignore[attr-defined]
    warm_up = start_grammar_warm_up(0, core)
    assert warm_up is not None
    held.entered.wait()
    errors: list[BaseException] = []

    def compile_grammar() -> None:
        try:
            core.grammar_matchers(YES_OR_NO).prepare(YES_OR_NO)
        except BaseException as exc:  # reported below
            errors.append(exc)

    compiling = threading.Thread(target=compile_grammar)
    compiling.start()
    held.released.set()
    compiling.join()
    warm_up.join()
    assert errors == [] and held.builds == 1


@pytest.mark.anyio
async def test_the_first_structured_request_that_comes_during_the_warm_up_is_served(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = HeldBuild(monkeypatch)
    core, ex = scripted_core({"json": encode("yes")})
    ex.applies_token_masks = True  # type: ignore[attr-defined]  # (the script already follows the grammar)
    warm_up = start_grammar_warm_up(0, core)
    assert warm_up is not None
    client = FakeRankClient(1)
    rank = EngineRank(RankConfig(dp_rank=0, dp_size=1, engine=core.config), core, {0: client.engine_ends[0]},
                      None, inline_step=False)
    res = client.results.setdefault("json", RankResult())
    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(client.run, follow_coordinator=False))
                tg.start_soon(rank.run)
                await held.wait_entered()
                await client.links[0].send(m.AddRequest(
                    request_id="json", client_index=0, wave=0, prompt_token_ids=encode("hi"),
                    sampling_params=SamplingParams(temperature=0.0, max_tokens=8, structured=YES_OR_NO),
                    arrival_time=0.0, pinned=True))
                held.released.set()
                await res.done.wait()
                tg.cancel_scope.cancel()
    finally:
        held.released.set()
        for link in [*client.links.values(), *client.engine_ends.values(), client.coord, client.coord_end]:
            await link.aclose()
    await anyio.to_thread.run_sync(warm_up.join)
    assert (res.tokens, res.finish_reason, res.error) == (encode("yes"), "stop", None)
    assert held.builds == 1
