"""The launcher role: start a single-node deployment in order, watch it, and tear it down in order.

Theory of operation
-------------------
``run_serve(config)`` is the top process of ``asyncdp serve``; it resolves a :class:`~asyncdp.launcher.launch_plan.LaunchPlan`
and, in order (spec §5.3):

1. bind the HTTP socket (E11: a busy port fails before any child starts);
2. spawn the DP coordinator when ``dp > 1`` and wait for its addresses (E8): its client address goes into every
   API server's configuration;
3. bind the client listener(s): in-process for one API server, or spawn ``asyncdp-api-{i}`` children that report
   theirs over the control channel;
4. for a MoE group, host the torch.distributed rendezvous store (port 0);
5. bind the handshake listener and spawn one ``asyncdp-engine-dp{r}`` per rank; each engine says ``Hello``,
   gets ``HandshakeInit`` (client and coordinator addresses) and reports ``Ready``;
6. wait until every API server reports ready (all its ranks sent ``EngineReady``, E9).

A signal or a failure during startup ends these waits at once.

Every child is watched from the launcher's task group. During startup any child death aborts startup (E12,
exit 1). Afterwards: an API-server death tears the node down (exit 1); a dense engine death only degrades
service (the clients route around it) unless ``--dp-fail-fast``; a MoE engine or coordinator death tears the
group down (exit 1).

Shutdown (SIGTERM/SIGINT, spec §12.5) runs API servers -> engines -> coordinator under one deadline of
``--shutdown-timeout + 5 s``; stragglers' process trees are killed. Exit 0 when orderly.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import msgspec

from asyncdp import messages as m
from asyncdp import runtime
from asyncdp.apiserver.client import ClientConfig, DPClient
from asyncdp.apiserver.node_table import NodeTable
from asyncdp.apiserver.process import ApiConfig, bind_client_listener, serve_api
from asyncdp.config.flags import ServeConfig
from asyncdp.engine.rank import RankConfig
from asyncdp.engine.rank_process import rank_payload
from asyncdp.errors import AsyncDPError, ChildExited, ProtocolError, StartupError
from asyncdp.launcher.launch_plan import LaunchPlan, bind_http_socket, plan_from_config
from asyncdp.logs import DrainCounts, serving_line, stopped_line
from asyncdp.transport import Link, listen, serve_links
from asyncdp.transport.control import ChildProcess, spawn_child
from asyncdp.transport.http_socket import reserve_shared_port

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 5.0
HANDSHAKE_HELLO_TIMEOUT_S = 30.0


@dataclass
class _Deployment:
    plan: LaunchPlan
    http_sock: socket.socket
    tmpdir: str
    shutdown: anyio.Event = field(default_factory=anyio.Event)
    api_shutdown: anyio.Event = field(default_factory=anyio.Event)
    started: bool = False
    failure: str | None = None
    children: list[ChildProcess] = field(default_factory=list)
    client_addrs: list[m.ClientAddr] = field(default_factory=list)
    coordinator_addrs: m.CoordinatorAddrs | None = None
    connected_ranks: set[int] = field(default_factory=set)  # said Hello (a second Hello is E5)
    ready_ranks: set[int] = field(default_factory=set)  # sent Ready
    inproc_client: DPClient | None = None
    dp_group_info: m.DPGroupInfo | None = None
    rendezvous_store: Any = None  # the torch TCPStore of a MoE DP group; lives as long as the deployment
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    inproc_api_done: anyio.Event = field(default_factory=anyio.Event)
    inproc_api_code: int = 0
    handshake_addr: str = ""
    node_table: NodeTable | None = None  # with several API servers: their shared admission/heartbeat table
    node_table_fd: int = -1
    started_at: float = 0.0  # time.monotonic() when `asyncdp serve` began: the startup line's total
    inproc_drain: DrainCounts = field(default_factory=DrainCounts)

    @property
    def http_port(self) -> int:
        return self.http_sock.getsockname()[1] if self.http_sock.fileno() != -1 else self.plan.port

    def fail(self, reason: str) -> None:
        if self.failure is None and not self.shutdown.is_set():
            log.error("%s", reason)
            self.failure = reason
        self.shutdown.set()

    def process_table(self) -> list[dict[str, Any]]:
        host = socket.gethostname()
        c = self.plan.api_server_count
        top = {
            "role": "launcher" if c > 1 else "api_server",
            "rank": None,
            "client_index": None if c > 1 else 0,
            "pid": os.getpid(),
            "host": host,
            "ports": {"http": self.http_port, "handshake": self.handshake_addr},
        }
        rows = [top]
        for ch in self.children:
            row: dict[str, Any] = {"role": {"api": "api_server"}.get(ch.role, ch.role), "rank": ch.rank,
                                   "client_index": ch.rank if ch.role == "api" else None, "pid": ch.pid,
                                   "host": host, "ports": {}}
            if ch.role == "api":
                row["rank"] = None
                row["ports"] = {"http": self.http_port, "client_link": ch.events.get("listening", {}).get("client_addr")}
            elif ch.role == "coordinator" and self.coordinator_addrs:
                row["ports"] = {"engine_link": self.coordinator_addrs.engine_addr,
                                "client_link": self.coordinator_addrs.client_addr}
            rows.append(row)
        return rows


def run_serve(config: ServeConfig) -> int:
    """``asyncdp serve``: run a deployment until a signal or a failure; return the process exit code."""
    from asyncdp.logs import setup_logging

    started_at = time.monotonic()
    setup_logging(prefix="asyncdp-launcher" if (config.deployment and config.deployment.api_server_count > 1)
                  else "APIServer", level=config.log_level.upper())
    try:
        plan = plan_from_config(config)  # resolves the model: a built-in is generated (or converted) once here
    except AsyncDPError as exc:
        log.error("%s", exc)
        return 1
    log.info("model %s: checkpoint %s (resolved in %.2f s)", config.model, plan.model_path,
             time.monotonic() - started_at)
    return run_plan(plan, started_at=started_at)


def _bind_http(plan: LaunchPlan) -> socket.socket:
    """E11, first act: the HTTP port. One API server listens on the launcher's socket; several each listen on
    their own ``SO_REUSEPORT`` socket (the kernel spreads connections), the launcher only reserves the port."""
    if plan.api_server_count == 1:
        return bind_http_socket(plan.host, plan.port)
    return reserve_shared_port(plan.host, plan.port)


def run_plan(plan: LaunchPlan, *, started_at: float | None = None) -> int:
    """Run a deployment described by ``plan``; return the process exit code.

    ``started_at``: ``time.monotonic()`` when the command began (default: now), for the startup's total time."""
    started_at = time.monotonic() if started_at is None else started_at
    try:
        import setproctitle

        setproctitle.setproctitle("asyncdp-launcher" if plan.api_server_count > 1 else "asyncdp-api-0")
    except ImportError:
        pass
    try:
        http_sock = _bind_http(plan)
    except StartupError as exc:
        log.error("%s", exc)
        return 1
    tmpdir = tempfile.mkdtemp(prefix="asyncdp-")
    try:
        return runtime.run(_serve, plan, http_sock, tmpdir, started_at, backend=plan.backend)
    except KeyboardInterrupt:
        return 0
    finally:
        http_sock.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


