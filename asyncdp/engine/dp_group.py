"""The DP control collective a MoE rank's lockstep loop needs (spec §5.5, §8.3, §8.6), and an in-memory group.

Theory of operation. The lockstep loop only ever needs one collective: an all-reduce of a short int vector
(``sum`` for the unfinished/pause flags of a sync step, ``max`` for the resume barrier). :class:`DPGroup` is
that interface; ``asyncdp.model.distributed.TorchDPGroup`` implements it over a torch.distributed gloo group
on the rank's execution thread, and :class:`MemoryDPGroup` implements it for N ranks that share one anyio
event loop (tests and the simulation harness).

Calls pair up by order, as with a real process group: the k-th call of every member is one collective.
Members that disagree about the op or the vector length at the same call are a lockstep violation, which
:class:`MemoryDPGroup` reports as :class:`DPGroupError` on every member instead of hanging.

Teardown: ``abort()`` makes every pending and future call raise :class:`DPGroupAborted`, so a rank blocked
in a collective can always be unblocked without waiting for a timeout (spec §13). In the in-memory group,
an abort by any member aborts the whole group: the others could never complete a collective again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import anyio

from asyncdp.errors import DPGroupAborted, DPGroupError

REDUCE_OPS = ("sum", "max")


class DPGroup(Protocol):
    """One member of the DP control group. ``dp_rank`` is the member's rank in ``range(dp_size)``."""

    dp_rank: int
    dp_size: int

    async def all_reduce(self, values: list[int], op: str = "sum") -> list[int]:
        """Element-wise reduction (``"sum"`` or ``"max"``) of ``values`` over every member; the k-th call of
        every member forms one collective. Raises :class:`DPGroupAborted` once the group is aborted."""
        ...

    def abort(self) -> None:
        """Make every pending and future call raise (teardown). Idempotent; never blocks."""
        ...


def reduce_values(vectors: list[list[int]], op: str) -> list[int]:
    if op == "sum":
        return [sum(col) for col in zip(*vectors, strict=True)]
    if op == "max":
        return [max(col) for col in zip(*vectors, strict=True)]
    raise DPGroupError(f"all_reduce op must be one of {', '.join(REDUCE_OPS)} (got {op!r})")


@dataclass(slots=True)
class _Collective:
    """The k-th collective of the group: contributions so far, and its result once every member has called."""

    op: str
    length: int
    contributions: dict[int, list[int]] = field(default_factory=dict)
    done: anyio.Event = field(default_factory=anyio.Event)
    result: list[int] | None = None
    error: DPGroupError | None = None
    readers: int = 0


class _Rendezvous:
    def __init__(self, dp_size: int) -> None:
        self.dp_size = dp_size
        self.collectives: dict[int, _Collective] = {}
        self.aborted: str | None = None

    def abort(self, reason: str) -> None:
        if self.aborted is not None:
            return
        self.aborted = reason
        for coll in self.collectives.values():
            coll.done.set()


class MemoryDPGroup:
    """A member of an in-process DP group: pure anyio events, no threads (works under trio's MockClock)."""

    def __init__(self, rendezvous: _Rendezvous, dp_rank: int) -> None:
        self._rv = rendezvous
        self.dp_rank = dp_rank
        self.dp_size = rendezvous.dp_size
        self.num_calls = 0  # collectives this member has entered (its generation counter)

    @classmethod
    def create(cls, dp_size: int) -> list[MemoryDPGroup]:
        """``dp_size`` members of one new group, indexed by rank."""
        if dp_size < 1:
            raise ValueError(f"dp_size must be >= 1 (got {dp_size})")
        rv = _Rendezvous(dp_size)
        return [cls(rv, r) for r in range(dp_size)]

    @property
    def aborted(self) -> bool:
        return self._rv.aborted is not None

    def abort(self, reason: str | None = None) -> None:
        self._rv.abort(reason or f"rank {self.dp_rank} aborted the DP group")

    def _check_aborted(self) -> None:
        if self._rv.aborted is not None:
            raise DPGroupAborted(f"DP group aborted: {self._rv.aborted}")

    async def all_reduce(self, values: list[int], op: str = "sum") -> list[int]:
        self._check_aborted()
        if op not in REDUCE_OPS:
            raise DPGroupError(f"all_reduce op must be one of {', '.join(REDUCE_OPS)} (got {op!r})")
        gen = self.num_calls
        self.num_calls += 1
        rv = self._rv
        coll = rv.collectives.get(gen)
        if coll is None:
            coll = rv.collectives[gen] = _Collective(op, len(values))
        elif coll.error is None and (coll.op != op or coll.length != len(values)):
            coll.error = DPGroupError(
                f"lockstep violation in collective #{gen}: rank {self.dp_rank} called all_reduce({op}, "
                f"{len(values)} values), an earlier member called all_reduce({coll.op}, {coll.length} values)")
        coll.contributions[self.dp_rank] = list(values)
        if len(coll.contributions) == rv.dp_size:
            if coll.error is None:
                coll.result = reduce_values(list(coll.contributions.values()), op)
            coll.done.set()
        await coll.done.wait()
        coll.readers += 1
        if coll.readers == rv.dp_size:
            rv.collectives.pop(gen, None)
        if coll.error is not None:
            raise coll.error
        if coll.result is None:  # woken by abort before every member arrived
            self._check_aborted()
        assert coll.result is not None
        return list(coll.result)
