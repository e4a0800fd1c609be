"""What the two generation routes share: sequences, admission, whole and streamed responses.

A request becomes ``len(prompts) * max(n, best_of)`` sequences (choice index ``prompt_index * per_prompt + i``;
sample ``i`` gets ``seed + i`` so samples differ under a fixed seed). That total is checked against
``--max-seqs-per-request`` before anything is built from it. Everything that can be refused is checked before
any sequence starts; then ``client.admit(len(seqs))`` reserves every sequence's slot at once (a 429 leaves
nothing reserved), every ``generate`` takes one of them, and the admission is released on every way out
(``Fanout.close()``, ``collect_one``); a stream's fanout is also closed when the request's ASGI call ends
(``asyncdp.api.request_close``), for a client that leaves before the response body starts. The first item of the merged output is awaited before the response
starts, so errors the client raises before its first yield (E2/E3, 429, 503) keep their HTTP status even for
streams. After that, a failure in a stream is an SSE error event followed by ``data: [DONE]``; a non-streamed
request the engine or the server abandons is an error status (503 naming the cause), never a partial 200.

With ``--enable-log-requests`` a request's prompts are logged as it is admitted (``accept_request``), and with
``--enable-log-outputs`` too what it generated, in vLLM's request logger's words: each choice once it ends, or each
delta of a stream as it passes and then each choice's whole text (``OutputLog``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import anyio
import msgspec
from quart import Response

from asyncdp.api.context import AppState
from asyncdp.api.engine_client import SequenceGroup
from asyncdp.api.errors import status_and_body
from asyncdp.api.fanout import Fanout, Item, Sequence, collect_one
from asyncdp.api.openai_format import Choice
from asyncdp.api.request_close import on_close
from asyncdp.api.sse import DONE, sse
from asyncdp.errors import HTTPError, InvalidRequestError, ShuttingDownError
from asyncdp.messages import RequestOutput
from asyncdp.sampling_params import SamplingParams, sample_seed

log = logging.getLogger(__name__)


def check_length(num_prompt: int, max_tokens: int | None, max_model_len: int, field: str = "max_tokens",
                 min_tokens: int = 0, prompt_field: str = "prompt") -> None:
    """The prompt and ``max_tokens`` fit ``max_model_len``; else a 400 naming ``prompt_field`` (chat's prompt is
    its ``messages``), or ``field`` (the request's own name for the limit: chat's ``max_completion_tokens`` when it
    gave that one). Without
    ``max_tokens`` (chat: up to the context), ``min_tokens`` must fit the room the prompt leaves, as vLLM
    checks it against the max tokens it derives (never a silent cut at ``max_model_len``)."""
    if num_prompt + 1 > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length (max_model_len) is {max_model_len} tokens, but the prompt "
            f"has {num_prompt} tokens, which leaves no room for a generated token.", field=prompt_field)
    if max_tokens is not None and num_prompt + max_tokens > max_model_len:
        raise InvalidRequestError(
            f"This model's maximum context length (max_model_len) is {max_model_len} tokens. However, you "
            f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the prompt, {max_tokens} for the "
            f"completion). Please reduce the prompt or {field}.", field=field)
    room = max_model_len - num_prompt
    if max_tokens is None and min_tokens > room:
        raise InvalidRequestError(
            f"min_tokens ({min_tokens}) cannot exceed the tokens left in the context: this model's maximum "
            f"context length (max_model_len) is {max_model_len} tokens and the prompt has {num_prompt}, which "
            f"leaves {room}.", field="min_tokens")


def check_num_sequences(num_prompts: int, n: int, best_of: int | None, stream: bool, limit: int) -> int:
    """The sequences to run per prompt (``max(n, best_of)``), after the checks that bound the request."""
    if best_of is not None:
        if best_of < n:
            raise HTTPError(400, f"best_of ({best_of}) must be >= n ({n}).", param="best_of")
        if stream and best_of != n:
            raise HTTPError(400, "best_of is not supported with stream.", param="best_of")
    per_prompt = max(n, best_of or 1)
    if num_prompts * per_prompt > limit:
        field = "best_of" if best_of is not None and best_of > n else ("n" if n > 1 else "prompt")
        raise HTTPError(
            400, f"This request asks for {num_prompts} prompt(s) x {per_prompt} sequences = "
                 f"{num_prompts * per_prompt} sequences; this server allows at most {limit} per request "
                 f"(--max-seqs-per-request).", param=field)
    return per_prompt


def sequences(base_id: str, prompt_ids: list[list[int]], params: SamplingParams, per_prompt: int) -> list[Sequence]:
    seqs = []
    for p, ids in enumerate(prompt_ids):
        group = None if per_prompt == 1 else SequenceGroup(params.n, per_prompt)  # (metrics: vLLM's parent)
        for i in range(per_prompt):
            if per_prompt == 1:  # the sequence's params are the request's (seed + 0); frozen, so shared safely
                one = params
            else:
                one = msgspec.structs.replace(params, n=1, seed=sample_seed(params.seed, i))
            seqs.append(Sequence(p * per_prompt + i, f"{base_id}-{p}-{i}", ids, one, group))
    return seqs


def cached_prompt_tokens(state: AppState, cached: list[int], per_prompt: int) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` (None without ``--enable-prompt-tokens-details``) from each
    sequence's prefix-cache hit (by choice index, before ``best_choices`` renumbers): per prompt, its first
    sample's hit, as the offline ``LLM`` reports it (its siblings may hit the blocks sample 0 computed, which were
    not cached when the request came), summed over the prompts (the prompt tokens the cache supplied; vLLM
    reports the last prompt's only)."""
    return sum(cached[::per_prompt]) if state.enable_prompt_tokens_details else None


