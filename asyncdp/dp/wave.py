"""The coordinator's wave state machine and engine-loss rules (spec §6.4), sans I/O.

Theory of operation. :class:`WaveMachine` owns ``current_wave`` and ``running``: everything that changes them
lives here. The coordinator decodes a message into an event, calls :meth:`WaveMachine.handle`, and performs the
returned actions in order:

* :class:`BroadcastStartWave` - send ``StartWave{wave, exclude_rank}`` to every live engine;
* :class:`PublishWave` - send ``StatsSnapshot{counts=None, wave, running}`` to every client at once;
* :class:`Teardown` - MoE only: send ``Teardown{reason, dead_rank}`` to the other engines, then end with an
  error (or normally, when ``orderly``: a ``Goodbye``);
* :class:`MarkDead` - dense only: stop treating the rank as live, keep serving;
* :class:`LogProtocolError` - log once (a ``WaveComplete`` from a rank other than 0).

Invariants: wave numbers only increase; after a teardown the machine is terminal and ignores every event.
Wave events are ignored in dense mode (there are no waves).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ---------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class FirstRequest:
    exclude_rank: int
    wave: int


@dataclass(frozen=True, slots=True)
class WaveComplete:
    wave: int
    dp_rank: int = 0


@dataclass(frozen=True, slots=True)
class StartWaveRequest:
    dp_rank: int
    wave: int


@dataclass(frozen=True, slots=True)
class EngineLost:
    """An engine link ended: EOF, error or heartbeat timeout; ``orderly`` for a ``Goodbye``."""

    dp_rank: int
    reason: str
    orderly: bool = False


Event = FirstRequest | WaveComplete | StartWaveRequest | EngineLost


# ---------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class BroadcastStartWave:
    wave: int
    exclude_rank: int | None


@dataclass(frozen=True, slots=True)
class PublishWave:
    wave: int
    running: bool


@dataclass(frozen=True, slots=True)
class Teardown:
    reason: str
    dead_rank: int | None
    orderly: bool = False


@dataclass(frozen=True, slots=True)
class MarkDead:
    dp_rank: int
    reason: str
    orderly: bool = False  # it said Goodbye: its node stopped it in order, nothing was lost


@dataclass(frozen=True, slots=True)
class LogProtocolError:
    message: str


Action = BroadcastStartWave | PublishWave | Teardown | MarkDead | LogProtocolError


@dataclass(slots=True)
class WaveMachine:
    dp_size: int
    wave_mode: bool  # MoE: waves and teardown on engine loss
    current_wave: int = 0
    running: bool = False
    torn_down: bool = False
    dead: set[int] = field(default_factory=set)
    _warned: set[int] = field(default_factory=set)

    def handle(self, event: Event) -> list[Action]:
        if self.torn_down:
            return []
        if isinstance(event, EngineLost):
            return self._engine_lost(event)
        if not self.wave_mode:
            return []
        if isinstance(event, FirstRequest):
            return self._first_request(event)
        if isinstance(event, WaveComplete):
            return self._wave_complete(event)
        return self._start_wave_request(event)

    def _publish(self) -> PublishWave:
        return PublishWave(self.current_wave, self.running)

    def _first_request(self, ev: FirstRequest) -> list[Action]:
        if self.running:
            return []
        self.running = True
        # A stale client (its wave already completed) may have sent its request to an idle rank: wake everyone.
        exclude = None if ev.wave < self.current_wave else ev.exclude_rank
        return [BroadcastStartWave(self.current_wave, exclude), self._publish()]

    def _wave_complete(self, ev: WaveComplete) -> list[Action]:
        if ev.dp_rank != 0:
            if ev.dp_rank in self._warned:
                return []
            self._warned.add(ev.dp_rank)
            return [LogProtocolError(f"WaveComplete from rank {ev.dp_rank}; only rank 0 reports wave completion")]
        if ev.wave < self.current_wave:
            return []
        self.current_wave = ev.wave + 1
        self.running = False
        return [self._publish()]

    def _start_wave_request(self, ev: StartWaveRequest) -> list[Action]:
        if ev.wave > self.current_wave or (ev.wave == self.current_wave and not self.running):
            self.current_wave = ev.wave
            self.running = True
            return [BroadcastStartWave(ev.wave, ev.dp_rank), self._publish()]
        return []

    def _engine_lost(self, ev: EngineLost) -> list[Action]:
        if ev.dp_rank in self.dead:
            return []
        self.dead.add(ev.dp_rank)
        if self.wave_mode:
            self.torn_down = True
            reason = f"rank {ev.dp_rank} shut down" if ev.orderly else ev.reason
            return [Teardown(reason, ev.dp_rank, ev.orderly)]
        return [MarkDead(ev.dp_rank, ev.reason, ev.orderly)]

    def revive(self, dp_rank: int) -> bool:
        """Dense: a dead rank's engine subscribed again (its node was restarted, spec §13); False, changing
        nothing, for a live rank and in wave mode (a MoE group takes no member back: it was torn down)."""
        if self.wave_mode or self.torn_down or dp_rank not in self.dead:
            return False
        self.dead.discard(dp_rank)
        return True

    @property
    def all_dead(self) -> bool:
        return len(self.dead) >= self.dp_size
