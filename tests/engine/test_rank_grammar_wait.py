"""A structured-output request's grammar compiles without stalling its rank's other requests.

Before, a rank's intake awaited each grammar's compilation (``GrammarMatchers.prepare``) inline on its busy loop,
under the step limiter: while a grammar compiled (tens of ms for a small JSON schema, seconds for a large one, or
while the grammar library's tokenizer was still being built) no step ran and no other inbox item was handled, so
every other request of that rank, plain ones included, waited for it, and so did an abort or a drain with
``--shutdown-timeout 0``. Now the request is admitted at once, waits unscheduled (vLLM's WAITING_FOR_FSM), and its
grammar compiles in a worker thread (:mod:`asyncdp.engine.rank_grammar`).

Each test holds the compilation on an event it controls (no sleeps), so that it is "in progress" for as long as
the test needs.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from engine_testing import encode, scripted_core

from asyncdp import messages as m
from asyncdp.engine.core import EngineCore
from asyncdp.engine.rank import EngineRank, RankConfig
from asyncdp.engine.rank_grammar import GrammarCompiles
from asyncdp.engine.rank_links import GrammarCompiled
from asyncdp.engine.structured import GrammarMatchers
from asyncdp.sampling_params import SamplingParams, StructuredOutputs
from asyncdp.testing import FakeRankClient
from asyncdp.testing.rank_cluster import RankResult

pytest.importorskip("llguidance", reason="structured outputs need llguidance")

pytestmark = pytest.mark.anyio

YES_OR_NO = StructuredOutputs(choice=("yes", "no"))
DEADLINE_S = 20  # a hang fails the test instead of the suite; no timing is measured


class HeldCompile:
    """``GrammarMatchers.prepare`` held until :meth:`release`: ``entered`` once a compilation started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self._released = threading.Event()
        prepare = GrammarMatchers.prepare

        def held(matchers: GrammarMatchers, structured: StructuredOutputs) -> Any:
            self.entered.set()
            self._released.wait(60)  # (bounded: a failed test's thread ends anyway)
            return prepare(matchers, structured)

        monkeypatch.setattr(GrammarMatchers, "prepare", held)

    async def wait_entered(self) -> None:
        with anyio.fail_after(DEADLINE_S):
            while not await anyio.to_thread.run_sync(self.entered.wait, 0.5):
                pass

    def release(self) -> None:
        self._released.set()


def masking_core() -> EngineCore:
    core, ex = scripted_core({"json": encode("yes"), "plain": encode("abcd"), "later": encode("wxyz")})
    ex.applies_token_masks = True  # type: ignore[attr-defined]  # (the script already follows the grammar)
    return core


@asynccontextmanager
async def running_rank(core: EngineCore, held: HeldCompile, *, shutdown_timeout_s: float = 0.0,
                       ) -> AsyncIterator[tuple[EngineRank, FakeRankClient, anyio.Event]]:
    """The rank running (threads for its steps, as a torch rank's), its client, and an event set when its run
    returned by itself."""
    client = FakeRankClient(1)
    rank = EngineRank(RankConfig(dp_rank=0, dp_size=1, engine=core.config, shutdown_timeout_s=shutdown_timeout_s),
                      core, {0: client.engine_ends[0]}, None, inline_step=False)
    ended = anyio.Event()

    async def run_rank() -> None:
        await rank.run()
        ended.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.run(follow_coordinator=False))
            tg.start_soon(run_rank)
            with anyio.fail_after(DEADLINE_S):
                yield rank, client, ended
            tg.cancel_scope.cancel()
    finally:
        held.release()
        for link in [*client.links.values(), *client.engine_ends.values(), client.coord, client.coord_end]:
            await link.aclose()


async def send(client: FakeRankClient, request_id: str, structured: StructuredOutputs | None = None) -> RankResult:
    res = client.results.setdefault(request_id, RankResult())
    params = SamplingParams(temperature=0.0, max_tokens=4 if structured is None else 8, structured=structured)
    await client.links[0].send(m.AddRequest(request_id=request_id, client_index=0, wave=0,
                                            prompt_token_ids=encode("hi"), sampling_params=params, arrival_time=0.0,
                                            pinned=True))
    return res