async def _serve(plan: LaunchPlan, http_sock: socket.socket, tmpdir: str, started_at: float) -> int:
    dep = _Deployment(plan, http_sock, tmpdir, started_at=started_at)
    async with anyio.create_task_group() as tg:
        tg.start_soon(_watch_signals, dep)
        await _run_startup(dep, functools.partial(_start, dep, tg))
        if not dep.shutdown.is_set():
            dep.started = True
            await _publish_process_table(dep)
            host, port = dep.http_sock.getsockname()[:2]  # the address really bound (port 0 resolved)
            log.info("%s", serving_line(model=plan.served_model_name, model_path=_shown_model(plan),
                                        scheme="https" if plan.ssl_certfile else "http", host=host, port=port,
                                        dp_size=plan.dp_size, api_server_count=plan.api_server_count,
                                        took_s=time.monotonic() - dep.started_at))
        await dep.shutdown.wait()
        await _stop_all(dep)
        tg.cancel_scope.cancel()
    if dep.node_table is not None:
        dep.node_table.close()
        os.close(dep.node_table_fd)
    code = 1 if dep.failure is not None or dep.inproc_api_code else 0
    counts, unreported = _drain_counts(dep)
    log.log(logging.INFO if code == 0 else logging.ERROR, "%s",
            stopped_line(counts, exit_status=code, unreported=unreported))
    return code


