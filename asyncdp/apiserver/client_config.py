"""The frozen configuration of one API-server process's DP client (built by the launcher from the deployment)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ClientConfig:
    client_index: int
    client_count: int
    managed_ranks: tuple[int, ...]
    dp_size: int
    model_name: str
    max_model_len: int
    is_moe: bool = False
    lb_policy: str = "vllm"
    lb_seed: int | None = None  # the policy's random stream (random, power_of_two, ...): None draws from the OS
    max_queued_requests: int | None = None
    engine_ready_timeout_s: float = 600.0
    coordinator_client_addr: str | None = None
    local_ranks: tuple[int, ...] | None = None  # ranks whose engines run on this node (None: all managed ones)
    mode: str = "internal"
    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0  # --dp-heartbeat-timeout-s: a coordinator silent this long is dead
    enable_expert_parallel: bool = False
    utility_timeout_s: float = 600.0  # every utility call (pause, resume, collective_rpc, ...) ends by then
    link_secret: bytes | None = field(default=None, repr=False)  # the deployment secret its links prove; never logged

    def with_coordinator(self, addr: str) -> ClientConfig:
        return dataclasses.replace(self, coordinator_client_addr=addr)
