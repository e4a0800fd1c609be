"""The node table: what every API-server process of one node publishes to its siblings, in shared memory.

Theory of operation
-------------------
With ``--api-server-count N > 1`` the launcher creates one anonymous shared-memory file (``os.memfd_create``)
of N fixed-size slots and every API child inherits its descriptor, like the HTTP socket. Process ``i`` writes
only slot ``i``: its pid, its admission count (requests in flight plus reserved slots) and a heartbeat
(``CLOCK_MONOTONIC`` in ms, one clock for every process of the machine), refreshed by a task every
``HEARTBEAT_INTERVAL_S``. Every process reads all slots:

* **admission** (issue #12, item 15): ``--max-queued-requests K`` is a node-wide pool of ``K x N`` slots, so a
  burst that the kernel hands to one process can use its siblings' free slots (:func:`node_admits`);
* **health** (item 16): a sibling whose heartbeat is older than ``STUCK_AFTER_S`` has a blocked event loop (or
  was stopped); every process's ``/health`` then answers 503 until the heartbeat resumes
  (:func:`stuck_siblings`).

A slot whose pid is 0 is unused (the process has not started, or the launcher cleared it when the process
exited). Fields are aligned 8-byte words written one at a time: a reader may see one field of an older write,
never a torn word. Reading and summing is not atomic with a sibling's admission: concurrent admissions in two
processes can overshoot the pool by at most one request per process, which the engines absorb.

The decisions are the two pure functions; :class:`NodeTable` only maps the memory.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from asyncdp.dp.liveness import expired

HEARTBEAT_INTERVAL_S = 0.5
STUCK_AFTER_S = 5.0

_WORD = struct.Struct("<q")
_FIELDS = ("pid", "inflight", "heartbeat_ms")
SLOT_BYTES = 64  # one cache line per process: no false sharing between writers


@dataclass(frozen=True, slots=True)
class Slot:
    client_index: int
    pid: int
    inflight: int
    heartbeat_ms: int


def node_admits(own_inflight: int, sibling_inflight: int, num_sequences: int, per_process_limit: int,
                num_processes: int) -> bool:
    """Whether ``num_sequences`` more fit in the node's pool of ``per_process_limit x num_processes`` slots."""
    return own_inflight + sibling_inflight + num_sequences <= per_process_limit * num_processes


def stuck_siblings(slots: list[Slot], own_index: int, now_ms: int, stuck_after_s: float = STUCK_AFTER_S) -> list[int]:
    """Client indexes of siblings in use (pid set) whose heartbeat is older than ``stuck_after_s``."""
    now_s = now_ms / 1000
    return [s.client_index for s in slots
            if s.client_index != own_index and s.pid and expired(s.heartbeat_ms / 1000, now_s, stuck_after_s)]


def stuck_problem(stuck: list[int]) -> str:
    """``/health``'s message for siblings :func:`stuck_siblings` found."""
    return (f"API server {', '.join(map(str, stuck))} of this node is not responding (no heartbeat for over "
            f"{STUCK_AFTER_S:g} s: its event loop is blocked or its process stopped), and the kernel still hands it "
            "connections.")


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class NodeTable:
    """The node table mapped from a shared-memory descriptor."""

    def __init__(self, fd: int, num_processes: int) -> None:
        self.num_processes = num_processes
        self._map = mmap.mmap(fd, num_processes * SLOT_BYTES)

    @classmethod
    def create(cls, num_processes: int) -> tuple[NodeTable, int]:
        """The launcher's side: a fresh zeroed table and its inheritable descriptor."""
        fd = os.memfd_create("asyncdp-node-table", 0)  # no MFD_CLOEXEC: the API children inherit it
        os.ftruncate(fd, num_processes * SLOT_BYTES)
        os.set_inheritable(fd, True)
        return cls(fd, num_processes), fd

    def close(self) -> None:
        self._map.close()

    def _offset(self, index: int, name: str) -> int:
        if not 0 <= index < self.num_processes:
            raise IndexError(f"client_index {index} outside the node table of {self.num_processes}")
        return index * SLOT_BYTES + _FIELDS.index(name) * _WORD.size

    def _write(self, index: int, name: str, value: int) -> None:
        _WORD.pack_into(self._map, self._offset(index, name), value)

    def _read(self, index: int, name: str) -> int:
        return int(_WORD.unpack_from(self._map, self._offset(index, name))[0])

    def register(self, index: int, pid: int) -> None:
        """Claim slot ``index`` for this process (heartbeat first, so the slot is never seen stale)."""
        self._write(index, "heartbeat_ms", monotonic_ms())
        self._write(index, "inflight", 0)
        self._write(index, "pid", pid)

    def clear(self, index: int) -> None:
        """The process of slot ``index`` is gone (called by the launcher)."""
        self._write(index, "pid", 0)
        self._write(index, "inflight", 0)

    def beat(self, index: int) -> None:
        self._write(index, "heartbeat_ms", monotonic_ms())

    def set_inflight(self, index: int, n: int) -> None:
        self._write(index, "inflight", n)

    def slots(self) -> list[Slot]:
        return [Slot(i, self._read(i, "pid"), self._read(i, "inflight"), self._read(i, "heartbeat_ms"))
                for i in range(self.num_processes)]

    def sibling_inflight(self, own_index: int) -> int:
        return sum(s.inflight for s in self.slots() if s.client_index != own_index and s.pid)


async def run_heartbeat(node: NodeTable, client_index: int, publish_inflight: Callable[[], None]) -> None:
    """Task of one API process: claim its slot (pid), publish its admission count, beat every interval."""
    node.register(client_index, os.getpid())
    publish_inflight()
    while True:
        node.beat(client_index)
        await anyio.sleep(HEARTBEAT_INTERVAL_S)