def _shown_model(plan: LaunchPlan) -> str | None:
    """The checkpoint behind the served name, when the name alone does not say it (a built-in's cache folder
    and a served name equal to the path add nothing)."""
    if plan.served_model_name.startswith("builtin:") or plan.served_model_name == plan.model_path:
        return None
    return plan.model_path


def _drain_counts(dep: _Deployment) -> tuple[list[DrainCounts], int]:
    """Every API server's drain counts, and how many API servers exited without reporting theirs."""
    if dep.plan.api_server_count == 1:
        return [dep.inproc_drain], 0
    counts, unreported = [], 0
    for ch in dep.children:
        if ch.role != "api":
            continue
        ev = ch.events.get("stopped")
        if ev is None:
            unreported += 1
        else:
            counts.append(DrainCounts(drained=int(ev["drained"]), aborted=int(ev["aborted"])))
    return counts, unreported


async def _run_startup(dep: _Deployment, start: Callable[[], Awaitable[None]]) -> None:
    """Run ``start`` until it returns, fails, or ``dep.shutdown`` is set (a signal, a failed handshake).

    Startup waits last up to ``--engine-ready-timeout-s``; a SIGTERM or a failure seen elsewhere must end them
    at once, not when the deadline expires.
    """
    async with anyio.create_task_group() as startup:

        async def abort_on_shutdown() -> None:
            await dep.shutdown.wait()
            startup.cancel_scope.cancel()

        startup.start_soon(abort_on_shutdown)
        try:
            await start()
        except (ChildExited, StartupError, TimeoutError) as exc:
            dep.fail(f"startup failed: {exc}")
        except Exception as exc:
            log.exception("startup failed")
            dep.fail(f"startup failed: {exc}")
        startup.cancel_scope.cancel()


async def _watch_signals(dep: _Deployment) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            if dep.shutdown.is_set():
                log.warning("second signal: killing every child now")
                for ch in dep.children:
                    ch.kill_tree()
                continue
            timeout_s = dep.plan.shutdown_timeout_s
            log.info("received %s: shutting down (%s)", signal.Signals(signum).name,
                     f"in-flight requests get up to {timeout_s:g} s to finish" if timeout_s > 0
                     else "in-flight requests are aborted: --shutdown-timeout 0")
            dep.shutdown.set()


async def _spawn(dep: _Deployment, tg: anyio.abc.TaskGroup, **kwargs: Any) -> ChildProcess:
    env = kwargs.pop("env", None)
    with anyio.CancelScope(shield=True):  # short and bounded: a started child is always recorded, never orphaned
        child = await spawn_child(backend=dep.plan.backend, env=env, log_level=dep.plan.log_level,
                                  run_dir=dep.tmpdir, **kwargs)
        dep.children.append(child)
    tg.start_soon(child.read_events)
    tg.start_soon(_watch_child, dep, child)
    return child


async def _watch_child(dep: _Deployment, child: ChildProcess) -> None:
    code = await child.watch_exit()
    if child.role == "api" and dep.node_table is not None and child.rank is not None:
        dep.node_table.clear(child.rank)  # its slots and heartbeat no longer count for the siblings
    if dep.shutdown.is_set():
        return
    what = f"{child.describe()} exited with code {code}"
    if not dep.started:
        return  # startup waits see ChildExited and fail with E12
    plan = dep.plan
    if child.role == "engine" and not plan.is_moe and not plan.dp_fail_fast:
        log.error("%s; the other ranks keep serving", what)
        return
    if child.role == "coordinator" and not plan.is_moe:
        log.warning("%s; clients route on in-flight counts only", what)
        return
    dep.fail(f"{what}; tearing the deployment down")


def _coordinator_payload(dep: _Deployment) -> dict[str, Any]:
    plan = dep.plan
    return {
        "dp_size": plan.dp_size, "is_moe": plan.is_moe, "socket_dir": dep.tmpdir,
        "heartbeat_interval_s": plan.heartbeat_interval_s, "heartbeat_timeout_s": plan.heartbeat_timeout_s,
        # Engines subscribe only after loading their model: the same budget as the API servers' ready wait.
        "subscribe_timeout_s": plan.engine_ready_timeout_s,
    }


