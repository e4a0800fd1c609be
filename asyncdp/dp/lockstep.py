"""The MoE rank's lockstep state (spec §8.2-8.4, §8.6), sans I/O and sans collectives.

Theory of operation. :class:`Lockstep` holds what a MoE rank with dp > 1 needs to step in lockstep with its peers:
the per-wave step counter, the current wave, whether the group is running, and the two-phase pause state. The
rank loop performs every collective itself and feeds the sums in; this object only decides. One iteration::

    block = not ls.should_step(has_local_work)           # wait for input only when the group is idle
    executed = step_if_work()
    local_unfinished = scheduler.has_unfinished()         # follows the pause state (§8.6)
    local_horizon = forwards_to_drain()                   # 0 when idle; None when unknown
    if not executed:
        if not ls.must_join(local_unfinished):
            continue                                     # group idle: no collective
        run_dummy_batch()
    if ls.advance():                                     # a sync step (see the cadence below)
        ls.apply_sums(all_reduce_sum(ls.sync_flags(local_unfinished, local_horizon, leaving,
                                                   stopping=stopping, step_ms=step_ms)))
        if ls.group_left:                                # a rank left (see "Leaving" below): no more steps
            break
    done = ls.end_step()                                 # WaveCompleted when the group went idle
    if done and done.report: send WaveComplete{wave=done.wave}

The sync cadence (which steps all-reduce). A rank with nothing to do must keep running dummy forwards until a sync
tells it the whole group is idle, so every step between "the last real work ended" and "the next sync" is wasted
on every rank. The ``asyncdp`` cadence is adaptive:

* step 1 of every wave syncs (a short burst on one rank pauses the group right after it);
* after a sync whose ``sum_unfinished < dp_size`` (some ranks are idle and already burning dummy forwards) or
  that saw a partial pause, EVERY step syncs ("dense" mode) until the group pauses or a sync sees every rank
  busy again, so the group pauses on the very step its last real work ends;
* while the last sync saw every rank busy, the next sync comes after ``min(H, sync_interval)`` steps, where ``H``
  is the group's drain horizon: the most forwards any rank still needs for its requests if nothing new arrives and
  none stops early (``max_tokens`` minus the tokens generated). Each rank contributes its horizon to the same
  all-reduce as a row of flags ``[h <= 1, h <= 2, ..., h <= B]`` (``B = min(sync_interval, 64) - 1``); the sums
  say, for each k, how many ranks drain within k steps, so the first k whose count is ``dp_size`` is the group's
  ``H`` (a max, carried by a sum all-reduce). When every rank runs its requests to ``max_tokens`` the group
  therefore syncs on the very step the last one ends, even when all ranks finish together; a request that stops
  early (EOS, a stop string, an abort) only falls back to the ``sync_interval`` bound. An underestimate (queued
  requests, chunked prefills) costs one extra sync, which carries a fresh horizon;
* and never more than ``MAX_SYNC_GAP_S`` of steps apart: each rank also contributes the mean time of its steps
  since its previous sync (``step_ms``, measured by the loop), and the group caps the gap at
  ``MAX_SYNC_GAP_S / (sum / dp_size)`` steps. On a slow or loaded machine (150 ms a step: 32 steps are 4.8 s) the
  group still learns within about half a second that one of its ranks stops, pauses or ran out of work.

The ``vllm`` cadence (every ``sync_interval`` steps, never step 1, never dense, no horizon, no time cap) is kept for
the benchmark; a stopping rank's leave is bounded only by the ``asyncdp`` cadence.

Leaving (spec §8.7). A stopping rank keeps stepping while its peers have work, because a member that is gone
blocks every later collective of the others. Under steady traffic its peers always have work, so the rank cannot
wait for the group to go idle: once it has nothing left and its own bound has passed (the rank decides when, from
its clock: ``leaving``), it raises the last flag of its sync vector. The sync that sums it to more than 0 is the
group's last collective on every rank: all of them see the same sum, so all stop at the same collective
(``group_left``). So that this sync comes right after the bound, a stopping rank raises the ``stopping`` flag of
every sync from its drain deadline on (``LEAVE_WAIT_S`` before the bound; not during the whole drain, which may
last minutes): the group then syncs every step (``dense``) until the leave, and since a sync comes at most
``MAX_SYNC_GAP_S`` of steps after the deadline (at the step time the last sync measured: well within
``LEAVE_WAIT_S`` unless the steps slowed down several-fold since), the leave lands one step after the bound. The leavers then say ``Goodbye``; the others never step again and wait for the coordinator's
``Teardown`` (or their own stop). A rank that stops while the group is idle leaves through a sync too: it wakes
the group (:meth:`Lockstep.wake`, as a rank with new work would) and raises the flag at that wave's first sync.
Leaving without a collective would let a request that reaches a peer meanwhile start a wave whose all-reduce meets
the departed rank (with gloo: "Connection closed by peer", an engine death). Only a group paused by consensus
(§8.6), which ignores ``StartWave``, is left without one.

Invariants: ``step_counter`` advances once per forward on every rank, and :meth:`needs_sync` depends only on it
and on ``dense`` and ``next_sync``, functions of earlier all-reduces' sums, identical on every rank (spec §8.3: the
sync schedule may depend only on values all ranks share). So every rank hits the same sync steps and the k-th
all-reduce of every rank is the same collective. ``current_wave`` never decreases. Between pause consensus and
resume, ``StartWave`` is ignored and a stale-wave request does not restart the group.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from asyncdp.dp.wave import StartWaveRequest
from asyncdp.errors import PauseError

DEFAULT_SYNC_INTERVAL = 32
CADENCES = ("asyncdp", "vllm")
MAX_HORIZON_FLAGS = 63  # the horizon row's length is min(sync_interval - 1, this): one small collective
# [ours] How long past its drain deadline a stopping MoE rank keeps a busy group stepping, so that its peers'
# in-flight requests may still finish, before it leaves at the next sync (see "Leaving" below). It must leave well
# within its launcher's kill deadline (drain + 5 s; 3.5 s under a multi-port supervisor) and, with
# --shutdown-timeout 0, within the 4.1 s its top process has to exit (spec §12.5).
LEAVE_WAIT_S = 2.0
# [ours] The most time a busy group steps between two syncs, at the step time its last sync measured, so that a
# stopping rank's flag reaches its peers (and the group syncs every step) well before its LEAVE_WAIT_S runs out.
MAX_SYNC_GAP_S = 0.5


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
               dense: bool = False, next_sync: int | None = None) -> bool:
    """Whether step ``step_counter`` (1-based within the wave) all-reduces the unfinished flags.

    ``asyncdp``: the first step of every wave, every step while ``dense`` (the last sync saw an idle rank or a
    partial pause), else from step ``next_sync`` on (set by the last sync; without one, every ``sync_interval``
    steps). ``vllm``: only every ``sync_interval`` steps (vLLM's cadence, kept for the benchmark; the keyword
    arguments are ignored).
    """
    if cadence == "vllm":
        return step_counter % sync_interval == 0
    if dense or step_counter == 1:
        return True
    return step_counter >= next_sync if next_sync is not None else step_counter % sync_interval == 0


def horizon_flags(horizon: int | None, num_flags: int) -> list[int]:
    """A rank's drain horizon as the row ``[horizon <= 1, ..., horizon <= num_flags]`` (summed by the group);
    ``None`` (unknown) is all zeros, so the group falls back to ``sync_interval``."""
    if horizon is None:
        return [0] * num_flags
    return [int(horizon <= k) for k in range(1, num_flags + 1)]


def steps_within(gap_s: float, sum_step_ms: int, dp_size: int, default: int) -> int:
    """How many steps fit in ``gap_s`` at the group's mean step time (``sum_step_ms / dp_size``), at least 1;
    ``default`` when no rank measured one yet (0)."""
    if sum_step_ms <= 0:
        return default
    return max(1, int(gap_s * 1000.0 * dp_size // sum_step_ms))


def group_horizon(counts: Sequence[int], dp_size: int, default: int) -> int:
    """The group's drain horizon from the summed rows: the first k that every rank reached, else ``default``."""
    for k, count in enumerate(counts, start=1):
        if count >= dp_size:
            return k
    return default


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
        self.next_sync: int | None = None  # while not dense: the step of the next sync (from the group horizon)
        self.num_horizon_flags = 0 if cadence == "vllm" else min(sync_interval - 1, MAX_HORIZON_FLAGS)
        self.num_syncs = 0  # all-reduces run by this object's loop (all waves), for stats and benchmarks
        self.group_left = False  # a sync saw a rank leave: the group never steps or syncs again
        self.stopping = False  # the last sync saw a stopping rank: every step syncs until it leaves

    # ------------------------------------------------------------ wave messages (§8.4)

    def on_start_wave(self, wave: int, exclude_rank: int | None) -> bool:
        """Apply ``StartWave``; returns True when it woke this rank."""
        if self.ignore_start_wave or self.group_left:
            return False  # paused: never restart on stale wake-ups (and an ended group never restarts)
        if exclude_rank != self.dp_rank and wave >= self.current_wave:
            self.current_wave = wave
            woke = not self.engines_running
            self.engines_running = True
            return woke
        return False

    def on_add_request(self, wave: int, scheduler_unpaused: bool | None = None) -> StartWaveRequest | None:
        """Apply the wave stamp of an ``AddRequest``; returns the ``StartWaveRequest`` to send when the request
        reached an idle group (not running, unpaused, no pause consensus), whatever its stamp.

        A stale stamp (the client's wave already completed) is spec §8.4's restart. A current or newer one is
        [ours]: the client's ``FirstRequest`` is best effort (it is lost while the client's coordinator link is
        down, e.g. reconnecting after the coordinator dropped an API server whose event loop stalled), and without
        a wake-up this rank would wait in its wave's first sync for peers that never come: the request hangs. When
        the ``FirstRequest`` did arrive, the coordinator runs the wave already and ignores this one (§6.4)."""
        unpaused = self.pause_state is PauseState.UNPAUSED if scheduler_unpaused is None else scheduler_unpaused
        if self.group_left:
            return None
        if wave > self.current_wave:
            self.current_wave = wave
        if not self.engines_running and unpaused and not self.ignore_start_wave:
            self.engines_running = True  # wake the group: this rank's first forward syncs with every peer
            return StartWaveRequest(self.dp_rank, self.current_wave)
        return None

    def wake(self) -> StartWaveRequest | None:
        """Start a wave from this idle rank so that the group reaches a sync (a stopping rank leaves at it);
        returns the ``StartWaveRequest`` that wakes the peers. None when the group already runs (its next sync
        comes anyway), has ended, or is paused by consensus (it ignores ``StartWave``: no sync would come)."""
        if self.group_left or self.engines_running or self.ignore_start_wave:
            return None
        self.engines_running = True
        return StartWaveRequest(self.dp_rank, self.current_wave)

    # ------------------------------------------------------------ the loop (§8.3)

    def should_step(self, has_local_work: bool) -> bool:
        """False: block on input (the group is idle and this rank has nothing, or the group has ended)."""
        return not self.group_left and (has_local_work or self.engines_running)

    def first_step_syncs(self) -> bool:
        """The next forward is its wave's first and all-reduces (the ``asyncdp`` cadence): a rank holds its
        outputs until that sync, which may end the group (a rank left), so a request admitted just before the
        group ended has shown nothing to its client and is refused, not abandoned."""
        return self.step_counter == 0 and self.cadence != "vllm"

    def must_join(self, local_unfinished: bool) -> bool:
        """After a step that executed nothing: whether to run a dummy batch and join the collectives."""
        return not self.group_left and (local_unfinished or self.engines_running)

    def needs_sync(self, step_counter: int) -> bool:
        return needs_sync(step_counter, self.sync_interval, self.cadence, dense=self.dense, next_sync=self.next_sync)

    def advance(self) -> bool:
        """Count one forward (real or dummy); True when this step must all-reduce (then call apply_sync)."""
        self.step_counter += 1
        if self.needs_sync(self.step_counter):
            return True
        self.engines_running = True
        return False

    def sync_flags(self, local_unfinished: bool, local_horizon: int | None = None, leaving: bool = False, *,
                   stopping: bool = False, step_ms: int = 0) -> list[int]:
        """The int vector this rank contributes to the sum all-reduce: ``[unfinished, pending_pause]``, with the
        asyncdp cadence the horizon row (``local_horizon``: forwards this rank still needs, an estimate), then
        ``step_ms`` (the mean time of this rank's steps since its last sync, 0 when unknown), the stopping flag
        (``stopping``: this rank is shutting down and will leave) and last the leaving flag (``leaving``: this rank
        leaves the group at this sync)."""
        return [int(local_unfinished), int(self.pending_pause), *horizon_flags(local_horizon, self.num_horizon_flags),
                max(0, int(step_ms)), int(stopping or leaving), int(leaving)]

    def apply_sums(self, sums: Sequence[int]) -> bool:
        """Apply the all-reduced :meth:`sync_flags` vector; returns (and stores) ``engines_running``."""
        k = 2 + self.num_horizon_flags
        if len(sums) != k + 3:
            raise ValueError(f"expected {k + 3} sums (the sync_flags vector), got {len(sums)}")
        return self.apply_sync(sums[0], sums[1], horizon_counts=sums[2:k], sum_step_ms=sums[k],
                               sum_stopping=sums[k + 1], sum_leaving=sums[k + 2])

    def apply_sync(self, sum_unfinished: int, sum_pending_pause: int, dp_size: int | None = None,
                   horizon_counts: Sequence[int] = (), sum_leaving: int = 0, *, sum_stopping: int = 0,
                   sum_step_ms: int = 0) -> bool:
        """Apply the all-reduced sums (``horizon_counts``: the summed horizon rows; empty means unknown;
        ``sum_leaving``: how many ranks leave the group at this sync; ``sum_stopping``: how many are stopping;
        ``sum_step_ms``: the ranks' step times, for the time cap); returns (and stores) ``engines_running``."""
        n = self.dp_size if dp_size is None else dp_size
        self.num_syncs += 1
        if sum_leaving > 0:  # the group's last collective: nobody steps again (see "Leaving" above)
            self.group_left = True
            self.engines_running = False
            return False
        partial_pause = sum_pending_pause % n != 0
        if sum_pending_pause == n:  # pause consensus
            self.pending_pause = False
            self.ignore_start_wave = True
        self.engines_running = sum_unfinished > 0 or partial_pause  # a partial pause keeps the group running
        # Every sum is the same on every rank, so every rank switches cadence on the same step (§8.3).
        self.stopping = sum_stopping > 0
        self.dense = sum_unfinished < n or partial_pause or self.stopping
        horizon = group_horizon(horizon_counts, n, self.sync_interval)
        gap = steps_within(MAX_SYNC_GAP_S, sum_step_ms, n, self.sync_interval)
        self.next_sync = self.step_counter + min(horizon, self.sync_interval, gap)
        return self.engines_running

    def end_step(self) -> WaveCompleted | None:
        """After the sync decision: close the wave when the group went idle."""
        if self.engines_running:
            return None
        done = WaveCompleted(self.current_wave, self.dp_rank == 0 or not self.has_coordinator)
        self.current_wave += 1
        self.step_counter = 0
        self.dense = False  # (a stopping rank raises its flag again at the next wave's first sync)
        self.stopping = False
        self.next_sync = None
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
        self._check_group()
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
        self._check_group()
        if self.pause_in_progress:
            raise PauseError("resume called while a pause is still in progress")
        if not self.paused:
            return False
        self.pause_state = PauseState.UNPAUSED
        self.ignore_start_wave = False
        return True

    def _check_group(self) -> None:
        if self.group_left:
            raise PauseError("the MoE group has ended (a rank left it); it can no longer pause or resume")

    def apply_resume_barrier(self, max_unfinished: int) -> bool:
        """The MAX all-reduce of ``local_unfinished`` after resume decides whether the group runs."""
        self.engines_running = max_unfinished > 0
        return self.engines_running
