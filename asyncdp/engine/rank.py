"""The engine rank role: one DP rank's busy loop and its links (the process around it: ``rank_process``).

Theory of operation
-------------------
A rank owns one :class:`~asyncdp.engine.core.EngineCore`. It receives ``AddRequest``, ``AbortRequests`` and
``UtilityCall`` from every client link and ``StartWave``/``Teardown``/``Heartbeat`` from the coordinator link.
Reader tasks (:mod:`asyncdp.engine.rank_links`) decode frames and post them into one bounded *inbox* stream of
typed items, dispatched with ``match`` by :mod:`asyncdp.engine.rank_intake`, which also decides whether a new
request is admitted (an unknown item is a :class:`~asyncdp.errors.ProtocolError`; a grammar compiles beside the
steps, in a task of the rank's: :mod:`asyncdp.engine.rank_grammar`); the busy
loop is the only task that touches the core. Each step runs ``EngineCore.step()`` on the device's execution
thread (one ``CapacityLimiter(1)``, shared with the DP group's collectives) and the outputs go only to the
client that owns the request (``AddRequest.client_index``), never waiting for it (a client whose outbox is full
is cut off). An executor that only models its step time (``Executor.modelled_step_s`` is not None: the sim
executor) steps inline and the rank sleeps that time on the anyio clock, so whole clusters run in trio's
virtual time. Utility calls and pause/resume are :mod:`asyncdp.engine.rank_utility`'s; what the rank reports
(outputs, stats) is :mod:`asyncdp.engine.rank_state`'s.

Dense ranks (and MoE with dp = 1) run the plain loop below: no collectives, no waves. MoE ranks with dp > 1
run the lockstep loop of :mod:`asyncdp.engine.lockstep_loop`, which uses this class's helpers.

Stats: with a coordinator, ``RankStats`` before and after every step if the load changed (spec §8.1).

Pause (spec §8.6): ``pause(mode)`` answers only once the pause is complete (dense: the rank is idle; MoE: the
group reached consensus and stopped), ``resume()`` unpauses, ``is_paused()``.

Shutdown (spec §8.7): ``request_shutdown()`` stops intake; with ``shutdown_timeout_s == 0`` every request is
aborted at once, otherwise the rank drains until the deadline and then aborts the rest; the loop then returns
(a MoE rank first waits until the group is idle, or until ``LEAVE_WAIT_S`` past its drain deadline, leaves at a
sync every rank shares, waking an idle group for it, and sends ``Goodbye``: :mod:`asyncdp.engine.lockstep_loop`).

Teardown and fatal errors (spec §8.8, §13): ``Teardown`` from the coordinator, or the loss of the coordinator
in MoE mode, is acted on by the link reader at once, even while the loop is blocked in a collective or on the
execution thread: the DP group is aborted and :meth:`EngineRank.run` raises :class:`RankTornDown` (a rank
that was shutting down ends normally instead). An orderly ``Teardown`` (a peer left while the coordinator's node
stops) is this rank's own stop only where the head's stop stops its node (``stops_with_head``) or its node stops
(``expect_stop``). Any failure sends ``EngineDead`` to every client and the coordinator, flushed for up to 5 s.
The thread is never awaited once cancelled (``abandon_on_cancel``); the worker process hard-exits.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import anyio.lowlevel

from asyncdp import messages as m
from asyncdp.config.flags import EngineConfig
from asyncdp.dp.lockstep import LEAVE_WAIT_S
from asyncdp.engine.lockstep_loop import LockstepLoop
from asyncdp.engine.rank_intake import RankIntake
from asyncdp.engine.rank_links import OUTBOX_SIZE, WAKE, InboxItem, RankLinks, describe_error, main_error
from asyncdp.engine.rank_state import RankReports, RankState
from asyncdp.engine.rank_utility import UtilityCalls
from asyncdp.errors import RankTornDown
from asyncdp.transport import Link

if TYPE_CHECKING:
    from asyncdp.engine.core import EngineCore
    from asyncdp.engine.dp_group import DPGroup

log = logging.getLogger(__name__)

INBOX_SIZE = 4096


@dataclass(frozen=True, slots=True)
class RankConfig:
    dp_rank: int
    dp_size: int
    engine: EngineConfig
    is_moe: bool = False
    external_lb: bool = False
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    shutdown_timeout_s: float = 0.0
    sync_interval: int = 32
    prefill_schedule_interval: int = 1
    sync_cadence: str = "asyncdp"  # "asyncdp" (also the first step of each wave) | "vllm" (benchmark only)
    enable_expert_parallel: bool = False  # MoE with dp > 1: experts split across ranks (all-to-all)
    client_outbox_size: int = OUTBOX_SIZE  # messages queued per client before its link is cut (rank_links)
    # The head's stop stops this rank's node too (its own node, a headless node): an orderly Teardown is this rank's
    # own stop, late. False on a node of its own launch (external-LB rank server, hybrid node): a peer's departure.
    stops_with_head: bool = True
    link_secret: bytes | None = field(default=None, repr=False)  # the deployment secret its links prove (None: none)


class EngineRank:
    """The steady-state part of a rank: links are already connected and the core is built."""

    def __init__(
        self,
        cfg: RankConfig,
        core: EngineCore,
        clients: dict[int, Link],
        coordinator: Link | None,
        *,
        inline_step: bool | None = None,
        dp_group: DPGroup | None = None,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        self.cfg = cfg
        self.core = core
        self.links = RankLinks(cfg.dp_rank, clients, coordinator, outbox_size=cfg.client_outbox_size)
        # None: inline exactly when the executor only models its step time (``modelled_step_s``: the rank waits that
        # long on the anyio clock) and no DP group shares the thread (a thread hop was 1/3 of a zero-cost request).
        if inline_step is None:
            inline_step = core.executor.modelled_step_s is not None and dp_group is None
        self.inline_step = inline_step
        self.dp_group = dp_group
        self.limiter = limiter if limiter is not None else anyio.CapacityLimiter(1)
        self.state = RankState()
        self.lockstep: LockstepLoop | None = None
        if cfg.is_moe and cfg.dp_size > 1:
            if dp_group is None:
                log.warning("rank %d: MoE with dp_size %d but no DP group; running without lockstep",
                            cfg.dp_rank, cfg.dp_size)
            else:
                self.lockstep = LockstepLoop(self, dp_group)
        self.utility = UtilityCalls(self)
        self.intake = RankIntake(self)
        self.reports = RankReports(cfg.dp_rank, core, self.state, self.links,
                                   None if self.lockstep is None else self.lockstep.state)
        self._inbox_send, self._inbox = anyio.create_memory_object_stream[InboxItem](INBOX_SIZE)
        self._shutdown_deadline: float | None = None
        self.leave_at = math.inf  # MoE: from then on a stopping rank leaves a group that still steps
        self._cancel_run: anyio.CancelScope | None = None
        self._loop_done = False
        self._stop_expected = False  # expect_stop
        self._held: list[m.RequestOutput] = []  # a MoE wave's first step's outputs, until its sync (step(hold=))

    # ------------------------------------------------------------------ public

    @property
    def coordinator(self) -> Link | None:
        return self.links.coordinator

    def request_shutdown(self) -> None:
        """Stop intake and start draining (idempotent). Safe to call from any task."""
        if self.state.shutting_down:
            return
        self.state.shutting_down = True
        self._shutdown_deadline = anyio.current_time() + self.cfg.shutdown_timeout_s
        self.leave_at = self._shutdown_deadline + LEAVE_WAIT_S
        for client in self.links.clients:  # so that they send new requests to the other ranks meanwhile
            self.links.post_nowait(client, m.RankDraining(dp_rank=self.cfg.dp_rank))
        self._wake()

    def ready_to_leave(self) -> bool:
        """MoE: stopping, drained, and ``LEAVE_WAIT_S`` past the drain deadline: leave a group that still steps."""
        return self.state.shutting_down and not self.core.has_unfinished() and anyio.current_time() >= self.leave_at

    def abandon_all(self, reason: str) -> None:
        """End every request now, without a step (an ended MoE group), naming ``reason``: one whose client has seen
        nothing of it yet (queued, or its outputs held for the sync that ended the group) is refused
        (``unavailable``), as it would have been a moment later; every other is aborted as ``abandoned``."""
        self.state.abandon_reason = reason
        held, self._held = self._held, []
        unseen = self.state.unanswered
        self.reports.dispatch_outputs([out for out in held if out.finished or out.request_id not in unseen])
        refused = [rid for rid in self.state.owners if rid in unseen]
        self.core.abort_requests(refused)  # (their aborts go nowhere: no longer owned)
        for rid in refused:
            unseen.discard(rid)
            self.reports.refuse(rid, self.state.owners.pop(rid), reason, "unavailable")
        self.core.abort_requests(list(self.state.owners))
        self.reports.dispatch_outputs(self.core.take_pending().outputs)

    async def run(self) -> None:
        """Run until shut down. Raises on a fatal error (after telling every peer); RankTornDown on teardown."""
        try:
            async with anyio.create_task_group() as tg:
                self._cancel_run = tg.cancel_scope
                self.links.start(tg, self._inbox_send, self, heartbeat_interval_s=self.cfg.heartbeat_interval_s,
                                 heartbeat_timeout_s=self.cfg.heartbeat_timeout_s)
                self.intake.grammars.open(tg, self._inbox_send)  # grammars compile in tasks of the rank's own
                if self.lockstep is not None:
                    await self.lockstep.run()
                else:
                    await self._loop()  # (it ends only in an orderly stop, drained: the coordinator hears so)
                    await self.send_coordinator(m.Goodbye(dp_rank=self.cfg.dp_rank))
                self._loop_done = True
                await self.links.flush()  # orderly end: the last outputs still reach the clients
                tg.cancel_scope.cancel()
        except BaseException as exc:
            leaf = main_error(exc)
            if leaf is None:
                raise  # cancelled from outside: the process is going away
            if self.dp_group is not None:
                self.dp_group.abort()
            # a teardown's own words name the cause ("its MoE group ended (...)"); anything else by its type too
            self.state.dead_reason = str(leaf) if isinstance(leaf, RankTornDown) else describe_error(leaf)
            await self.links.announce_death(self.state.dead_reason)
            if leaf is exc:
                raise
            raise leaf from None
        finally:
            self.close()

    def close(self) -> None:
        """Close the inbox and the outboxes (idempotent; :meth:`run` does it too, this is for a rank that never
        ran: an unclosed memory stream warns when collected)."""
        self.links.close()
        self._inbox_send.close()
        self._inbox.close()

    # ------------------------------------------------------------------ link events

    def expect_stop(self) -> None:  # its node stops in order (Stopping): its engines' turn comes after the API
        self._stop_expected = True  # (a peer's orderly departure meanwhile is this rank's own stop, early)

    def on_teardown(self, reason: str, *, orderly: bool = False) -> None:
        if orderly and (self.cfg.stops_with_head or self._stop_expected):  # this rank's own stop is merely late
            self.request_shutdown()
        self._group_ended(reason, peer_stopped=orderly)

    def on_coordinator_lost(self, reason: str) -> None:
        if self.cfg.is_moe and self.cfg.dp_size > 1:
            self._group_ended(reason)
            return
        if not self.state.shutting_down:
            log.warning("rank %d: %s; serving on without load reports", self.cfg.dp_rank, reason)
        self.links.coordinator = None

    def _group_ended(self, reason: str, *, peer_stopped: bool = False) -> None:
        """The MoE group is gone (teardown, coordinator lost): abort the collectives; end (spec §8.7, §8.8): in
        order when shutting down, else with :class:`RankTornDown` (exit 1, ``EngineDead`` naming ``reason``)."""
        if self.dp_group is not None:
            self.dp_group.abort()
        if self._loop_done:
            return  # already leaving in order (after Goodbye): let the last outputs flush
        if self.state.shutting_down and self._cancel_run is not None:
            log.info("rank %d: %s while shutting down; exiting", self.cfg.dp_rank, reason)
            self._cancel_run.cancel()
            return
        what = "its MoE group ended" if self.lockstep is not None else "torn down"
        raise RankTornDown(f"rank {self.cfg.dp_rank}: {what} ({reason})", peer_stopped=peer_stopped, cause=reason)

    async def send_coordinator(self, msg: m.Message) -> None:
        if not await self.links.send_coordinator(msg):
            self.on_coordinator_lost("the coordinator link broke")

    def _wake(self) -> None:
        try:
            self._inbox_send.send_nowait(WAKE)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    # ------------------------------------------------------------------ the busy loop (dense)

    async def _loop(self) -> None:
        core = self.core
        while True:
            if not core.has_steppable_work():
                if self.state.shutting_down and not core.has_unfinished():
                    return
                await self.wait_input()
            await self.drain_inbox()
            self.apply_shutdown_policy()
            await self.publish_stats(clients=not core.has_steppable_work())  # (else the step's outputs carry them)
            if core.has_steppable_work():
                await self.step()
                await self.publish_stats()
            self.complete_pauses()

    async def wait_input(self) -> None:
        """Block for one inbox item (until the drain deadline while shutting down with frozen requests)."""
        deadline = math.inf
        if self.state.shutting_down and self._shutdown_deadline is not None and not self.state.drain_expired:
            deadline = self._shutdown_deadline
        item = None
        try:  # one already there: taken without the receive's scheduling point (the turn's step, or the next
            item = self._inbox.receive_nowait()  # wait, has one)
        except anyio.WouldBlock:
            if deadline == math.inf:  # the common case: no scope to build and tear down per wait
                item = await self._inbox.receive()
            else:
                with anyio.CancelScope(deadline=deadline):
                    item = await self._inbox.receive()
        if item is not None:
            await self._handle(item)

    async def drain_inbox(self) -> None:
        while True:
            try:
                item = self._inbox.receive_nowait()
            except anyio.WouldBlock:
                return
            await self._handle(item)

    def apply_shutdown_policy(self) -> None:
        if not self.state.shutting_down or self.state.drain_expired or self._shutdown_deadline is None:
            return
        if anyio.current_time() >= self._shutdown_deadline:
            self.state.drain_expired = True
            self.state.abandon_reason = self.state.abandon_reason or (
                f"engine rank {self.cfg.dp_rank} stopped before the request finished (its drain deadline, "
                "--shutdown-timeout, passed)")
            if self.core.has_unfinished():
                self.core.abort_requests(list(self.state.owners))

    async def step(self, *, throttle_new_prefills: bool = False, hold: bool = False) -> bool:
        """One ``EngineCore.step()``; dispatches its outputs, or with ``hold`` keeps them for :meth:`release_held`
        (a MoE wave's first step: its sync may end the group); True when a real forward ran."""
        core = self.core
        fn = functools.partial(core.step, throttle_new_prefills=throttle_new_prefills)
        if self.inline_step:
            result = fn()
            if result.executed:
                await anyio.sleep(self._modelled_step_s())
            else:
                await anyio.lowlevel.checkpoint()  # never a loop without a scheduling point
        else:
            result = await anyio.to_thread.run_sync(fn, limiter=self.limiter, abandon_on_cancel=True)
        if result.executed:
            self.state.steps += 1
        if hold:
            self._held.extend(result.outputs)
        else:
            self.reports.dispatch_outputs(result.outputs)
        return result.executed

    def release_held(self) -> None:
        """Dispatch the outputs :meth:`step` held (the sync after them did not end the group)."""
        if self._held:
            held, self._held = self._held, []
            self.reports.dispatch_outputs(held)

    def _modelled_step_s(self) -> float:
        modelled = self.core.executor.modelled_step_s
        return 0.0 if modelled is None else modelled

    async def run_dummy(self) -> None:
        """A dummy batch (one padding token, no request state) to keep the collectives in lockstep."""
        core = self.core
        if self.inline_step:
            core.execute_dummy()
            await anyio.sleep(self._modelled_step_s())
        else:
            await anyio.to_thread.run_sync(core.execute_dummy, limiter=self.limiter, abandon_on_cancel=True)
        self.state.dummy_steps += 1

    def send_stats_to_client(self) -> None:
        """``scheduler_stats`` alone, to the first client whose link is not cut (see :mod:`.rank_state`)."""
        self.reports.send_stats_to_client()

    # ------------------------------------------------------------------ message handling

    async def _handle(self, item: InboxItem) -> None:
        await self.intake.handle(item)

    def pause_done(self) -> bool:
        return self.utility.pause_done()

    def complete_pauses(self) -> None:
        """Answer the pending pause calls once the pause is complete (spec §8.6 step 3)."""
        self.utility.complete_pauses()

    # ------------------------------------------------------------------ stats

    def scheduler_stats(self) -> m.SchedulerStats:
        return self.reports.scheduler_stats()

    async def publish_stats(self, *, clients: bool = True) -> None:
        """``RankStats`` to the coordinator when the load changed (spec §8.1; see :mod:`.rank_state`), and, with
        ``clients``, the scheduler stats to the clients when no output carried their change. A loop turn about to
        step passes ``clients=False`` before the step: its outputs carry the stats, and the call after the step
        sends them alone only if it had none (a prompt still prefilling); a frame per turn cost about 5 % of the
        server's CPU per request on a zero-cost model."""
        to_coordinator = self.coordinator is not None and not self.cfg.external_lb
        if not clients and not to_coordinator:
            return  # nobody to tell: not even the stats are read
        s = self.reports.scheduler_stats()
        if clients:
            self.reports.refresh_client_stats(s)
        if not to_coordinator:
            return
        report = self.reports.load_report(s)
        if report is not None:
            await self.send_coordinator(report)

