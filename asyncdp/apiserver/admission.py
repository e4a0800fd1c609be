"""Admission of the DP client: ``--max-queued-requests`` slots, reserved per HTTP request, all or nothing.

Theory of operation. ``check_admits`` is the pure decision (this process's count, or the node's pool when a node
table is shared by several API processes, see :mod:`asyncdp.apiserver.node_table`); :class:`ClientAdmission`
holds the slots one HTTP request reserved until each ``generate()`` takes one, and gives back the rest on
``release()``. The client owns the counts; this module only decides and hands slots back through a callback.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from asyncdp.apiserver.node_table import NodeTable, node_admits
from asyncdp.errors import InvalidRequestError, QueueFullError


def check_admits(num_inflight: int, num_sequences: int, limit: int | None, node: NodeTable | None,
                 client_index: int) -> None:
    """Raise ``QueueFullError`` unless ``num_sequences`` more slots fit under ``limit``; ``InvalidRequestError``
    (a 400, not a 429 a client would retry) when they could never fit, even with nothing in flight."""
    if limit is None:
        return
    capacity = limit if node is None else limit * node.num_processes
    if num_sequences > capacity:
        where = f"--max-queued-requests {limit}" + ("" if node is None else f" x {node.num_processes} API servers")
        raise InvalidRequestError(
            f"the request asks for {num_sequences} sequences (prompts x max(n, best_of)), more than this server "
            f"ever admits at once ({where}); send fewer prompts or a smaller n", field="n")
    if node is None:
        if num_inflight + num_sequences > limit:
            raise QueueFullError(
                f"too many requests in flight ({num_inflight} in flight + {num_sequences} requested > "
                f"--max-queued-requests {limit}); retry later")
        return
    siblings = node.sibling_inflight(client_index)  # the node's pool: K slots per API process, usable by any
    count = node.num_processes
    if not node_admits(num_inflight, siblings, num_sequences, limit, count):
        raise QueueFullError(
            f"too many requests in flight on this node ({num_inflight + siblings} in flight + "
            f"{num_sequences} requested > --max-queued-requests {limit} x {count} API servers); retry later")


class ClientAdmission:
    """Admission slots reserved by ``DPClient.admit`` for one HTTP request (the ``Admission`` protocol)."""

    __slots__ = ("_unreserve", "remaining")

    def __init__(self, unreserve: Callable[[int], None], num_sequences: int) -> None:
        self._unreserve = unreserve
        self.remaining = num_sequences

    def take(self) -> bool:
        """Turn one reserved slot into a request's slot; False when none is left."""
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        self._unreserve(1)
        return True

    def release(self) -> None:
        n, self.remaining = self.remaining, 0
        if n:
            self._unreserve(n)


class AdmissionSlots:
    """One client's admission count: requests in flight (``num_requests()``, the client's streams) plus slots
    reserved by :meth:`admit` and not yet taken; published to the node table on every change."""

    def __init__(self, limit: int | None, node: NodeTable | None, client_index: int,
                 num_requests: Callable[[], int]) -> None:
        self._limit = limit
        self._node = node
        self._client_index = client_index
        self._num_requests = num_requests
        self._reserved = 0
        self._idle = anyio.Event()  # replaced while slots are in use; set when the last one is given back

    @property
    def num_inflight(self) -> int:
        return self._num_requests() + self._reserved

    def admit(self, num_sequences: int) -> ClientAdmission:
        """Reserve ``num_sequences`` slots at once (all or nothing), or raise ``QueueFullError``."""
        check_admits(self.num_inflight, num_sequences, self._limit, self._node, self._client_index)
        self._reserved += num_sequences
        self.publish()
        return ClientAdmission(self._unreserve, num_sequences)

    def _unreserve(self, n: int) -> None:
        self._reserved -= n
        self.changed()

    def changed(self) -> None:
        """A request was registered or released, or a reservation given back."""
        self.publish()
        if not self.num_inflight:
            self._idle.set()

    def publish(self) -> None:
        if self._node is not None:
            self._node.set_inflight(self._client_index, self.num_inflight)

    async def wait_idle(self) -> None:
        while self.num_inflight:
            if self._idle.is_set():
                self._idle = anyio.Event()
            await self._idle.wait()
