"""The coordinator child process (``asyncdp-coordinator``): bind its two listeners, report them, serve.

It gets a :class:`~asyncdp.config.roles.CoordinatorRole`, binds the engine-link and client-link listeners (Unix
sockets on one node, TCP port 0 on the DP address for peers on other nodes), reports both addresses to the launcher (``CoordinatorListening`` on the control channel;
spec §5.1: the binder reports the real address) once it serves, and runs
:func:`asyncdp.coordinator.core.serve_coordinator`. Exit codes: 0 after an orderly end or a signal, 1 after a MoE
teardown, a startup error, or the parent's death. ``Stopping`` from the launcher marks an orderly shutdown.
"""

from __future__ import annotations

import logging
import signal

import anyio
import anyio.abc

from asyncdp import messages as m
from asyncdp.config.roles import CoordinatorRole
from asyncdp.coordinator.core import CoordinatorConfig, serve_coordinator
from asyncdp.errors import AsyncDPError
from asyncdp.transport import LinkListener, listen_links
from asyncdp.transport.control import ControlChannel, follow_parent

log = logging.getLogger(__name__)


def coordinator_config(role: CoordinatorRole) -> CoordinatorConfig:
    """The coordinator's runtime configuration from its role config."""
    return CoordinatorConfig(
        dp_size=role.dp_size,
        wave_mode=role.wave_mode,
        external_lb=role.external_lb,
        heartbeat_interval_s=role.heartbeat_interval_s,
        heartbeat_timeout_s=role.heartbeat_timeout_s,
        subscribe_timeout_s=role.subscribe_timeout_s,
        ranks_can_return=role.ranks_can_return,
    )


async def _listen(tcp_host: str | None, socket_dir: str, name: str, secret: bytes | None) -> LinkListener:
    """TCP port 0 on ``tcp_host`` when peers are on other nodes, else a fresh Unix socket (spec §5.1); with the
    deployment secret, every peer proves it holds it before its first frame is read."""
    if tcp_host is not None:
        return await listen_links("tcp", host=tcp_host, name=name, secret=secret)
    return await listen_links("unix", directory=socket_dir, prefix=f"asyncdp-coord-{name}", name=name, secret=secret)


async def run_coordinator_process(role: CoordinatorRole, control: ControlChannel) -> int:
    config = coordinator_config(role)
    engines = await _listen(role.engine_link_host, role.socket_dir, "engine", role.link_secret)
    clients = await _listen(role.client_link_host, role.socket_dir, "client", role.link_secret)
    code = 0
    stopping = anyio.Event()  # the launcher announces an orderly shutdown: departures are expected then
    async with anyio.create_task_group() as tg:

        async def on_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

        def on_command(cmd: m.ControlMessage) -> None:
            if isinstance(cmd, m.Stopping):
                stopping.set()

        async def on_control() -> None:
            nonlocal code
            await follow_parent(control, on_command, who="the coordinator")
            code = 1
            tg.cancel_scope.cancel()

        tg.start_soon(on_signals)
        tg.start_soon(on_control)
        async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            nonlocal code
            try:
                await serve_coordinator(config, engines, clients, stopping=stopping, task_status=task_status)
            except AsyncDPError as exc:
                log.error("%s", exc)
                code = 1
            tg.cancel_scope.cancel()

        try:
            await tg.start(run)
        except RuntimeError:  # it failed before it was ready (already logged)
            tg.cancel_scope.cancel()
            return 1
        await control.send(m.CoordinatorListening(engine_addr=engines.addr, client_addr=clients.addr))
    return code
