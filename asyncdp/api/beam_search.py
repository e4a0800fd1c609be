"""Beam search (``use_beam_search: true``), in the API layer over the engine client, as vLLM does it.

Theory of operation: the engine knows nothing of beams. A prompt starts with one empty beam; each step asks the
engine, for every live beam, for one token of ``prompt + beam`` with ``logprobs = 2 * n`` (greedy, ``max_tokens:
1``): one ordinary request per beam, issued together in a task group and routed like any request (the beams
share the prompt, so the prefix cache makes each step cost about one token per beam). Every alternative becomes a
candidate scored by its cumulative logprob; a candidate that ends the beam (EOS unless ``ignore_eos``, a
``stop_token_ids`` id, a ``stop`` string; none before ``min_tokens``) is finished and does not take a place; the
``n`` best others are the next live beams. After ``max_tokens`` steps (or when no candidate is left), finished and
live beams are ranked by vLLM's ``cum_logprob / length ** length_penalty``, where ``length`` counts the prompt's
tokens too and not a trailing EOS, and the ``n`` best are the choices, best first.

``BeamSearch`` is the bookkeeping, pure; ``run_beam_search`` the async shell. Each step's requests hold one
admission for the step; leaving early (an error, the client's disconnect) closes every step request's generator,
which aborts it on its engine, so no request outlives the search. ``check_beam_search`` bounds the request:
``2 * n`` logprobs within ``--max-logprobs`` (vLLM's 400, naming ``n``), ``prompts * n`` within
``--max-seqs-per-request``, and
refuses, with a 400 naming it, what the search would ignore (sampling parameters, ``best_of``, structured outputs)
and, on the completions route, ``stream`` (as vLLM's completions route does).

A streamed chat request (vLLM's chat route streams a search) gets its answer when the search ends, as vLLM sends
it: ``stream_beam_search`` runs the search in the handler, like the non-streamed path (its errors keep their HTTP
status; a client that leaves cancels it and its step requests are aborted), then serves each finished beam as one
finished ``RequestOutput`` to the chat route's ordinary stream formatting: each choice's role chunk, then each beam
whole in one chunk with its finish reason (and logprobs, token ids, ``continuous_usage_stats`` usage as asked), the
usage chunk with ``include_usage``, ``[DONE]``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import msgspec

from asyncdp.api.context import AppState
from asyncdp.api.engine_client import Admission, EngineClient, RankHint
from asyncdp.api.fanout import Item, Sequence, collect_one
from asyncdp.api.generate import accept_request, check_num_sequences
from asyncdp.api.openai_format import Choice
from asyncdp.api.schemas import _Common
from asyncdp.errors import HTTPError
from asyncdp.messages import Logprob, RequestOutput, TokenLogprobs
from asyncdp.sampling_params import SamplingParams, check_logprobs

# Parameters beam search does not use -> the values that ask for nothing (null always does). The search ranks
# the model's raw log-probabilities, so sampling parameters would change nothing: they are refused, not ignored.
IGNORED_BY_BEAM_SEARCH: dict[str, tuple[Any, ...]] = {
    "temperature": (0, 1), "top_p": (1,), "top_k": (0, -1), "min_p": (0,), "presence_penalty": (0,),
    "frequency_penalty": (0,), "repetition_penalty": (1,), "logit_bias": ({},), "bad_words": ([],),
    "allowed_token_ids": (),
}


def check_beam_search(req: _Common, params: SamplingParams, num_prompts: int, limit: int, *,
                      logprobs_limit: int | None, may_stream: bool = False) -> int:
    """The beams per prompt (``n``) of a ``use_beam_search`` request, after the checks that bound it; a request
    without beam search may not set ``length_penalty``. ``logprobs_limit``: the most logprobs a step may ask
    (``--max-logprobs``). ``may_stream``: the route streams a search (chat's)."""
    if not req.use_beam_search:
        if req.length_penalty is not None:
            raise HTTPError(400, "length_penalty is only used with use_beam_search: true.", param="length_penalty")
        return 0
    n = req.n or 1
    if req.stream and not may_stream:
        raise HTTPError(400, "Streaming is not currently supported with beam search (use_beam_search).",
                        param="stream")
    check_logprobs(params, logprobs_limit, beam_width=n)  # (each step asks 2 * n: vLLM's 400)
    if req.best_of is not None and req.best_of != n:
        raise HTTPError(400, "best_of is not supported with use_beam_search (n is the number of beams).",
                        param="best_of")
    for name, harmless in IGNORED_BY_BEAM_SEARCH.items():
        value = getattr(req, name, None)
        if value is not None and not any(value == a for a in harmless):
            raise HTTPError(400, f"{name} is not supported with use_beam_search: the search ranks the model's "
                                 f"raw logprobs.", param=name)
    if params.structured is not None:
        raise HTTPError(400, f"{params.structured.param} is not supported with use_beam_search.",
                        param=params.structured.param)
    return check_num_sequences(num_prompts, n, None, False, limit)


@dataclass(frozen=True, slots=True)
class Beam:
    token_ids: tuple[int, ...] = ()  # generated, the prompt left out
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per token of token_ids
    cum_logprob: float = 0.0  # includes a finishing EOS's even when token_ids leaves it out (as vLLM)
    finish_reason: str | None = None  # None: live, or cut by max_tokens ("length")
    stop_reason: str | int | None = None
    text: str | None = None  # set when a stop string cut it


@dataclass(frozen=True, slots=True)
class BeamRules:
    width: int
    num_prompt_tokens: int
    eos_token_id: int | None
    length_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    num_top: int = 0  # the alternatives each returned token's logprobs carry (the request's logprobs)
    decode: Callable[[list[int]], str] | None = None  # for stop strings

    def score(self, beam: Beam) -> float:
        """vLLM's ``get_beam_search_score``: the prompt counts in the length, a trailing EOS does not."""
        length = self.num_prompt_tokens + len(beam.token_ids)
        if beam.token_ids and beam.token_ids[-1] == self.eos_token_id:
            length -= 1
        return beam.cum_logprob / (length ** self.length_penalty)


@dataclass
class BeamSearch:
    """One prompt's beams: ``step`` takes each live beam's next-token logprobs, ``result`` ranks the beams."""

    rules: BeamRules
    live: list[Beam] = field(default_factory=lambda: [Beam()])
    done: list[Beam] = field(default_factory=list)

    def step(self, next_logprobs: list[TokenLogprobs]) -> None:
        """One token for every live beam (``next_logprobs[i]`` is live beam ``i``'s)."""
        r = self.rules
        candidates: list[tuple[float, Beam, int, float, tuple[Logprob, ...]]] = []
        for beam, lp in zip(self.live, next_logprobs, strict=True):
            alternatives = {a.token_id: a.logprob for a in lp.top}
            alternatives.setdefault(lp.token_id, lp.logprob)
            may_stop = len(beam.token_ids) >= r.min_tokens
            for token, logprob in alternatives.items():
                cum = beam.cum_logprob + logprob
                stop_id = (token == r.eos_token_id and not r.ignore_eos) or token in r.stop_token_ids
                if stop_id and not may_stop:
                    continue  # the engine masks EOS and stop ids before min_tokens
                if stop_id:
                    entry = TokenLogprobs(token_id=token, logprob=logprob, top=lp.top[:r.num_top])
                    keep = r.include_stop_str_in_output
                    self.done.append(Beam(beam.token_ids + (token,) if keep else beam.token_ids,
                                          beam.logprobs + (entry,) if keep else beam.logprobs, cum, "stop", token))
                else:
                    candidates.append((cum, beam, token, logprob, lp.top))
        candidates.sort(key=lambda c: -c[0])  # (stable: ties keep the beams' order)
        live: list[Beam] = []
        for cum, beam, token, logprob, top in candidates:
            if len(live) == r.width:
                break
            entry = TokenLogprobs(token_id=token, logprob=logprob, top=top[:r.num_top])
            grown = Beam(beam.token_ids + (token,), beam.logprobs + (entry,), cum)
            stopped = self._stop_string(grown)
            if stopped is not None:
                self.done.append(stopped)
            else:
                live.append(grown)
        self.live = live

    def _stop_string(self, beam: Beam) -> Beam | None:
        r = self.rules
        if not r.stop or r.decode is None or len(beam.token_ids) < r.min_tokens:
            return None
        text = r.decode(list(beam.token_ids))
        hits = [(text.find(s), s) for s in r.stop if s in text]
        if not hits:
            return None
        at, s = min(hits)
        cut = text[:at + len(s)] if r.include_stop_str_in_output else text[:at]
        return Beam(beam.token_ids, beam.logprobs, beam.cum_logprob, "stop", s, cut)

    @property
    def settled(self) -> bool:
        """Whether no live beam can still enter the result: no live beam, or (``length_penalty <= 0``, where a
        beam's score only falls as it grows) ``width`` finished beams already score at least the best live one."""
        r = self.rules
        if not self.live:
            return True
        if r.length_penalty > 0 or len(self.done) < r.width:
            return False
        kth = sorted((r.score(b) for b in self.done), reverse=True)[r.width - 1]
        return kth >= max(r.score(b) for b in self.live)

    def result(self) -> list[Beam]:
        """The ``width`` best beams, finished and live, best first (live ones end with ``"length"``)."""
        ranked = sorted([*self.done, *self.live], key=self.rules.score, reverse=True)
        return [replace(b, finish_reason=b.finish_reason or "length") for b in ranked[:self.rules.width]]


async def run_beam_search(state: AppState, seqs: list[Sequence], width: int, length_penalty: float | None,
                          hint: RankHint | None, key: str | None) -> list[Choice]:
    """Each prompt's ``width`` best beams as choices numbered ``prompt * width + j``, best first. ``seqs``: one
    per prompt (index = the prompt's), its params the request's; the prompts are searched together."""
    state.producers()  # 503 while draining or not serving yet, before anything starts
    accept_request(state, seqs)
    found: list[list[Choice]] = [[] for _ in seqs]

    def job(seq: Sequence) -> Callable[[], Any]:
        async def search() -> None:
            found[seq.index] = await _search(state.client, seq, width, length_penalty, hint, key)
        return search

    await _all([job(seq) for seq in seqs])
    return [c for choices in found for c in choices]


async def stream_beam_search(state: AppState, seqs: list[Sequence], width: int, length_penalty: float | None,
                             hint: RankHint | None, key: str | None) -> tuple[Finished, Item]:
    """``run_beam_search``, its choices served as a stream's items (``generate.start_stream``'s result): one
    finished output per beam, carrying all of it."""
    choices = await run_beam_search(state, seqs, width, length_penalty, hint, key)
    items: list[Item] = [(c.index, RequestOutput(
        request_id=seqs[c.index // width].request_id, new_token_ids=c.token_ids or [], new_text=c.text,
        finished=True, finish_reason=c.finish_reason, stop_reason=c.stop_reason, logprobs=c.logprobs,
        prompt_logprobs=c.prompt_logprobs, num_prompt_tokens=len(seqs[c.index // width].prompt_token_ids),
        num_cached_tokens=c.num_cached_tokens)) for c in choices]
    return Finished(items[1:]), items[0]


class Finished:
    """Items already in hand, received as a ``Fanout``'s are; nothing runs, so ``close`` only drops them."""

    def __init__(self, items: list[Item]) -> None:
        self._items = deque(items)

    async def receive(self) -> Item | None:
        return self._items.popleft() if self._items else None

    def close(self) -> None:
        self._items.clear()


async def _all(jobs: list[Callable[[], Any]]) -> None:
    """Run ``jobs`` together. The first to fail cancels the others, and its exception is raised as it is (the
    HTTP error mapping reads the exception, not a group); a cancellation from outside cancels them all."""
    errors: list[Exception] = []
    async with anyio.create_task_group() as tg:
        async def run(job: Callable[[], Any]) -> None:
            try:
                await job()
            except Exception as exc:
                errors.append(exc)
                tg.cancel_scope.cancel()

        for job in jobs:
            tg.start_soon(run, job)
    if errors:
        raise errors[0]


async def _search(client: EngineClient, seq: Sequence, width: int, length_penalty: float | None,
                  hint: RankHint | None, key: str | None) -> list[Choice]:
    params, tok = seq.params, client.tokenizer
    prompt = seq.prompt_token_ids
    rules = BeamRules(
        width, len(prompt), getattr(tok, "eos_token_id", None), 1.0 if length_penalty is None else length_penalty,
        params.ignore_eos, frozenset(params.stop_token_ids), params.stop, params.include_stop_str_in_output,
        params.min_tokens, params.logprobs or 0, lambda ids: tok.decode(ids, skip_special_tokens=params.skip_special_tokens))
    search = BeamSearch(rules)
    # One greedy token with the alternatives the search ranks; what the step samples is not used.
    step_params = msgspec.structs.replace(
        params, n=1, max_tokens=1, temperature=0.0, seed=None, min_tokens=0, stop=(), stop_token_ids=(),
        ignore_eos=True, include_stop_str_in_output=False, logprobs=max(2 * width, params.logprobs or 0),
        prompt_logprobs=None)
    room = client.max_model_len - len(prompt)  # (a default max_tokens is not bounded by the prompt: this is)
    num_steps = room if params.max_tokens is None else min(params.max_tokens, room)
    first: _Next | None = None
    for step in range(num_steps):
        this = step_params if step else msgspec.structs.replace(step_params, prompt_logprobs=params.prompt_logprobs)
        nexts: list[_Next | None] = [None] * len(search.live)
        admission = client.admit(len(search.live))  # the step's requests, reserved together

        def job(i: int, ids: list[int], this: SamplingParams = this, admission: Admission = admission,
                nexts: list[_Next | None] = nexts, step: int = step) -> Callable[[], Any]:
            async def one() -> None:
                nexts[i] = await _next_token(client, f"{seq.request_id}-s{step}-b{i}", ids, this, hint, admission,
                                             key)
            return one

        try:
            await _all([job(i, prompt + list(b.token_ids)) for i, b in enumerate(search.live)])
        finally:
            admission.release()
        got = [n for n in nexts if n is not None]
        first = first or got[0]
        search.step([n.logprobs for n in got])
        if search.settled:
            break
    if first is None:  # (max_tokens >= 1 and a prompt within max_model_len make one step at least)
        raise RuntimeError("beam search ran no step")
    choices = []
    for j, beam in enumerate(search.result()):
        ids = list(beam.token_ids)
        text = beam.text
        if text is None:
            ended_by_id = beam.finish_reason == "stop" and ids and ids[-1] == beam.stop_reason
            text = rules.decode(ids[:-1] if ended_by_id else ids) if rules.decode else ""
        choices.append(Choice(seq.index * width + j, text, len(ids), beam.finish_reason, beam.stop_reason,
                              list(beam.logprobs), first.prompt_logprobs, first.num_cached_tokens, ids))
    return choices


@dataclass(frozen=True, slots=True)
class _Next:
    logprobs: TokenLogprobs  # the next token's alternatives
    prompt_logprobs: list[TokenLogprobs | None] | None
    num_cached_tokens: int


async def _next_token(client: EngineClient, request_id: str, ids: list[int], params: SamplingParams,
                      hint: RankHint | None, admission: Admission, key: str | None) -> _Next:
    """One step request, run to its end; closing it early (cancelled, failed) aborts it on its engine
    (``collect_one``). The step's admission is its owner's to release, once every beam's request started."""
    outs: list[RequestOutput] = []
    await collect_one(client, Sequence(0, request_id, ids, params), hint, outs.append, admission, key, release=False)
    logprobs = [lp for out in outs for lp in out.logprobs or ()]
    if not logprobs:
        raise RuntimeError(f"beam search step {request_id} ended without a token's logprobs")
    prompt_lps = next((out.prompt_logprobs for out in outs if out.prompt_logprobs is not None), None)
    return _Next(logprobs[0], prompt_lps, max(out.num_cached_tokens for out in outs))