def on_compiled_event(monkeypatch: pytest.MonkeyPatch) -> anyio.Event:
    """Set once the rank's busy loop handled the end of a compilation."""
    handled = anyio.Event()
    on_compiled = GrammarCompiles.on_compiled

    async def signalling(self: GrammarCompiles, item: GrammarCompiled) -> None:
        await on_compiled(self, item)
        handled.set()

    monkeypatch.setattr(GrammarCompiles, "on_compiled", signalling)
    return handled


async def test_a_plain_request_streams_to_its_end_while_another_requests_grammar_compiles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = HeldCompile(monkeypatch)
    core = masking_core()
    async with running_rank(core, held) as (rank, client, _):
        json_res = await send(client, "json", YES_OR_NO)
        await held.wait_entered()
        plain_res = await send(client, "plain")
        await plain_res.done.wait()  # (before: never, while the grammar compiled)
        assert (plain_res.tokens, plain_res.finish_reason) == (encode("abcd"), "length")
        assert json_res.tokens == [] and not json_res.done.is_set()
        assert core.stats().num_waiting == 1  # the compiling request counts as waiting in the load reports
        held.release()
        await json_res.done.wait()
    assert (json_res.tokens, json_res.finish_reason, json_res.error) == (encode("yes"), "stop", None)


async def test_a_request_aborted_while_its_grammar_compiles_is_answered_abort_and_nothing_else(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = HeldCompile(monkeypatch)
    compiled = on_compiled_event(monkeypatch)
    core = masking_core()
    async with running_rank(core, held) as (rank, client, _):
        json_res = await send(client, "json", YES_OR_NO)
        await held.wait_entered()
        await client.links[0].send(m.AbortRequests(request_ids=["json"]))
        await json_res.done.wait()  # (before: only once the grammar compiled)
        assert (json_res.tokens, json_res.finish_reason, json_res.error_type) == ([], "abort", None)
        assert not core.has_unfinished() and rank.state.owners == {}
        json_res.done = anyio.Event()  # a second finished output would set it again
        held.release()
        await compiled.wait()
        assert rank.intake.grammars.compiling == {}
        plain_res = await send(client, "plain")  # the rank serves on
        await plain_res.done.wait()
        assert not json_res.done.is_set() and json_res.tokens == []
        assert not core.has_unfinished() and core.grammar_matchers().matchers == {}


async def test_a_grammar_that_does_not_compile_is_invalid_request_for_that_request_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = HeldCompile(monkeypatch)
    core = masking_core()
    async with running_rank(core, held) as (rank, client, _):
        bad_res = await send(client, "json", StructuredOutputs(grammar="start: (", param="structured_outputs"))
        await held.wait_entered()
        plain_res = await send(client, "plain")
        await plain_res.done.wait()  # (before: never, while the grammar compiled)
        held.release()
        await bad_res.done.wait()
        later_res = await send(client, "later")
        await later_res.done.wait()
    assert (bad_res.tokens, bad_res.finish_reason, bad_res.error_type) == ([], "abort", "invalid_request")
    assert (plain_res.finish_reason, later_res.tokens, later_res.finish_reason) == ("length", encode("wxyz"), "length")
    assert not core.has_unfinished() and rank.state.owners == {}


async def test_a_draining_rank_serves_the_request_compiling_and_the_others_then_stops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = HeldCompile(monkeypatch)
    core = masking_core()
    async with running_rank(core, held, shutdown_timeout_s=60.0) as (rank, client, ended):
        json_res = await send(client, "json", YES_OR_NO)
        await held.wait_entered()
        plain_res = await send(client, "plain")
        await plain_res.done.wait()  # (before: never, while the grammar compiled)
        rank.request_shutdown()
        refused = await send(client, "later")  # answered by the draining loop, which goes on...
        await refused.done.wait()
        assert refused.error_type == "unavailable"
        assert not ended.is_set()  # ...kept by the compiling request
        held.release()
        await ended.wait()
    assert (json_res.tokens, json_res.finish_reason) == (encode("yes"), "stop")


async def test_a_rank_stopping_at_once_while_a_grammar_compiles_aborts_it_and_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = HeldCompile(monkeypatch)
    core = masking_core()
    async with running_rank(core, held, shutdown_timeout_s=0.0) as (rank, client, ended):
        json_res = await send(client, "json", YES_OR_NO)
        await held.wait_entered()
        rank.request_shutdown()
        await ended.wait()  # the compilation still held (before: the rank waited for it)
        await json_res.done.wait()
    assert (json_res.tokens, json_res.finish_reason, json_res.error_type) == ([], "abort", "abandoned")
