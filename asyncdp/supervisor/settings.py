"""The supervisor's own settings (spec §2.3, §11.3): what it needs beyond the children's commands."""

from __future__ import annotations

from dataclasses import dataclass

from asyncdp.config.flags import ServeConfig

# A child gets --shutdown-timeout to drain, then this much more before its process tree is killed (§2.5).
KILL_MARGIN_S = 5.0


@dataclass(frozen=True, slots=True)
class SupervisorSettings:
    """``--data-parallel-supervisor-port``, the ``--dp-supervisor-probe-*`` flags, ``--host``, TLS,
    ``--shutdown-timeout`` and the anyio backend, as the supervisor reads them."""

    supervisor_port: int = 9256
    host: str | None = None  # bind host of the supervisor and of every child; None: all interfaces
    probe_interval_s: float = 5.0  # between probe rounds, and between the attempts of one probe
    probe_timeout_s: float = 5.0  # one probe attempt, connect plus answer
    probe_failure_threshold: int = 3  # attempts per probe once ready (1 before)
    shutdown_timeout_s: float = 0.0  # the children's drain time
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    backend: str = "asyncio"
    log_level: str = "info"
    link_warning: str | None = None  # no deployment secret: the children's links run unauthenticated (logged once)

    @classmethod
    def from_config(cls, config: ServeConfig) -> SupervisorSettings:
        return cls(
            supervisor_port=config.data_parallel_supervisor_port, host=config.host,
            probe_interval_s=config.dp_supervisor_probe_interval_s,
            probe_timeout_s=config.dp_supervisor_probe_timeout_s,
            probe_failure_threshold=config.dp_supervisor_probe_failure_threshold,
            shutdown_timeout_s=float(config.shutdown_timeout_s), ssl_certfile=config.ssl_certfile,
            ssl_keyfile=config.ssl_keyfile, backend=config.backend, log_level=config.log_level)

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None and self.ssl_keyfile is not None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def stop_grace_s(self) -> float:
        """How long the children get after the signal before their trees are killed: drain + 5 s."""
        return self.shutdown_timeout_s + KILL_MARGIN_S
