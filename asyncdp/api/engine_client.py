"""What the HTTP layer needs from an engine client, as a Protocol.

Implementations: ``asyncdp.apiserver.client.DPClient`` (the real DP client of an API-server process, talking to engine
processes over links) and ``asyncdp.testing.FakeEngineClient`` (deterministic, in-process, for API tests).

The client owns request metrics (``asyncdp.api.metrics``): it knows the owning rank and every token's timing. The
HTTP layer renders prompts, validates the body and maps exceptions (``asyncdp.api.errors``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from asyncdp.messages import RequestOutput
from asyncdp.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class RankHint:
    """A parsed rank hint (spec §7.6). ``local_index`` is the index among the managed ranks (header
    ``X-data-parallel-rank`` / body ``data_parallel_rank``); ``global_rank`` the global form."""

    local_index: int | None = None
    global_rank: int | None = None


@dataclass(slots=True)
class SequenceGroup:
    """The sequences one prompt of an HTTP request runs when it asks for several (``n``, ``best_of``): vLLM's
    parent request. The client observes the group's ``vllm:request_params_n`` and
    ``vllm:request_max_num_generation_tokens`` once its last sequence finishes; a sequence given no group is a
    group of one."""

    n: int  # the request's n
    num_sequences: int  # the sequences it runs (n, or best_of)
    num_finished: int = 0
    max_generation_tokens: int = 0

    def finish(self, num_generation_tokens: int) -> bool:
        """One sequence finished with ``num_generation_tokens``; True when it was the group's last."""
        self.num_finished += 1
        self.max_generation_tokens = max(self.max_generation_tokens, num_generation_tokens)
        return self.num_finished == self.num_sequences


class Admission(Protocol):
    """Slots reserved for the sequences of one HTTP request (prompts x n), taken all at once (issue: a request
    whose sequences do not all fit is refused whole, and nothing stays reserved)."""

    def release(self) -> None:
        """Give back every reserved slot no ``generate()`` call has taken yet. Idempotent; the HTTP layer calls
        it once the request's sequences have all started (or failed to), and on every error path."""


class EngineClient(Protocol):
    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def tokenizer(self) -> Any:
        """A Hugging Face tokenizer (``encode``, ``decode``, ``apply_chat_template``, ``eos_token_id``)."""

    def admit(self, num_sequences: int) -> Admission:
        """Reserve ``num_sequences`` admission slots at once, or raise (``QueueFullError`` past
        ``--max-queued-requests``, ``ShuttingDownError``, ``UnavailableError``) with nothing reserved."""

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        rank_hint: RankHint | None = None,
        admission: Admission | None = None,
        routing_key: str | None = None,
        group: SequenceGroup | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Submit one request and yield its output deltas until one has ``finished=True``.

        With ``admission`` the request takes one of its reserved slots instead of being admitted on its own.
        ``routing_key`` is the request's session key (a conversation, a user), for the balancer's policy.
        ``group``: the sequences of its prompt, when the request is one of several (metrics only).
        Raises before the first yield: ``InvalidRequestError`` (rank hint out of range, E2/E3; prompt too long),
        ``QueueFullError`` (admission limit), ``UnavailableError`` (no rank can serve, shutting down).
        Raises while iterating: ``EngineDeadError`` when the owning rank dies, ``ShuttingDownError`` when the
        server abandons the request (shutdown deadline, teardown): an abandoned request never ends as a normal
        output with ``finish_reason="abort"``; only a client-requested abort does.
        Leaving the iteration early (break, cancellation, client disconnect) aborts the request on its engine.
        Every path out of the iteration releases the request's admission slot.
        """

    def is_healthy(self) -> bool:
        """True when at least one managed rank can serve and the server is not shutting down."""

    def health_problem(self) -> str | None:
        """None while ``is_healthy()``; else the message of ``/health``'s 503, naming the cause."""

    @property
    def shutting_down(self) -> bool:
        """True once the server began to shut down (new requests get 503 "the server is shutting down")."""

    def server_info(self) -> dict[str, Any]:
        """The ``/server_info`` document of spec §12.2, as seen by this process."""

    def load(self) -> dict[str, Any]:
        """The ``GET /load`` document: per managed rank, the load a router needs (docs/howto/external-lb.md)."""

    async def call_utility(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run a utility method (``pause``, ``resume``, ``is_paused``, ``reset_prefix_cache``, ...) on every managed
        engine; a rank's refusal raises (``PauseError``; ``PrefixCacheBusyError`` for a reset with KV blocks in use)."""
