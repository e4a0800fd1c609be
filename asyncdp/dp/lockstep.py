"""The MoE rank's lockstep state (spec §8.2-8.4, §8.6), sans I/O and sans collectives.

Theory of operation. :class:`Lockstep` holds what a MoE rank with dp > 1 needs to step in lockstep with its peers:
the per-wave step counter, the current wave, whether the group is running, and the two-phase pause state. The
rank loop performs every collective itself and feeds the sums in; this object only decides. One iteration::

    block = not ls.should_step(has_local_work)           # wait for input only when the group is idle
    executed = step_if_work()
    local_unfinished = scheduler.has_unfinished()         # follows the pause state (§8.6)
    if not executed:
        if not ls.must_join(local_unfinished):
            continue                                     # group idle: no collective
        run_dummy_batch()
    if ls.advance():                                     # a sync step (see the cadence below)
        s_unf, s_pause = all_reduce_sum(ls.sync_flags(local_unfinished))
        ls.apply_sync(s_unf, s_pause, dp_size)
    done = ls.end_step()                                 # WaveCompleted when the group went idle
    if done and done.report: send WaveComplete{wave=done.wave}

The sync cadence (which steps all-reduce). A rank with nothing to do must keep running dummy forwards until a sync
tells it the whole group is idle, so every step between "the last real work ended" and "the next sync" is wasted
on every rank. The ``asyncdp`` cadence is adaptive:

* step 1 of every wave syncs (a short burst on one rank pauses the group right after it);
* after a sync whose ``sum_unfinished < dp_size`` (some ranks are idle and already burning dummy forwards) or
  that saw a partial pause, EVERY step syncs ("dense" mode) until the group pauses or a sync sees every rank
  busy again, so the group pauses on the very step its last real work ends;
* while the last sync saw every rank busy, only every ``sync_interval``-th step syncs: no rank runs dummy
  forwards then, so sparse syncs only save collectives.

The one idle transition it cannot see at once is every rank finishing between two sparse syncs; then the group
runs dummy forwards up to the next multiple of ``sync_interval``. The ``vllm`` cadence (every ``sync_interval``
steps, never step 1, never dense) is kept for the benchmark.

Invariants: ``step_counter`` advances once per forward on every rank, and :meth:`needs_sync` depends only on it
and on ``dense``, which is a function of the previous all-reduce's sums, identical on every rank (spec §8.3: the
sync schedule may depend only on values all ranks share). So every rank hits the same sync steps and the k-th
all-reduce of every rank is the same collective. ``current_wave`` never decreases. Between pause consensus and
resume, ``StartWave`` is ignored and a stale-wave request does not restart the group.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from asyncdp.dp.wave import StartWaveRequest
from asyncdp.errors import PauseError

DEFAULT_SYNC_INTERVAL = 32
CADENCES = ("asyncdp", "vllm")


class PauseState(enum.Enum):
    UNPAUSED = "unpaused"
    PAUSED_NEW = "paused-new"  # modes abort and wait: new requests are queued
    PAUSED_ALL = "paused-all"  # mode keep: nothing steps


PAUSE_MODES = {"abort": PauseState.PAUSED_NEW, "wait": PauseState.PAUSED_NEW, "keep": PauseState.PAUSED_ALL}


@dataclass(frozen=True, slots=True)
class WaveCompleted:
    wave: int
    report: bool  # this rank sends WaveComplete (rank 0, or every rank without a coordinator)


def needs_sync(step_counter: int, sync_interval: int = DEFAULT_SYNC_INTERVAL, cadence: str = "asyncdp", *,
               dense: bool = False) -> bool:
    """Whether step ``step_counter`` (1-based within the wave) all-reduces the unfinished flags.

    ``asyncdp``: the first step of every wave, every step while ``dense`` (the last sync saw an idle rank or a
    partial pause), else every ``sync_interval`` steps. ``vllm``: only every ``sync_interval`` steps (vLLM's
    cadence, kept for the benchmark; ``dense`` is ignored).
    """
    if cadence == "vllm":
        return step_counter % sync_interval == 0
    return dense or step_counter == 1 or step_counter % sync_interval == 0


class Lockstep:
    def __init__(self, dp_rank: int, dp_size: int, sync_interval: int = DEFAULT_SYNC_INTERVAL, *,
                 cadence: str = "asyncdp", has_coordinator: bool = True) -> None:
        if sync_interval < 1:
            raise ValueError(f"sync_interval must be >= 1 (got {sync_interval})")
        if cadence not in CADENCES:
            raise ValueError(f"cadence must be one of {CADENCES} (got {cadence!r})")
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.sync_interval = sync_interval
        self.cadence = cadence
        self.has_coordinator = has_coordinator
        self.step_counter = 0
        self.current_wave = 0
        self.engines_running = False
        self.pending_pause = False
        self.pause_state = PauseState.UNPAUSED
        self.ignore_start_wave = False
        self.dense = False  # the last sync saw an idle rank or a partial pause: sync every step (asyncdp cadence)
        self.num_syncs = 0  # all-reduces run by this object's loop (all waves), for stats and benchmarks

    # ------------------------------------------------------------ wave messages (§8.4)

    def on_start_wave(self, wave: int, exclude_rank: int | None) -> bool:
        """Apply ``StartWave``; returns True when it woke this rank."""
        if self.ignore_start_wave:
            return False  # paused: never restart on stale wake-ups
        if exclude_rank != self.dp_rank and wave >= self.current_wave:
            self.current_wave = wave
            woke = not self.engines_running
            self.engines_running = True
            return woke
        return False

    def on_add_request(self, wave: int, scheduler_unpaused: bool | None = None) -> StartWaveRequest | None:
        """Apply the wave stamp of an ``AddRequest``; returns a ``StartWaveRequest`` to send for a stale client."""
        unpaused = self.pause_state is PauseState.UNPAUSED if scheduler_unpaused is None else scheduler_unpaused
        if wave > self.current_wave:
            self.current_wave = wave
        elif wave < self.current_wave and not self.engines_running and unpaused and not self.ignore_start_wave:
            self.engines_running = True  # the client's wave already completed: restart the group
            return StartWaveRequest(self.dp_rank, self.current_wave)
        return None

    # ------------------------------------------------------------ the loop (§8.3)

    def should_step(self, has_local_work: bool) -> bool:
        """False: block on input (the group is idle and this rank has nothing)."""
        return has_local_work or self.engines_running

    def must_join(self, local_unfinished: bool) -> bool:
        """After a step that executed nothing: whether to run a dummy batch and join the collectives."""
        return local_unfinished or self.engines_running

    def needs_sync(self, step_counter: int) -> bool:
        return needs_sync(step_counter, self.sync_interval, self.cadence, dense=self.dense)

    def advance(self) -> bool:
        """Count one forward (real or dummy); True when this step must all-reduce (then call apply_sync)."""
        self.step_counter += 1
        if self.needs_sync(self.step_counter):
            return True
        self.engines_running = True
        return False

    def sync_flags(self, local_unfinished: bool) -> list[int]:
        """The int vector this rank contributes to the sum all-reduce."""
        return [int(local_unfinished), int(self.pending_pause)]

    def apply_sync(self, sum_unfinished: int, sum_pending_pause: int, dp_size: int | None = None) -> bool:
        """Apply the all-reduced sums; returns (and stores) ``engines_running``."""
        n = self.dp_size if dp_size is None else dp_size
        self.num_syncs += 1
        partial_pause = sum_pending_pause % n != 0
        if sum_pending_pause == n:  # pause consensus
            self.pending_pause = False
            self.ignore_start_wave = True
        self.engines_running = sum_unfinished > 0 or partial_pause  # a partial pause keeps the group running
        # Both sums are the same on every rank, so every rank switches cadence on the same step (§8.3).
        self.dense = sum_unfinished < n or partial_pause
        return self.engines_running

    def global_unfinished(self, local_unfinished: bool,
                          all_reduce_sum: Callable[[list[int]], Sequence[int]]) -> bool:
        """``advance`` + the collective (performed by the given function) + ``apply_sync``."""
        if not self.advance():
            return True
        s_unf, s_pause = all_reduce_sum(self.sync_flags(local_unfinished))
        return self.apply_sync(s_unf, s_pause)

    def end_step(self) -> WaveCompleted | None:
        """After the sync decision: close the wave when the group went idle."""
        if self.engines_running:
            return None
        done = WaveCompleted(self.current_wave, self.dp_rank == 0 or not self.has_coordinator)
        self.current_wave += 1
        self.step_counter = 0
        self.dense = False
        return done

    # ------------------------------------------------------------ two-phase pause (§8.6)

    @property
    def paused(self) -> bool:
        return self.pause_state is not PauseState.UNPAUSED

    @property
    def pause_in_progress(self) -> bool:
        """Pause asked but the group has not stopped yet (no consensus, or consensus but still stepping)."""
        return self.pending_pause or (self.ignore_start_wave and self.engines_running)

    def begin_pause(self, mode: str) -> StartWaveRequest | None:
        """Phase 1: pause the scheduler and reach the next sync. Returns a ``StartWaveRequest`` to send when the
        group is idle, so that the peers wake and join the sync that finds consensus."""
        if mode not in PAUSE_MODES:
            raise PauseError(f"pause mode must be one of {', '.join(PAUSE_MODES)} (got {mode!r})")
        self.pause_state = PAUSE_MODES[mode]
        if self.ignore_start_wave:
            return None  # already paused with consensus: only the mode changes
        self.pending_pause = True
        if self.engines_running:
            return None
        self.engines_running = True
        return StartWaveRequest(self.dp_rank, self.current_wave)

    def pause_complete(self, has_steppable_work: bool) -> bool:
        """Phase 2 done: consensus reached and nothing left to step on this rank."""
        return self.paused and self.ignore_start_wave and not self.engines_running and not has_steppable_work

    def resume(self) -> bool:
        """Unpause. Raises PauseError while a pause is in progress; returns False (no-op) when not paused, True
        when the caller must now run the resume barrier and call :meth:`apply_resume_barrier`."""
        if self.pause_in_progress:
            raise PauseError("resume called while a pause is still in progress")
        if not self.paused:
            return False
        self.pause_state = PauseState.UNPAUSED
        self.ignore_start_wave = False
        return True

    def apply_resume_barrier(self, max_unfinished: int) -> bool:
        """The MAX all-reduce of ``local_unfinished`` after resume decides whether the group runs."""
        self.engines_running = max_unfinished > 0
        return self.engines_running