def _client_config(plan: LaunchPlan, client_index: int, coordinator_client_addr: str | None) -> ClientConfig:
    return ClientConfig(
        client_index=client_index,
        client_count=plan.api_server_count,
        managed_ranks=tuple(range(plan.dp_size)),
        dp_size=plan.dp_size,
        model_name=plan.served_model_name,
        max_model_len=plan.max_model_len,
        is_moe=plan.is_moe,
        lb_policy=plan.lb_policy,
        max_queued_requests=plan.max_queued_requests,
        engine_ready_timeout_s=plan.engine_ready_timeout_s,
        coordinator_client_addr=coordinator_client_addr,
        mode=plan.mode,
        enable_expert_parallel=plan.enable_expert_parallel,
    )


def _api_config(dep: _Deployment, client_index: int) -> ApiConfig:
    plan = dep.plan
    coord = dep.coordinator_addrs.client_addr if dep.coordinator_addrs else None
    return ApiConfig(
        client=_client_config(plan, client_index, coord),
        model_path=plan.tokenizer_path or plan.model_path,  # the API server reads only the tokenizer from it
        backend=plan.backend,
        shutdown_timeout_s=plan.shutdown_timeout_s,
        keep_alive_on_engine_death=plan.keep_alive_on_engine_death,
        ssl_keyfile=plan.ssl_keyfile,
        ssl_certfile=plan.ssl_certfile,
        socket_dir=dep.tmpdir,
        max_seqs_per_request=plan.max_seqs_per_request,
        max_request_body_bytes=plan.max_request_body_bytes or None,
    )


