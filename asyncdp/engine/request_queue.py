"""The waiting queue of a rank's scheduler, one class per ``--scheduling-policy`` (vLLM's request queues).

Both take the same calls from :class:`~asyncdp.engine.scheduler.Scheduler`: ``append`` (a new request, or one
whose grammar compiled), ``appendleft`` (a preempted request re-entering), ``peek`` / ``take`` (the next to admit,
then its removal once admitted), ``preempted()`` (those waiting to be recomputed), ``remove``, ``clear``, ``len``.

* :class:`FcfsQueue` (``fcfs``, the default) is the deque it always was: new requests at the back, preempted ones
  at the front, so the preempted requests are its head and cost nothing to tell apart.
* :class:`PriorityQueue` (``priority``) admits by ``(priority, arrival_time)``, lower first (vLLM's semantics), ties
  in the order the requests first queued. A preempted request keeps its key, so it re-enters where it belongs,
  not at the front; the preempted ones sit in a heap of their own, so a ``paused-new`` scheduler, which admits
  only them, finds the best of them in O(1).

:func:`priority_key` is the same order for the running requests: under ``priority`` the preemption victim is the
running request with the largest key (the lowest priority, the latest arrival), as vLLM's.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator
from itertools import takewhile

from asyncdp.engine.request import Request, RequestStatus


def _is_preempted(req: Request) -> bool:
    return req.status == RequestStatus.PREEMPTED


def priority_key(req: Request) -> tuple[int, float, int]:
    """``(priority, arrival_time, queue_seq)``: lower is served first, larger is preempted first."""
    return req.sampling_params.priority, req.arrival_time, req.queue_seq


class FcfsQueue(deque[Request]):
    """First come, first served; a preempted request re-enters at the front."""

    def peek(self, *, preempted_only: bool = False) -> Request | None:
        """The next request to admit (None: none, or with ``preempted_only`` the head is not preempted)."""
        if not self:
            return None
        req = self[0]
        return None if preempted_only and req.status != RequestStatus.PREEMPTED else req

    def take(self, req: Request) -> None:
        """Remove ``req``, the request :meth:`peek` returned."""
        self.popleft()

    def preempted(self) -> Iterator[Request]:
        """The preempted requests: the head (O(their number))."""
        return takewhile(_is_preempted, self)


class PriorityQueue:
    """By ``(priority, arrival_time)``, then first queued; preempted requests keep their place in that order."""

    __slots__ = ("_new", "_preempted", "_seq")

    def __init__(self) -> None:
        # Heaps of (priority, arrival_time, queue_seq, request); queue_seq is unique, so requests never compare.
        self._new: list[tuple[int, float, int, Request]] = []
        self._preempted: list[tuple[int, float, int, Request]] = []
        self._seq = itertools.count()

    def _entry(self, req: Request) -> tuple[int, float, int, Request]:
        if req.queue_seq < 0:  # its first time in the queue: its place among equal keys from now on
            req.queue_seq = next(self._seq)
        return req.sampling_params.priority, req.arrival_time, req.queue_seq, req

    def append(self, req: Request) -> None:
        heapq.heappush(self._preempted if _is_preempted(req) else self._new, self._entry(req))

    appendleft = append  # a preempted request: its key, not the front, says where it goes

    def peek(self, *, preempted_only: bool = False) -> Request | None:
        best = self._preempted[0] if self._preempted else None
        if not preempted_only and self._new and (best is None or self._new[0] < best):
            best = self._new[0]
        return None if best is None else best[3]

    def take(self, req: Request) -> None:
        heapq.heappop(self._preempted if self._preempted and self._preempted[0][3] is req else self._new)

    def preempted(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._preempted))

    def remove(self, req: Request) -> None:
        heap = self._preempted if _is_preempted(req) else self._new
        for i, entry in enumerate(heap):
            if entry[3] is req:
                heap[i] = heap[-1]
                heap.pop()
                heapq.heapify(heap)
                return
        raise ValueError(f"{req!r} is not in the waiting queue")

    def clear(self) -> None:
        self._new.clear()
        self._preempted.clear()

    def __len__(self) -> int:
        return len(self._new) + len(self._preempted)

    def __bool__(self) -> bool:
        return bool(self._new) or bool(self._preempted)

    def __iter__(self) -> Iterator[Request]:
        """In admission order (O(n log n): for reports and tests, not the step)."""
        return (entry[3] for entry in sorted(self._new + self._preempted))


WaitingQueue = FcfsQueue | PriorityQueue


def make_waiting_queue(policy: str) -> WaitingQueue:
    """The queue of ``--scheduling-policy`` ``policy`` (one of ``asyncdp.config.choices.SCHEDULING_POLICIES``)."""
    if policy == "fcfs":
        return FcfsQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"scheduling policy must be fcfs or priority, got {policy!r}")

