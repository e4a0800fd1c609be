"""Simulated-rank pieces of the harness: named random streams, the sim executor with an injectable fault, and the
plain records :mod:`asyncdp.testing.cluster` takes and gives (``SimRequest``, ``SimCoordinator``).

Determinism (routing-bench spec §1.2): each random stream is its own ``random.Random`` seeded with a 64-bit
BLAKE2b of ``"{seed}/{stream}"``; modelled step times are rounded to whole microseconds before the rank sleeps
them on the anyio clock; timers due at the same virtual instant wake in the order they were armed
(:func:`timer_ties_in_arming_order`).
"""

from __future__ import annotations

import functools
import heapq
import importlib
import itertools
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

import anyio

from asyncdp.coordinator.core import CoordinatorConfig
from asyncdp.engine.executor import ModelBatch, StepResult
from asyncdp.engine.sim_executor import SimExecutor
from asyncdp.sampling_params import SamplingParams
from asyncdp.testing.links import MemoryLinkListener


def stream_rng(seed: int, stream: str) -> random.Random:
    """The named random stream of spec §1.2: ``random.Random`` seeded with BLAKE2b-64 of ``"{seed}/{stream}"``."""
    digest = blake2b(f"{seed}/{stream}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


@contextmanager
def timer_ties_in_arming_order() -> Iterator[None]:
    """Meanwhile, trio wakes timers due at the same instant in the order their deadlines were set, not by the
    ``id()`` of their cancel scopes (its deadline heap's tie-break: a memory address). Under ``MockClock`` ranks
    whose steps end together, or a period that falls on a step end, are such ties, so without it a virtual-time
    run's result moved with the heap's layout: with what ran before it in the interpreter, with the machine, with
    unrelated code. Only ``Deadlines.add`` is replaced, with a counter of this context's own; the heap's entries
    keep their shape ``(deadline, tiebreak, scope)``. Enter it before ``trio.run``. A trio whose heap has another
    shape is refused with a ``RuntimeError`` that says so, rather than failing inside ``trio.run``."""
    deadlines: Any = importlib.import_module("trio._core._run").Deadlines  # private: no stubs to check against
    probe = deadlines()
    if not (isinstance(getattr(probe, "_heap", None), list) and isinstance(getattr(probe, "_active", None), int)):
        raise RuntimeError(f"trio {importlib.import_module('trio').__version__} keeps its timers differently from "
                           "trio 0.25-0.35 (no Deadlines._heap list and _active count): the simulator cannot order "
                           "same-instant timers deterministically with it; install trio<=0.35")
    original = deadlines.add
    order = itertools.count()

    @functools.wraps(original)  # add.__wrapped__: trio's own, for a test that needs it
    def add(self: Any, deadline: float, cancel_scope: Any) -> None:
        heapq.heappush(self._heap, (deadline, next(order), cancel_scope))
        self._active += 1

    deadlines.add = add
    try:
        yield
    finally:
        deadlines.add = original


class InjectedFault(RuntimeError):
    """The failure :meth:`SimCluster.crash_rank` makes a rank's executor raise."""


class SimRankExecutor(SimExecutor):
    """The simulated executor with step times rounded to whole microseconds and an injectable failure."""

    fail_reason: str | None = None

    def execute(self, batch: ModelBatch) -> StepResult:
        if self.fail_reason is not None:
            raise InjectedFault(self.fail_reason)
        result = super().execute(batch)
        self.last_step_s = round(self.last_step_s * 1e6) / 1e6
        return result

    def execute_dummy(self) -> None:
        if self.fail_reason is not None:
            raise InjectedFault(self.fail_reason)
        super().execute_dummy()
        self.last_step_s = round(self.last_step_s * 1e6) / 1e6


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request for :meth:`SimCluster.complete_all`: sent by ``client_index`` after ``delay_s``."""

    client_index: int
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str | None = None
    delay_s: float = 0.0


@dataclass(slots=True)
class SimCoordinator:
    """The coordinator as the harness runs it: its config, listeners, and how it ended."""

    config: CoordinatorConfig
    engine_listener: MemoryLinkListener
    client_listener: MemoryLinkListener
    done: anyio.Event
    error: BaseException | None = None
