"""The multi-port supervisor role (``--data-parallel-multi-port-external-lb``, spec §11.3).

Theory of operation
-------------------
:func:`run_supervisor` is the top process of ``asyncdp serve -dpm``: it names itself ``asyncdp-supervisor``,
derives one ``asyncdp serve`` command per local rank (:mod:`.derive`) and runs :func:`supervise`, which owns the
lifecycle and takes its commands from outside (tests give it mock children):

1. Lock every port (the supervisor's and each child's, :func:`~asyncdp.transport.http_socket.lock_http_port`: no second deployment
   can take one while the children start, see :mod:`asyncdp.transport.port_lock`; held until the supervisor
   exits), bind the supervisor port without listening (it is held from now on: no port-0 bind or outgoing
   connection on the machine is given it during a start-up of minutes, yet a connection is refused as to a closed
   port) and check that every child port can be bound (a busy port fails before anything starts, naming the
   port; exit 1).
   Install the SIGTERM/SIGINT watcher: a signal clears ``ready``, sets ``shutdown``
   and is remembered.
2. Spawn the children (:mod:`.children`; none once a signal came, held or received: SIGTERM and SIGINT are
   blocked in each until its ``asyncdp.__main__`` handles them, so a child signalled while its interpreter
   starts stops as a starting server does, exit 0, not killed by the signal), one watcher task per child, and
   the prober (:mod:`.probe`): rounds ``--dp-supervisor-probe-interval-s`` apart probe every child's
   ``/health`` concurrently. All healthy -> ``ready``. Before ready a failure only keeps polling.
3. Once ready (and not shutting down), listen on the supervisor port and serve ``/health``, ``/ready``,
   ``/readyz`` (:mod:`.health_server`): 200 while ready and not shutting down, else 503. Before this the port
   is closed. A listen or server failure starts shutdown.
4. Shutdown starts on a signal, on any child's exit (the watcher sees it at once, through a pidfd: the spec's
   per-interval monitor, event-driven), on a child unhealthy after ready, or on a server failure. Then:
   ``ready`` is cleared (503 at once; the port stays open), the remembered signal (default SIGTERM) goes to every
   live child, which get ``--shutdown-timeout + 5 s`` in total; stragglers' process trees are killed with a
   warning. A second signal kills every child's tree at once. Last the HTTP server stops.

Exit status (:func:`exit_status`): 0 when a signal started the shutdown and every child exited 0; 1 after a child
death, an unhealthy probe, a server failure, or when a child had to be killed. An exception propagates (exit 1);
the children's trees are killed on the way out, whatever ended the supervisor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import signal
import socket
from collections.abc import Sequence

import anyio
import anyio.abc

from asyncdp import runtime
from asyncdp.api.serve import SSLFiles
from asyncdp.config.deployment import ResolvedServeConfig
from asyncdp.errors import StartupError
from asyncdp.supervisor.children import SupervisedChild, describe_exit
from asyncdp.supervisor.derive import ChildCommand, ResolveArgs, check_child_commands, child_commands
from asyncdp.supervisor.health_server import (
    create_health_app,
    ensure_port_free,
    reserve_port,
    serve_health,
    start_listening,
)
from asyncdp.supervisor.probe import ProbeTarget, attempts_per_probe, judge_round, probe_host, probe_round
from asyncdp.supervisor.settings import SupervisorSettings
from asyncdp.transport.http_socket import lock_http_port
from asyncdp.transport.link_auth import unauthenticated_warning
from asyncdp.transport.port_lock import bind_locked

log = logging.getLogger("asyncdp.supervisor")

PROCESS_TITLE = "asyncdp-supervisor"
_REAP_AFTER_KILL_S = 5.0
PROGRESS_LOG_EVERY_S = 10.0  # "waiting for ..." while the children start (spec §2.5)
SUPERVISOR_PORT = "the supervisor port (--data-parallel-supervisor-port)"


def exit_status(*, failed: bool, signalled: bool, killed: bool, child_codes: Sequence[int | None]) -> int:
    """0 only when a signal ended an orderly run and every child exited 0 by itself; else 1 (§11.3)."""
    if failed or killed or not signalled:
        return 1
    return 0 if all(code == 0 for code in child_codes) else 1


class Supervision:
    """The state every task of :func:`supervise` shares. ``shutdown`` is the one event they all end on."""

    def __init__(self, settings: SupervisorSettings, port: socket.socket) -> None:
        self.settings = settings
        self.port = port  # the supervisor port, bound (reserved) from the start; it listens once ready
        self.children: list[SupervisedChild] = []
        self.ready = False
        self.became_ready = anyio.Event()
        self.shutdown = anyio.Event()
        self.stop_http = anyio.Event()
        self.signal: int | None = None  # the signal that started the shutdown, forwarded to the children
        self.failure: str | None = None  # the first failure, logged once
        self.killed = False

    def is_serving(self) -> bool:
        return self.ready and not self.shutdown.is_set()

    def start_shutdown(self, *, failure: str | None = None) -> None:
        self.ready = False
        if failure is not None and self.failure is None and not self.shutdown.is_set():
            self.failure = failure
            log.error("%s; stopping every child", failure)
        self.shutdown.set()

    def kill_all(self) -> None:
        for child in self.children:
            if child.alive:
                self.killed = True
                child.kill_tree()


async def _wait_any(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as tg:
        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


async def _watch_signals(sup: Supervision, *, task_status: anyio.abc.TaskStatus[None]) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        for signum in runtime.take_early_stops():  # held since the event loop began (runtime.run)
            _on_signal(sup, signum)
        task_status.started()
        async for signum in signals:
            _on_signal(sup, signum)


def _on_signal(sup: Supervision, signum: int) -> None:
    name = signal.Signals(signum).name
    if sup.signal is not None:
        log.warning("second signal (%s): killing every child now", name)
        sup.kill_all()
    elif sup.shutdown.is_set():  # a failure stops the children already; a second signal kills them
        sup.signal = signum
        log.info("received %s: the children are stopping already", name)
    else:
        sup.signal = signum
        log.info("received %s: stopping every child (they drain for up to %g s)", name,
                 sup.settings.shutdown_timeout_s)
        sup.start_shutdown()


async def _watch_child(sup: Supervision, child: SupervisedChild) -> None:
    code = await child.wait_exit()
    if sup.shutdown.is_set():
        log.log(logging.INFO if code == 0 else logging.WARNING, "%s exited with %s", child.describe(),
                describe_exit(code))
    else:
        sup.start_shutdown(failure=f"{child.describe()} exited with {describe_exit(code)}")


async def _run_prober(sup: Supervision) -> None:
    s = sup.settings
    targets = [ProbeTarget(c.command.dp_rank, probe_host(s.host), c.command.port, tls=s.tls)
               for c in sup.children]
    next_progress_log = anyio.current_time() + PROGRESS_LOG_EVERY_S
    while not sup.shutdown.is_set():
        results = await probe_round(targets, attempts=attempts_per_probe(ready=sup.ready,
                                                                          failure_threshold=s.probe_failure_threshold),
                                    timeout_s=s.probe_timeout_s, interval_s=s.probe_interval_s)
        if sup.shutdown.is_set():
            return
        verdict = judge_round(results, ready=sup.ready)
        if verdict.kind == "ready" and not sup.ready:
            sup.ready = True
            sup.became_ready.set()
        elif verdict.kind == "polling" and anyio.current_time() >= next_progress_log:
            next_progress_log = anyio.current_time() + PROGRESS_LOG_EVERY_S
            log.info("waiting for %d of %d children to become healthy: %s", len(verdict.unhealthy), len(targets),
                     "; ".join(f"rank {r.dp_rank} (port {r.port}) {r.describe()}" for r in verdict.unhealthy))
        elif verdict.kind == "unhealthy":
            by_rank = {c.command.dp_rank: c for c in sup.children}
            sup.start_shutdown(failure="; ".join(f"{by_rank[r.dp_rank].describe()} is unhealthy: {r.describe()}"
                                                 for r in verdict.unhealthy))
            return
        await anyio.sleep(s.probe_interval_s)


async def _monitor_prober(sup: Supervision) -> None:
    """The prober's end, whatever it is, starts shutdown (§11.3 "Monitoring"): a bug in it stops the children in
    order instead of leaving them unwatched or killing them abruptly."""
    try:
        await _run_prober(sup)
    except Exception as exc:
        log.exception("the prober failed")
        sup.start_shutdown(failure=f"the prober failed: {type(exc).__name__}: {exc}")
    else:
        if not sup.shutdown.is_set():
            sup.start_shutdown(failure="the prober ended")


async def _run_http(sup: Supervision) -> None:
    """Listen on the supervisor port now (every child is ready) and serve it until the end; a failure shuts
    down."""
    s = sup.settings
    sock = sup.port
    try:
        start_listening(sock, what=SUPERVISOR_PORT)
    except StartupError as exc:
        sup.start_shutdown(failure=str(exc))
        return
    ssl = SSLFiles(certfile=s.ssl_certfile, keyfile=s.ssl_keyfile) if s.ssl_certfile and s.ssl_keyfile else None
    app = create_health_app(sup.is_serving, backend=s.backend)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(functools.partial(serve_health, app, sock, backend=s.backend, ssl=ssl,
                                             shutdown_trigger=sup.stop_http.wait))
            sock.close()  # Hypercorn serves its duplicate; once it stops, the port is closed
            host = s.host or "0.0.0.0"
            log.info("every child is ready: serving /health, /ready, /readyz on %s://%s:%d", s.scheme,
                     f"[{host}]" if ":" in host else host, s.supervisor_port)
    except Exception as exc:  # the server failed: shutdown (the children are stopped by the caller)
        sup.start_shutdown(failure=f"the supervisor HTTP server failed: {type(exc).__name__}: {exc}")
    finally:
        sock.close()


async def _stop_children(sup: Supervision) -> None:
    grace_s = sup.settings.stop_grace_s
    sig = sup.signal if sup.signal is not None else signal.SIGTERM
    for child in sup.children:
        child.send_signal(sig)
    with anyio.move_on_after(grace_s):
        for child in sup.children:
            await child.exited.wait()
    for child in sup.children:
        if child.alive:
            log.warning("child rank %d did not exit within %gs; killing", child.command.dp_rank, grace_s)
            sup.killed = True
            child.kill_tree()
    with anyio.move_on_after(_REAP_AFTER_KILL_S):
        for child in sup.children:
            await child.exited.wait()


def _hold_ports(commands: Sequence[ChildCommand], settings: SupervisorSettings,
                locks: contextlib.ExitStack) -> socket.socket:
    """Lock every port of the deployment for the supervisor's lifetime (its own and each child's, into ``locks``:
    no second deployment can take one while the children start), reserve the supervisor port and check that each
    child's can be bound. The reserved supervisor port is returned; a busy port is a StartupError naming it."""
    host = settings.host
    for command in commands:  # the children take none: their ``asyncdp serve`` leaves it to the supervisor
        locks.enter_context(lock_http_port(host, command.port, what=f"the port of {command.describe()}"))
    # Held from now on, so that nothing else on the machine is given it while the children start (a port-0
    # bind, an outgoing connection), yet closed to clients (connection refused) until every child is ready.
    port, lock = bind_locked(settings.supervisor_port, functools.partial(reserve_port, host, what=SUPERVISOR_PORT),
                             functools.partial(lock_http_port, host, what=SUPERVISOR_PORT))
    locks.enter_context(lock)
    try:
        for command in commands:
            ensure_port_free(host, command.port, what=f"the port of {command.describe()}")
    except StartupError:
        port.close()
        raise
    return port


