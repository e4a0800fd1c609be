"""The coordinator role's configuration (one frozen config per role): its publish schedule, liveness and limits."""

from __future__ import annotations

from dataclasses import dataclass

from asyncdp.dp.liveness import PEER_STOP_GRACE_S, check_heartbeat_settings
from asyncdp.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    dp_size: int
    wave_mode: bool  # MoE with dp > 1: waves, step snapshots, teardown on engine loss
    external_lb: bool = False  # engines send no RankStats; snapshots carry counts=None
    # Dense with ranks on other nodes: a node restarted in place of a lost one brings its ranks back (rejoin), so
    # the coordinator serves on when every rank is lost (the API servers decide whether the deployment lives on).
    ranks_can_return: bool = False
    publish_interval_s: float = 0.1
    heartbeat_publish_s: float = 5.0
    step_snapshot_wait_s: float = 0.05
    heartbeat_interval_s: float = 1.0  # --dp-heartbeat-interval-s
    heartbeat_timeout_s: float = 5.0  # --dp-heartbeat-timeout-s
    subscribe_timeout_s: float | None = 600.0  # all N engines must subscribe by then
    teardown_flush_s: float = 2.0
    peer_stop_grace_s: float = PEER_STOP_GRACE_S  # an engine's Goodbye: how long the launcher's Stopping may lag
    outbox_size: int = 256  # per peer; a peer whose outbox is full is cut off (asyncdp.coordinator.peers)

    def __post_init__(self) -> None:
        if self.dp_size < 1:
            raise ConfigError(f"--data-parallel-size must be >= 1 (got {self.dp_size}).")
        check_heartbeat_settings(self.heartbeat_interval_s, self.heartbeat_timeout_s)