async def _start(dep: _Deployment, tg: anyio.abc.TaskGroup) -> None:
    plan = dep.plan
    env = {}
    if plan.api_server_count > 1:
        metrics_dir = os.path.join(dep.tmpdir, "metrics")
        os.makedirs(metrics_dir)
        env["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir

    # 1. coordinator (its client address goes into every API server's config)
    if plan.dp_size > 1:
        coord = await _spawn(dep, tg, name="asyncdp-coordinator", role="coordinator", rank=None,
                             log_prefix="DPCoordinator", payload=_coordinator_payload(dep))
        with anyio.fail_after(plan.coordinator_startup_timeout_s):
            ev = await coord.wait_event("ready")
        dep.coordinator_addrs = m.CoordinatorAddrs(engine_addr=ev["engine_addr"], client_addr=ev["client_addr"])

    # 2. API servers and their client listeners
    api_children: list[ChildProcess] = []
    if plan.api_server_count == 1:
        listener, addr = await bind_client_listener(_api_config(dep, 0))
        dep.client_addrs.append(m.ClientAddr(client_index=0, addr=addr))
        inproc_ready = anyio.Event()

        async def inproc_api() -> None:
            async with anyio.create_task_group() as inner:
                async def run(*, task_status: anyio.abc.TaskStatus[DPClient]) -> None:
                    dep.inproc_api_code = await serve_api(_api_config(dep, 0), dep.http_sock, listener,
                                                          dep.api_shutdown, task_status=task_status,
                                                          stop_reason=lambda: dep.failure,
                                                          drain=dep.inproc_drain)
                    dep.inproc_api_done.set()
                    if dep.inproc_api_code:
                        dep.fail("the API server stopped: no data-parallel rank can serve")

                try:
                    dep.inproc_client = await inner.start(run)
                except Exception as exc:  # startup of the API server failed (E9 and friends)
                    dep.inproc_api_done.set()
                    dep.fail(f"startup failed: {exc}")
                    return
                inproc_ready.set()

        tg.start_soon(inproc_api)
    else:
        dep.node_table, dep.node_table_fd = NodeTable.create(plan.api_server_count)
        for i in range(plan.api_server_count):
            child = await _spawn(dep, tg, name=f"asyncdp-api-{i}", role="api", rank=i, env=env,
                                 log_prefix=f"APIServer_{i}",
                                 payload={"api": msgspec.to_builtins(_api_config(dep, i)),
                                          "http_shared_port": [plan.host, dep.http_port],
                                          "node_table_fd": dep.node_table_fd},
                                 pass_fds=(dep.node_table_fd,))
            api_children.append(child)
        for child in api_children:
            with anyio.fail_after(60):
                ev = await child.wait_event("listening")
            dep.client_addrs.append(m.ClientAddr(client_index=child.rank or 0, addr=ev["client_addr"]))

    # 3. a MoE group's torch.distributed rendezvous, hosted here on port 0 (spec §5.5)
    if plan.is_moe and plan.dp_size > 1:
        from asyncdp.model.distributed import dp_backend, host_rendezvous_store

        host = "127.0.0.1"
        dep.rendezvous_store, store_port = await anyio.to_thread.run_sync(host_rendezvous_store, host)
        device = "cuda" if plan.engine.device == "cuda" else "cpu"
        dep.dp_group_info = m.DPGroupInfo(master_addr=host, master_port=store_port, dp_size=plan.dp_size,
                                          backend=dp_backend(device))

    # 4. engines, through the handshake listener
    hs_listener, dep.handshake_addr = await listen("unix", directory=dep.tmpdir, prefix="asyncdp-handshake")
    tg.start_soon(serve_links, hs_listener, lambda link: _handshake(dep, link))
    engines = []
    threads = max(1, (os.cpu_count() or 1) // plan.dp_size)
    for r in range(plan.dp_size):
        cfg = RankConfig(
            dp_rank=r,
            dp_size=plan.dp_size,
            engine=plan.engine if plan.engine.torch_threads else plan.engine.replace(torch_threads=threads),
            is_moe=plan.is_moe,
            heartbeat_interval_s=plan.heartbeat_interval_s,
            heartbeat_timeout_s=plan.heartbeat_timeout_s,
            shutdown_timeout_s=plan.shutdown_timeout_s,
            sync_interval=plan.sync_interval,
            prefill_schedule_interval=plan.prefill_schedule_interval,
            enable_expert_parallel=plan.enable_expert_parallel,
        )
        engines.append(await _spawn(dep, tg, name=f"asyncdp-engine-dp{r}", role="engine", rank=r,
                                    log_prefix=f"EngineCore_DP{r}",
                                    payload=rank_payload(cfg, dep.handshake_addr)))

    # 5. wait for every engine's Ready and every API server's ready
    await _wait_all(dep, engines, "ready")
    if plan.api_server_count == 1:
        async with anyio.create_task_group() as waiters:
            async def api_ready() -> None:
                await inproc_ready.wait()
                waiters.cancel_scope.cancel()

            async def api_failed() -> None:
                await dep.inproc_api_done.wait()
                waiters.cancel_scope.cancel()

            waiters.start_soon(api_ready)
            waiters.start_soon(api_failed)
        if not inproc_ready.is_set():
            raise StartupError(dep.failure or "the API server did not start")
    else:
        await _wait_all(dep, api_children, "ready")


async def _wait_all(dep: _Deployment, children: list[ChildProcess], event: str) -> None:
    deadline = dep.plan.engine_ready_timeout_s
    with anyio.fail_after(deadline):
        for child in children:
            await child.wait_event(event)


async def _handshake(dep: _Deployment, link: Link) -> None:
    """Handshake with one engine (spec §5.3 steps 2-6), then keep the link open for the deployment's life."""
    try:
        await _handshake_steps(dep, link)
    except (anyio.EndOfStream, anyio.BrokenResourceError, ProtocolError, TimeoutError) as exc:
        # The engine closed its link (it crashed loading the model, say) or spoke garbage. Its exit is seen by
        # the child watchers; during startup, fail now with a reason instead of crashing the launcher.
        if not dep.started:
            dep.fail(f"startup failed: the handshake with an engine broke off ({type(exc).__name__}: {exc})")


async def _handshake_steps(dep: _Deployment, link: Link) -> None:
    plan = dep.plan
    with anyio.fail_after(HANDSHAKE_HELLO_TIMEOUT_S):  # a connected engine says Hello at once
        hello = await link.receive()
    if not isinstance(hello, m.Hello):
        await link.send(m.HandshakeError(reason=f"expected Hello, got {type(hello).__name__}"))
        return
    problem = None
    if hello.protocol_version != m.PROTOCOL_VERSION:
        problem = f"protocol_version {hello.protocol_version} != {m.PROTOCOL_VERSION}"
    elif not 0 <= hello.dp_rank < plan.dp_size:
        problem = f"dp_rank {hello.dp_rank} is outside [0, {plan.dp_size})"
    elif hello.dp_rank in dep.connected_ranks:
        problem = f"dp_rank {hello.dp_rank} connected twice"
    elif hello.headless:
        problem = (f"engine rank {hello.dp_rank} connected with headless=True, but this deployment expects "
                   "headless=False")
    if problem:
        await link.send(m.HandshakeError(reason=problem))
        dep.fail(f"startup failed: handshake with engine rank {hello.dp_rank}: {problem}")
        return
    dep.connected_ranks.add(hello.dp_rank)
    await link.send(m.HandshakeInit(clients=dep.client_addrs, coordinator=dep.coordinator_addrs,
                                    dp_group=dep.dp_group_info, client_count=plan.api_server_count))
    ready = await link.receive()
    if not isinstance(ready, m.Ready):
        dep.fail(f"startup failed: engine rank {hello.dp_rank} sent {type(ready).__name__} instead of Ready")
        return
    if ready.config_hash is not None:
        problem = check_config_agreement(dep.summaries, hello.dp_rank, ready.config_summary)
        if problem:
            dep.fail(f"startup failed: {problem}")
            return
    dep.ready_ranks.add(hello.dp_rank)
    async for _ in link:  # the handshake link stays open for the deployment's life (spec §5.7)
        pass


def check_config_agreement(summaries: dict[int, dict[str, Any]], dp_rank: int,
                           summary: dict[str, Any]) -> str | None:
    """E6: record ``dp_rank``'s parallel-configuration summary; return the mismatch message once it (or any rank
    recorded before rank 0) hashes differently from rank 0's, naming the differing fields. Ranks may report in
    any order."""
    from asyncdp.config.flags import config_hash, config_mismatch_message

    summaries[dp_rank] = dict(summary)
    rank0 = summaries.get(0)
    if rank0 is None:
        return None
    for r in ([dp_rank] if dp_rank != 0 else sorted(r for r in summaries if r != 0)):
        if config_hash(summaries[r]) != config_hash(rank0):
            return config_mismatch_message(r, summaries[r], rank0)
    return None


async def _publish_process_table(dep: _Deployment) -> None:
    table = dep.process_table()
    if dep.inproc_client is not None:
        dep.inproc_client.processes = table
    for ch in dep.children:
        if ch.role == "api":
            try:
                await ch.control.send({"cmd": "processes", "processes": table})
            except (anyio.BrokenResourceError, OSError):
                pass


async def _stop_all(dep: _Deployment) -> None:
    """API servers -> engines -> coordinator, under one shared deadline (spec §12.5)."""
    plan = dep.plan
    deadline = anyio.current_time() + plan.shutdown_timeout_s + SHUTDOWN_GRACE_S

    async def stop_role(role: str) -> None:
        children = [c for c in dep.children if c.role == role and not c.exited.is_set()]
        if not children:
            return
        grace_s = max(0.5, deadline - anyio.current_time())
        async with anyio.create_task_group() as tg:
            for ch in children:
                tg.start_soon(functools.partial(ch.stop, grace_s=grace_s))

    for ch in dep.children:  # the coordinator logs the engines' departures as expected, not as losses
        if ch.role == "coordinator" and not ch.exited.is_set():
            with anyio.move_on_after(1.0):
                try:
                    await ch.control.send({"cmd": "stopping"})
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    pass
    if dep.failure is not None:  # a teardown: the API servers name it to the requests they abandon
        for ch in dep.children:
            if ch.role == "api" and not ch.exited.is_set():
                with anyio.move_on_after(1.0):
                    try:
                        await ch.control.send({"cmd": "shutdown", "reason": dep.failure})
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        pass
    dep.api_shutdown.set()
    # The launcher never accepts on the HTTP socket; its copy would keep the port open (connections queue and
    # hang) after every API server stopped accepting. Spec §12.5: a refused connection once the listener closes.
    dep.http_sock.close()
    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_role, "api")
        if dep.inproc_client is not None:
            with anyio.move_on_after(max(0.5, deadline - anyio.current_time())):
                await dep.inproc_api_done.wait()
    await stop_role("engine")
    await stop_role("coordinator")
    for ch in dep.children:
        await ch.control.aclose()
    bad = [c for c in dep.children if c.returncode not in (0, None) and c.returncode != -signal.SIGTERM]
    if bad and dep.failure is None and not dep.started:
        dep.failure = "children failed: " + ", ".join(c.describe() for c in bad)