async def supervise(commands: Sequence[ChildCommand], settings: SupervisorSettings) -> int:
    """Run the children of ``commands`` under the lifecycle of §11.3; return the exit status."""
    with contextlib.ExitStack() as locks:  # the ports' locks, let go of last
        try:
            port = _hold_ports(commands, settings, locks)
        except StartupError as exc:
            log.error("%s; no child was started", exc)
            return 1
        return await _run(commands, settings, port)


async def _run(commands: Sequence[ChildCommand], settings: SupervisorSettings, port: socket.socket) -> int:
    """The lifecycle of §11.3 once every port is held (``port``: the supervisor's, reserved)."""
    sup = Supervision(settings, port)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(_watch_signals, sup)
            for command in commands if not sup.shutdown.is_set() else ():  # (none after a stop held till now)
                child = SupervisedChild.spawn(command)
                sup.children.append(child)
                log.info("started %s: %s", child.describe(), " ".join(command.argv))
                tg.start_soon(_watch_child, sup, child)
            tg.start_soon(_monitor_prober, sup)
            await _wait_any(sup.became_ready, sup.shutdown)
            if not sup.shutdown.is_set():
                tg.start_soon(_run_http, sup)
            await sup.shutdown.wait()
            sup.ready = False
            await _stop_children(sup)
            sup.stop_http.set()
            tg.cancel_scope.cancel()
    finally:
        port.close()  # (closed already if it served)
        sup.kill_all()  # only an exception leaves a child alive here
    code = exit_status(failed=sup.failure is not None, signalled=sup.signal is not None, killed=sup.killed,
                       child_codes=[c.returncode for c in sup.children])
    bad = [f"{c.describe()}: {describe_exit(c.returncode)}" for c in sup.children
           if c.returncode is not None and c.returncode != 0]
    if not bad and code != 0 and sup.failure is not None:  # every child exited 0: the cause was the failure
        bad = [sup.failure]
    log.log(logging.INFO if code == 0 else logging.ERROR, "supervisor stopped with exit status %d%s", code,
            f" ({'; '.join(bad)})" if bad else "")
    return code