def best_choices(choices: list[Choice], per_prompt: int, n: int) -> list[Choice]:
    """``best_of``: per prompt, the ``n`` sequences with the highest cumulative logprob, renumbered."""
    if per_prompt == n:
        return choices
    best = []
    ordered = sorted(choices, key=lambda c: c.index)
    for p in range(len(ordered) // per_prompt):
        group = sorted(ordered[p * per_prompt:(p + 1) * per_prompt], key=lambda c: c.cumulative_logprob,
                       reverse=True)
        for j, c in enumerate(group[:n]):
            c.index = p * n + j
            best.append(c)
    return best


def accept_request(state: AppState, seqs: list[Sequence]) -> None:
    """A request's log line, as it is admitted (its checks passed, ``--max-logprobs``'s in
    ``asyncdp.api.params.sampling_params``): ``--enable-log-requests``, one INFO line per prompt with its sampling
    parameters and at most ``--max-log-len`` of its token ids."""
    if not state.log_requests:
        return
    logged: set[str] = set()
    for seq in seqs:  # (the ids are "{request}-{prompt}-{sample}": a prompt's samples share its line)
        prompt_id = seq.request_id.rsplit("-", 1)[0]
        if prompt_id not in logged:
            logged.add(prompt_id)
            log.info("Received request %s: params: %s, prompt_token_ids: %s.", prompt_id, seq.params,
                     seq.prompt_token_ids[:state.max_log_len])


async def run_whole(state: AppState, seqs: list[Sequence], hint: Any, key: str | None = None, *,
                    keep_token_ids: bool = False) -> list[Choice]:
    """Every sequence's outputs, accumulated per choice, for a non-streamed response (with each choice's
    generated token ids too when ``keep_token_ids``)."""
    state.producers()  # 503 while draining or not serving yet, before anything is reserved
    accept_request(state, seqs)
    admission = state.client.admit(len(seqs))
    keep_token_ids = keep_token_ids or state.log_outputs
    if len(seqs) == 1:  # no fan-out to merge: the handler iterates the one sequence itself
        choice = Choice(seqs[0].index, token_ids=[] if keep_token_ids else None)
        if not await collect_one(state.client, seqs[0], hint, choice.add, admission, key):
            raise RuntimeError("every sequence ended without output")
        return _logged(state, seqs, [choice])
    try:
        fan = Fanout(state.producers(), state.client, seqs, hint, admission, key)
    except BaseException:
        admission.release()
        raise
    try:
        choices = [Choice(seq.index, token_ids=[] if keep_token_ids else None) for seq in seqs]
        while (item := await fan.receive()) is not None:
            index, out = item
            if isinstance(out, Exception):
                raise out
            choices[index].add(out)
    finally:
        fan.close()
    return _logged(state, seqs, choices)



def _logged(state: AppState, seqs: list[Sequence], choices: list[Choice]) -> list[Choice]:
    """``choices``, logged first with ``--enable-log-outputs`` (nothing is built for the log without it)."""
    if state.log_outputs:
        OutputLog(state, seqs).whole(choices)
    return choices

async def start_stream(state: AppState, seqs: list[Sequence], hint: Any,
                       key: str | None = None) -> tuple[Items, Item]:
    """Admit, start the producers and wait for the first item; raise (and release everything) on an error."""
    tg = state.producers()
    accept_request(state, seqs)
    admission = state.client.admit(len(seqs))
    try:
        fan = Fanout(tg, state.client, seqs, hint, admission, key)
    except BaseException:
        admission.release()
        raise
    try:
        on_close(fan.close)  # however the request ends, even before the response body starts (request_close)
        try:
            first = await fan.receive()
        except anyio.ClosedResourceError:  # the request's ASGI call ended under this task (server stopping)
            raise ShuttingDownError("The request was closed before its first output.") from None
        if first is None:
            raise RuntimeError("every sequence ended without output")
        if isinstance(first[1], Exception):
            raise first[1]
    except BaseException:
        fan.close()
        raise
    if not state.log_outputs:
        return fan, first
    logged = OutputLog(state, seqs, fan)
    logged.delta(first)
    return logged, first


class Items(Protocol):
    """Where a stream's items come from: a ``Fanout``, or a finished beam search's (``beam_search.Finished``)."""

    async def receive(self) -> Item | None: ...

    def close(self) -> None: ...


class OutputLog:
    """``--enable-log-outputs``: vLLM's "Generated response" lines, the text cut at ``--max-log-len`` characters and
    the ids at as many ids. A whole response logs each choice (``whole``); a stream, passed through as its
    ``Items``, logs each item's delta with its new ids, then, once every sequence ended, each choice's whole text."""

    def __init__(self, state: AppState, seqs: list[Sequence], items: Items | None = None) -> None:
        self._state, self._items = state, items
        self._ids = {seq.index: seq.request_id for seq in seqs}
        self._texts = dict.fromkeys(self._ids, "")

    def _log(self, index: int, how: str, text: str, ids: list[int] | None, finish_reason: str | None) -> None:
        cut = self._state.max_log_len
        log.info("Generated response %s%s: output: %r, output_token_ids: %s, finish_reason: %s", self._ids[index],
                 how, text[:cut], None if ids is None else ids[:cut], finish_reason)

    def whole(self, choices: list[Choice]) -> None:
        for c in choices:
            self._log(c.index, "", c.text, c.token_ids, c.finish_reason)

    def delta(self, item: Item) -> None:
        index, out = item
        if not isinstance(out, Exception) and out.new_text:  # (as vLLM: a delta without text is not logged)
            self._texts[index] += out.new_text
            self._log(index, " (streaming delta)", out.new_text, list(out.new_token_ids), out.finish_reason)

    async def receive(self) -> Item | None:
        assert self._items is not None
        item = await self._items.receive()
        if item is None:
            for index, text in self._texts.items():
                self._log(index, " (streaming complete)", text, None, "streaming_complete")
        else:
            self.delta(item)
        return item

    def close(self) -> None:
        assert self._items is not None
        self._items.close()


def stream_response(
    fan: Items, first: Item, to_events: Callable[[int, RequestOutput], list[bytes]], prologue: list[bytes],
    epilogue: Callable[[], list[bytes]],
) -> Response:
    async def body() -> AsyncIterator[bytes]:
        try:
            for event in prologue:
                yield event
            item: Item | None = first
            while item is not None:
                index, out = item
                if isinstance(out, Exception):
                    _, error = status_and_body(out)
                    yield sse(error)
                    yield DONE
                    return
                for event in to_events(index, out):
                    yield event
                try:
                    item = await fan.receive()
                except anyio.ClosedResourceError:
                    return  # closed when the request's ASGI call ended (Quart on asyncio can leave this task
                    # running when the server cancels the call at its shutdown deadline): cut short, no [DONE]
            for event in epilogue():
                yield event
            yield DONE
        finally:
            fan.close()  # on disconnect too: cancels the producers, which aborts their requests (and the
            # request's on_close closes it when the client left before this body started)

    response = Response(body(), content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.timeout = None
    return response
