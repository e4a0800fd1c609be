"""A MoE rank whose request's grammar compiles keeps its group stepping, and joins the request to a wave once
compiled.

Before, the rank's intake awaited the compilation on its busy loop: the rank took no part in its group's
collectives meanwhile, so its peers' requests stood still in their next sync until the grammar compiled. Now
the compilation runs in a worker thread beside the loop, with no collective of its own; the request is no wave
work until compiled (the group goes idle meanwhile if nothing else runs), and its wave stamp applies then,
waking an idle group, as for a request arriving at that moment.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
from engine_testing import EOS_ID, encode, make_byte_tokenizer

from asyncdp import messages as m
from asyncdp.engine.structured import GrammarMatchers
from asyncdp.sampling_params import SamplingParams, StructuredOutputs
from asyncdp.testing import open_rank_cluster as open_cluster
from asyncdp.testing.rank_cluster import RankResult

pytest.importorskip("llguidance", reason="structured outputs need llguidance")


@pytest.mark.trio
async def test_a_moe_ranks_peers_step_while_its_grammar_compiles_and_the_request_then_runs_in_a_wave(
        monkeypatch: pytest.MonkeyPatch) -> None:
    entered, released = threading.Event(), threading.Event()
    prepare = GrammarMatchers.prepare

    def held(matchers: GrammarMatchers, structured: StructuredOutputs) -> Any:
        entered.set()
        released.wait(60)
        return prepare(matchers, structured)

    monkeypatch.setattr(GrammarMatchers, "prepare", held)
    try:
        async with open_cluster(2, sync_interval=4, inline_step=False) as c:
            core = c.ranks[0].core  # a masking rank 0 (its sim tokens need not follow the grammar)
            core.tokenizer = make_byte_tokenizer()
            core.executor.applies_token_masks = True  # type: ignore[attr-defined]
            core._grammars = GrammarMatchers(core.tokenizer, 300, [EOS_ID])
            with trio.fail_after(20):
                res = c.client.results.setdefault("json", RankResult())
                params = SamplingParams(max_tokens=4, structured=StructuredOutputs(choice=("yes", "no")))
                await c.client.links[0].send(m.AddRequest(
                    request_id="json", client_index=0, wave=c.client.current_wave,
                    prompt_token_ids=encode("hi"), sampling_params=params, arrival_time=0.0, pinned=True))
                while not await trio.to_thread.run_sync(entered.wait, 0.5):
                    pass
                plain = await c.client.add(1, "plain", max_tokens=6)
                await plain.done.wait()  # (before: never, rank 0 was out of the group's collectives)
                assert len(plain.tokens) == 6 and not res.done.is_set()
                await c.wait_idle()  # no wave work while it compiles: the group goes idle
                released.set()
                await res.done.wait()  # compiled: it joined a wave that woke the idle group
                await c.wait_idle()
            # its one step ran in a wave of its own (the sim's token ignores the mask: the grammar then fails it)
            assert (len(res.tokens), res.error_type, c.ranks[0].state.steps) == (1, "invalid_request", 1)
            assert [c.ranks[r].state.waves_completed for r in range(2)] == [2, 2]
            steps = [c.ranks[r].state.steps + c.ranks[r].state.dummy_steps for r in range(2)]
            assert steps[0] == steps[1]
    finally:
        released.set()
