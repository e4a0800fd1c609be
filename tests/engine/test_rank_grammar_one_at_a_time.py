"""A rank compiles one grammar at a time: the grammar library holds the GIL for most of a compilation, so more
worker threads would only take more turns of it from the rank's steps (anyio's default limiter let 40 run)."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest
from engine_testing import encode, scripted_core
from test_rank_grammar_wait import DEADLINE_S, YES_OR_NO, running_rank, send

from asyncdp.engine.rank_grammar import GrammarCompiles
from asyncdp.engine.structured import GrammarMatchers
from asyncdp.sampling_params import StructuredOutputs

pytest.importorskip("llguidance", reason="structured outputs need llguidance")

pytestmark = pytest.mark.anyio


class CountedCompile:
    """``GrammarMatchers.prepare`` held until :meth:`release`, counting the compilations in progress."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = 0
        self.most_at_once = 0
        self._running = 0
        self._lock = threading.Lock()
        self._released = threading.Event()
        prepare = GrammarMatchers.prepare

        def counted(matchers: GrammarMatchers, structured: StructuredOutputs) -> Any:
            with self._lock:
                self.entered += 1
                self._running += 1
                self.most_at_once = max(self.most_at_once, self._running)
            try:
                self._released.wait(60)  # (bounded: a failed test's thread ends anyway)
                return prepare(matchers, structured)
            finally:
                with self._lock:
                    self._running -= 1

        monkeypatch.setattr(GrammarMatchers, "prepare", counted)

    def release(self) -> None:
        self._released.set()


def settled(counted: CountedCompile, grammars: GrammarCompiles) -> bool:
    """Both grammars compiling (anyio's default limiter), or one compiling and the other queued behind it."""
    limiter = getattr(grammars, "_limiter", None)
    queued = limiter is not None and limiter.statistics().tasks_waiting == 1
    return counted.entered == 2 or (counted.entered == 1 and queued)


async def test_a_second_grammar_waits_for_the_first_ones_compilation(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = CountedCompile(monkeypatch)
    core, ex = scripted_core({"json": encode("yes"), "json2": encode("no"), "plain": encode("abcd")})
    ex.applies_token_masks = True  # type: ignore[attr-defined]  # (the script already follows the grammar)
    async with running_rank(core, counted) as (rank, client, _):  # type: ignore[arg-type]
        first = await send(client, "json", YES_OR_NO)
        second = await send(client, "json2", StructuredOutputs(choice=("no", "maybe")))
        with anyio.fail_after(DEADLINE_S):  # both compiling (before), or the second queued behind the first
            while not settled(counted, rank.intake.grammars):  # noqa: ASYNC110 - worker threads' state
                await anyio.sleep(0.01)
        assert (counted.entered, counted.most_at_once) == (1, 1)
        plain = await send(client, "plain")  # the steps go on meanwhile
        await plain.done.wait()
        counted.release()
        await first.done.wait()
        await second.done.wait()
    assert (first.tokens, first.finish_reason) == (encode("yes"), "stop")
    assert (second.tokens, second.finish_reason) == (encode("no"), "stop")
    assert (counted.entered, counted.most_at_once) == (2, 1)
