"""A rank keeps its event loop (and so its heartbeats) free of structured-output set-up.

The first constrained request on a rank built the grammar library's tokenizer from the engine's inside
``add_request``, on the rank's event loop: about a second for SmolLM2's 49k vocabulary on an idle core, holding the
GIL throughout, so no heartbeat went out. On a loaded machine ``asyncdp serve builtin:smollm2-135m -dp 2`` lost
rank 0 ("no heartbeat from engine rank 0 for 5.0 s") on its first ``tool_choice`` request and the deployment went
down; with ``--dp-heartbeat-timeout-s 1`` one ``response_format: json_object`` request did it every time. Now the
tokenizer is built off the event loop (in a background thread once the rank is ready:
``asyncdp.engine.grammar_warm_up``), and each grammar is compiled in a worker thread (llguidance releases the GIL
there: 200 tools' schemas take 0.65 s).
"""

from __future__ import annotations

import functools
import threading

import pytest
import trio
from engine_testing import encode, scripted_core, sim_core

from asyncdp import messages as m
from asyncdp.engine.grammar_warm_up import start_grammar_warm_up
from asyncdp.engine.rank import EngineRank, RankConfig
from asyncdp.engine.structured import GrammarMatchers
from asyncdp.sampling_params import SamplingParams, StructuredOutputs
from asyncdp.testing import FakeRankClient
from asyncdp.testing.rank_cluster import RankResult

pytest.importorskip("llguidance", reason="structured outputs need llguidance")


def masking_core():  # type: ignore[no-untyped-def]
    core, ex = scripted_core({"json": encode("yes")})
    ex.applies_token_masks = True  # type: ignore[attr-defined]  # (the script already follows the grammar)
    return core


def test_a_started_rank_builds_the_grammar_librarys_tokenizer_and_a_sim_rank_skips_it() -> None:
    core = masking_core()
    warm_up = start_grammar_warm_up(0, core)
    assert warm_up is not None
    warm_up.join()
    assert core.grammar_matchers()._ll_tokenizer is not None
    assert start_grammar_warm_up(0, sim_core()) is None  # an executor that cannot mask: nothing to build, no error


@pytest.mark.trio
async def test_a_requests_grammar_is_compiled_in_a_worker_thread_and_the_request_is_served(
        monkeypatch: pytest.MonkeyPatch) -> None:
    core = masking_core()
    compiled_in: list[int] = []
    compile_template = GrammarMatchers._template

    def recording(self: GrammarMatchers, key: tuple[str, str]) -> object:
        if key not in self._templates:
            compiled_in.append(threading.get_ident())
        return compile_template(self, key)

    monkeypatch.setattr(GrammarMatchers, "_template", recording)
    client = FakeRankClient(1)
    rank = EngineRank(RankConfig(dp_rank=0, dp_size=1, engine=core.config), core, {0: client.engine_ends[0]},
                      None, inline_step=False)
    params = SamplingParams(temperature=0.0, max_tokens=8, structured=StructuredOutputs(choice=("yes", "no")))
    res = client.results.setdefault("json", RankResult())
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(client.run, follow_coordinator=False))
                nursery.start_soon(rank.run)
                await client.links[0].send(m.AddRequest(
                    request_id="json", client_index=0, wave=0, prompt_token_ids=encode("hi"),
                    sampling_params=params, arrival_time=0.0, pinned=True))
                await res.done.wait()
                nursery.cancel_scope.cancel()
    finally:
        for link in [*client.links.values(), *client.engine_ends.values(), client.coord, client.coord_end]:
            await link.aclose()
    assert len(compiled_in) == 1 and compiled_in[0] != threading.get_ident()
    assert (res.tokens, res.finish_reason, res.error) == (encode("yes"), "stop", None)
