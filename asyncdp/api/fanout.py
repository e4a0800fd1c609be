"""Run the sequences of one HTTP request (prompts x n) as producer tasks, merged into one stream.

Each sequence is iterated by exactly one producer task, from its first output to its end, and its generator
is closed when the task leaves it: leaving early (the consumer went away, the server is stopping) closes the
generator, which aborts the request on its engine. Producers live in the app's task group, not in the
response's async generator, because Quart iterates response bodies in a different task than the handler and
a task group must not be held open across a ``yield``.

The consumer reads ``(choice_index, RequestOutput | Exception)`` items; the stream ends when every producer is
done. ``close()`` (sync, idempotent) cancels the producers and releases the request's ``Admission`` (the slots
no producer took); the HTTP layer calls it from a ``finally``. A producer whose scope is already cancelled when
it first runs never calls ``generate``, so no sequence starts on an admission that was released.

``collect_one`` is the fast path for the commonest request, one non-streamed sequence: the handler task
iterates the client's generator itself, with the same close-on-exit rule, and no producer task, memory stream
or cancel scopes are created per request. It releases its admission on the way out, too.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from asyncdp.api.engine_client import Admission, EngineClient, RankHint, SequenceGroup
from asyncdp.messages import RequestOutput
from asyncdp.sampling_params import SamplingParams

Item = tuple[int, RequestOutput | Exception]

# Upper bound on a client's cleanup when a sequence is closed early (it sends an abort to its engine).
_ACLOSE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Sequence:
    index: int  # the choice index in the response
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    group: SequenceGroup | None = None  # the prompt's sequences, when it runs several (n, best_of)


class Fanout:
    def __init__(
        self, tg: TaskGroup, client: EngineClient, seqs: list[Sequence], rank_hint: RankHint | None,
        admission: Admission, routing_key: str | None = None,
    ) -> None:
        self._admission = admission
        send, self._recv = anyio.create_memory_object_stream[Item](max_buffer_size=8 * len(seqs))
        self._scopes = [anyio.CancelScope() for _ in seqs]
        try:
            with send:
                for seq, scope in zip(seqs, self._scopes, strict=True):
                    tg.start_soon(self._produce, client, seq, rank_hint, admission, scope, send.clone(), routing_key,
                                  name=f"generate {seq.request_id}")
        except BaseException:
            self.close()
            raise

    @staticmethod
    async def _produce(
        client: EngineClient, seq: Sequence, hint: RankHint | None, admission: Admission,
        scope: anyio.CancelScope, send: MemoryObjectSendStream[Item], routing_key: str | None,
    ) -> None:
        with scope, send:
            if scope.cancel_called:  # closed before this task first ran: the admission may be released
                return
            outputs = client.generate(seq.request_id, seq.prompt_token_ids, seq.params, rank_hint=hint,
                                      admission=admission, routing_key=routing_key, group=seq.group)
            try:
                try:
                    async for out in outputs:
                        await send.send((seq.index, out))
                finally:
                    # Closing an unfinished generator aborts its request. Shielded (and bounded) so the
                    # client can still send the abort when this task is being cancelled.
                    aclose = getattr(outputs, "aclose", None)
                    if aclose is not None:
                        with anyio.move_on_after(_ACLOSE_TIMEOUT_S, shield=True):
                            await aclose()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the consumer left; closing the generator above aborted the request
            except Exception as exc:  # delivered to the consumer, which maps it to HTTP
                with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await send.send((seq.index, exc))

    async def receive(self) -> Item | None:
        """The next item, or None once every producer is done."""
        try:
            return await self._recv.receive()
        except anyio.EndOfStream:
            return None

    def close(self) -> None:
        for scope in self._scopes:
            scope.cancel()
        self._recv.close()
        self._admission.release()


async def collect_one(
    client: EngineClient, seq: Sequence, hint: RankHint | None, on_output: Callable[[RequestOutput], None],
    admission: Admission | None = None, routing_key: str | None = None, *, release: bool = True,
) -> int:
    """Iterate one sequence in the calling task, passing each output to ``on_output``; return the count.

    The generator is closed on the way out (shielded and bounded, as in the producers), which aborts an
    unfinished request when the caller is cancelled or ``on_output`` raises; then ``admission`` is released,
    unless ``release`` is false (an admission shared with other sequences, which its owner releases)."""
    count = 0
    exhausted = False
    try:
        outputs = client.generate(seq.request_id, seq.prompt_token_ids, seq.params, rank_hint=hint,
                                  admission=admission, routing_key=routing_key)
    except BaseException:
        if admission is not None and release:
            admission.release()
        raise
    try:
        async for out in outputs:
            on_output(out)
            count += 1
        exhausted = True  # a generator that ran to its end has nothing left to close
    finally:
        aclose = getattr(outputs, "aclose", None)
        if aclose is not None and not exhausted:
            with anyio.move_on_after(_ACLOSE_TIMEOUT_S, shield=True):
                await aclose()
        if admission is not None and release:
            admission.release()
    return count