def run_supervisor(config: ResolvedServeConfig, argv: list[str], *, resolve_args: ResolveArgs | None = None) -> int:
    """``asyncdp serve ... --data-parallel-multi-port-external-lb``: ``argv`` is the ``serve`` arguments as the
    user typed them (without ``serve``); returns the process exit code.

    ``resolve_args`` (the CLI's parser: arguments and environment -> resolved config) runs pass 2 on every
    child's derived arguments before anything starts (:func:`~asyncdp.supervisor.derive.check_child_commands`);
    its ConfigError propagates to the caller."""
    commands = child_commands(argv, config.deployment, cpu_count=os.cpu_count())
    if resolve_args is not None:
        check_child_commands(commands, resolve_args)
    settings = SupervisorSettings.from_config(config)
    if config.data_parallel_secret is None:  # the children, external-LB ranks of one deployment, link over TCP
        dep = config.deployment
        settings = dataclasses.replace(settings, link_warning=unauthenticated_warning(dep.data_parallel_address,
                                                                                      dep.data_parallel_rpc_port))
    return run_children(commands, settings)


def run_children(commands: Sequence[ChildCommand], settings: SupervisorSettings) -> int:
    """The supervisor process around :func:`supervise`: logging, the process title, the event loop."""
    from asyncdp.logs import setup_logging

    setup_logging(prefix="asyncdp-supervisor", level=settings.log_level.upper())
    if settings.link_warning is not None:  # once here; the children leave it to the supervisor
        log.warning("%s", settings.link_warning)
    try:
        import setproctitle

        setproctitle.setproctitle(PROCESS_TITLE)
    except ImportError:
        pass
    try:
        return runtime.run(supervise, commands, settings, backend=settings.backend, hold_stops=True)
    except KeyboardInterrupt:  # before the signal watcher is in place
        return 1
