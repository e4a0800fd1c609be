"""The per-request fast paths keep the slow paths' behaviour: ``collect_one`` (one non-streamed sequence in the
handler task), cached metric children, and the rank's default choice of inline stepping for the sim executor."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
import trio.testing

from asyncdp.api.fanout import Sequence, collect_one
from asyncdp.api.metrics import Metrics
from asyncdp.engine.rank import EngineRank, RankConfig
from asyncdp.errors import EngineDeadError
from asyncdp.messages import RequestOutput
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import FakeEngineClient
from asyncdp.testing import sim_rank_core as sim_core
from tests.api.test_metrics import key, samples


def seq(max_tokens: int) -> Sequence:
    return Sequence(0, "r1", [1, 2, 3], SamplingParams(max_tokens=max_tokens, seed=1))


@pytest.mark.trio
async def test_collect_one_passes_every_output_and_aborts_nothing_when_the_sequence_finishes() -> None:
    fake = FakeEngineClient()
    seen: list[RequestOutput] = []
    count = await collect_one(fake, seq(4), None, seen.append)
    assert count == 4 and len(seen) == 4 and seen[-1].finished
    assert fake.finished == ["r1"] and fake.aborted == []


class SlowCleanupClient:
    """Yields one output a second forever; its cleanup (the abort) needs a checkpoint, as a real one does."""

    def __init__(self) -> None:
        self.aborted: list[str] = []

    async def generate(self, request_id: str, prompt: list[int], params: SamplingParams, *, rank_hint: object = None,
                       admission: object = None, routing_key: str | None = None):
        try:
            while True:
                await trio.sleep(1.0)
                yield RequestOutput(request_id=request_id, new_token_ids=[1], new_text="a")
        finally:
            with trio.CancelScope(shield=True):
                await trio.lowlevel.checkpoint()  # sending AbortRequests
            self.aborted.append(request_id)


@pytest.mark.trio
async def test_collect_one_aborts_the_request_before_returning_when_the_caller_is_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = SlowCleanupClient()
    seen: list[RequestOutput] = []
    with trio.move_on_after(2.5):  # MockClock: two outputs arrive, then the "client disconnects"
        await collect_one(client, seq(10), None, seen.append)  # type: ignore[arg-type]
    assert len(seen) == 2
    assert client.aborted == ["r1"]


@pytest.mark.trio
async def test_collect_one_raises_the_clients_error_after_aborting() -> None:
    fake = FakeEngineClient()
    fake.fail_after_tokens = 2
    seen: list[RequestOutput] = []
    with pytest.raises(EngineDeadError):
        await collect_one(fake, seq(6), None, seen.append)
    assert len(seen) == 2


def test_cached_metric_children_keep_labels_per_engine_and_reason() -> None:
    m = Metrics(model_name="m", multiproc_dir=None)
    for _ in range(2):
        m.inc_lb_decision(0, "score")
        m.add_tokens(0, prompt_tokens=3, generation_tokens=1)
        m.record_request_finished(0, "stop", e2e_s=0.2)
    m.record_request_finished("1", "abort", e2e_s=0.3)
    m.set_inflight(1, 4)
    m.set_inflight(1, 2)
    got = samples(m.render().decode())
    assert got[key("asyncdp:dp_lb_decisions_total", model_name="m", engine="0", reason="score")] == 2
    assert got[key("vllm:request_success_total", model_name="m", engine="0", finished_reason="stop")] == 2
    assert got[key("vllm:request_success_total", model_name="m", engine="1", finished_reason="abort")] == 1
    assert got[key("vllm:prompt_tokens_total", model_name="m", engine="0")] == 6
    assert got[key("asyncdp:dp_inflight_requests", model_name="m", engine="1")] == 2


def test_rank_steps_the_sim_executor_inline_by_default_and_honours_an_explicit_choice() -> None:
    core = sim_core()
    cfg = RankConfig(dp_rank=0, dp_size=1, engine=core.config)
    ranks = [EngineRank(cfg, core, {}, None), EngineRank(cfg, core, {}, None, inline_step=False)]
    try:
        assert [r.inline_step for r in ranks] == [True, False]
    finally:
        for r in ranks:  # never run: close the inbox that run() would close
            r._inbox_send.close()
            r._inbox.close()


@pytest.mark.trio
async def test_collect_one_aborts_the_request_before_raising_when_the_consumer_fails_between_outputs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client = SlowCleanupClient()
    seen: list[RequestOutput] = []

    def fail_on_second(out: RequestOutput) -> None:
        seen.append(out)
        if len(seen) == 2:
            raise RuntimeError("building the response failed")

    with pytest.raises(RuntimeError):
        await collect_one(client, seq(10), None, fail_on_second)  # type: ignore[arg-type]
    assert client.aborted == ["r1"]  # closed by collect_one, not later by the garbage collector
