"""Simulated-rank pieces of the harness: named random streams and the sim executor with an injectable fault.

Determinism (routing-bench spec §1.2): each random stream is its own ``random.Random`` seeded with a 64-bit
BLAKE2b of ``"{seed}/{stream}"``; modelled step times are rounded to whole microseconds before the rank sleeps
them on the anyio clock.
"""

from __future__ import annotations

import random
from hashlib import blake2b

from asyncdp.engine.executor import ModelBatch, StepResult
from asyncdp.engine.sim_executor import SimExecutor


def stream_rng(seed: int, stream: str) -> random.Random:
    """The named random stream of spec §1.2: ``random.Random`` seeded with BLAKE2b-64 of ``"{seed}/{stream}"``."""
    digest = blake2b(f"{seed}/{stream}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


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
