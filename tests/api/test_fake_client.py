"""FakeEngineClient: deterministic outputs, abort recording, failure switches, virtual-time delays."""

from __future__ import annotations

from contextlib import aclosing

import pytest
import trio
import trio.testing

from asyncdp.api.engine_client import RankHint
from asyncdp.errors import InvalidRequestError, PromptTooLongError, QueueFullError
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing import FakeEngineClient, byte_tokenizer


def test_byte_tokenizer_round_trips_text_and_renders_chatml() -> None:
    tok = byte_tokenizer()
    assert tok.decode(tok.encode("héllo wörld")) == "héllo wörld"
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                       tokenize=False)
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")


async def collect(fake: FakeEngineClient, prompt: list[int], params: SamplingParams, **kw: object) -> list:
    async with aclosing(fake.generate("r", prompt, params, **kw)) as gen:  # type: ignore[arg-type]
        return [out async for out in gen]


@pytest.mark.trio
async def test_outputs_are_deterministic_and_end_with_finished() -> None:
    fake = FakeEngineClient()
    outs = await collect(fake, [1, 2, 3], SamplingParams(max_tokens=4, seed=2))
    again = await collect(fake, [1, 2, 3], SamplingParams(max_tokens=4, seed=2))
    assert [o.new_token_ids[0] for o in outs] == fake.expected_token_ids([1, 2, 3], 2, 4)
    assert outs == again
    assert [o.finished for o in outs] == [False, False, False, True]
    assert outs[-1].finish_reason == "length"
    assert fake.finished == ["r", "r"] and fake.aborted == []


@pytest.mark.trio
async def test_leaving_early_records_an_abort_counts_its_tokens_but_no_success() -> None:
    fake = FakeEngineClient()
    async with aclosing(fake.generate("early", [1], SamplingParams(max_tokens=10))) as gen:
        async for _ in gen:
            break
    assert fake.aborted == ["early"] and fake.num_active == 0
    text = fake.metrics.render()
    assert b"vllm:request_success_total{" not in text
    assert b'vllm:generation_tokens_total{engine="0",model_name="fake-model"} 1.0' in text


@pytest.mark.trio
async def test_token_delay_runs_on_the_virtual_clock(mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = 0
    fake = FakeEngineClient(token_delay_s=0.5)
    start = trio.current_time()
    await collect(fake, [1], SamplingParams(max_tokens=4))
    assert trio.current_time() - start == pytest.approx(2.0)
    assert b"vllm:time_to_first_token_seconds_sum" in fake.metrics.render()


@pytest.mark.trio
async def test_switches_raise_the_documented_errors_before_the_first_output() -> None:
    fake = FakeEngineClient(max_model_len=4, num_ranks=2)
    with pytest.raises(PromptTooLongError):
        await collect(fake, [1, 2, 3, 4], SamplingParams())
    with pytest.raises(InvalidRequestError, match=r"out of range \[0, 2\)"):
        await collect(fake, [1], SamplingParams(), rank_hint=RankHint(local_index=2))
    fake.queue_full = True
    with pytest.raises(QueueFullError):
        await collect(fake, [1], SamplingParams())
    assert fake.submitted == []


@pytest.mark.trio
async def test_admit_reserves_all_or_nothing_and_every_generate_takes_one_slot() -> None:
    fake = FakeEngineClient(max_queued_requests=4)
    with pytest.raises(InvalidRequestError):
        fake.admit(5)  # more than ever fits
    assert fake.num_in_flight == 0
    admission = fake.admit(3)
    assert fake.num_in_flight == 3
    with pytest.raises(QueueFullError):
        fake.admit(2)
    outs = await collect(fake, [1], SamplingParams(max_tokens=2), admission=admission)
    assert outs[-1].finished and fake.num_in_flight == 2  # the finished request gave its slot back
    admission.release()
    admission.release()  # idempotent
    assert fake.num_in_flight == 0
    with pytest.raises(RuntimeError, match="no slot left"):
        await collect(fake, [1], SamplingParams(max_tokens=1), admission=admission)
    assert fake.num_in_flight == 0
