"""The engine child process: handshake with the front-end, build the core, connect links, serve.

Startup (spec §5.3): connect to the handshake address (retrying up to 300 s, E7), send ``Hello``, receive
``HandshakeInit`` (on a hybrid node with ``S > 0``: from the head and from this node's front-end, spec §5.4), build the engine core off the event loop, connect to every client and to the coordinator
(``Subscribe``, wait for ``CoordinatorReady``), send ``Ready`` to the front-end and ``EngineReady`` to each
client, start the grammar library's warm-up in the background (:mod:`asyncdp.engine.grammar_warm_up`). Then
:class:`~asyncdp.engine.rank.EngineRank` runs until shutdown.

The process gets an :class:`~asyncdp.config.roles.EngineRole` and reports ``ChildReady`` on the control channel
once the handshake is done. Signals (SIGTERM/SIGINT) and ``Shutdown`` on the control channel start an orderly
shutdown. EOF on
the control channel means the parent died: the rank stops at once (exit 1). A rank whose MoE group a peer left in
order while this rank was not asked to stop exits 1 after ``PeerLeftGroup``, so that its launcher can tell that
from a failure of its own (it waits ``PEER_STOP_GRACE_S`` for its own signal, spec §8.7).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from asyncdp import messages as m
from asyncdp.config.roles import EngineRole
from asyncdp.engine.grammar_warm_up import start_grammar_warm_up
from asyncdp.engine.rank import EngineRank, RankConfig
from asyncdp.errors import (
    ConfigError,
    DPGroupError,
    ForeignPeerError,
    LinkAuthError,
    RankTornDown,
    StartupError,
    leaf_exceptions,
)
from asyncdp.logs import kv_cache_line, weights_line
from asyncdp.model.threads import set_torch_threads
from asyncdp.transport import Link, connect, connect_with_retry
from asyncdp.transport.control import ControlChannel, follow_parent
from asyncdp.transport.heartbeat import send_heartbeats

if TYPE_CHECKING:
    from asyncdp.engine.core import EngineCore

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 300.0


def rank_config(role: EngineRole) -> RankConfig:
    """The rank's runtime configuration from its role config."""
    return RankConfig(
        dp_rank=role.dp_rank, dp_size=role.dp_size, engine=role.engine, is_moe=role.is_moe,
        external_lb=role.external_lb, heartbeat_interval_s=role.heartbeat_interval_s,
        heartbeat_timeout_s=role.heartbeat_timeout_s, shutdown_timeout_s=role.shutdown_timeout_s,
        sync_interval=role.sync_interval, prefill_schedule_interval=role.prefill_schedule_interval,
        enable_expert_parallel=role.enable_expert_parallel, stops_with_head=role.local or role.headless,
        link_secret=role.link_secret)


def _summary(cfg: RankConfig, core: EngineCore) -> dict[str, Any]:
    """What must agree across the ranks of a group (spec §5.3), readable, for Ready.config_summary."""
    from asyncdp.config.summary import model_identity, parallel_config_summary
    from asyncdp.model import read_model_info

    info = read_model_info(cfg.engine.model)
    return parallel_config_summary(
        cfg.engine, model_identity=model_identity(cfg.engine.model), dp_size=cfg.dp_size,
        enable_expert_parallel=cfg.enable_expert_parallel, num_experts=info.num_experts,
        sync_interval=cfg.sync_interval, prefill_schedule_interval=cfg.prefill_schedule_interval,
        max_model_len=core.max_model_len, protocol_version=m.PROTOCOL_VERSION)


def _join_dp_group(cfg: RankConfig, info: m.DPGroupInfo) -> Any:
    """torch's thread count, then the rank's DP process group: on the execution thread, because the import of
    torch (``asyncdp.model.distributed`` imports it) holds that thread for seconds."""
    from asyncdp.model.distributed import init_dp_group

    set_torch_threads(cfg.engine.torch_threads)
    return init_dp_group(info, cfg.dp_rank, secret=cfg.link_secret)


def _build_alone(cfg: RankConfig) -> EngineCore:
    """torch's thread count, then the core of a rank outside a DP group, on the execution thread."""
    from asyncdp.engine.build import build_engine_core

    set_torch_threads(cfg.engine.torch_threads)
    return build_engine_core(cfg.engine, dp_rank=cfg.dp_rank)


async def _build_core(cfg: RankConfig, init: m.HandshakeInit) -> tuple[EngineCore, Any, anyio.CapacityLimiter]:
    """Build the core; for a MoE rank of a DP group, join the torch.distributed group first (spec §5.5).

    Everything that imports torch or touches it runs on the rank's execution thread (one limiter), never on the
    event loop: importing torch holds its thread for seconds, and a stop signal must be acted on meanwhile. Group
    set-up and the executor's construction issue every collective of this rank from that thread, in the same order
    on every rank. Both may wait for peers that never come (the rendezvous, the first collectives), so a stop
    signal abandons the thread (the process hard-exits; spec §12.5: a stopped launcher exits 0 within 4.1 s, peers
    or not).
    """
    from asyncdp.engine.build import build_engine_core

    limiter = anyio.CapacityLimiter(1)
    if init.dp_group is None or not cfg.is_moe or cfg.dp_size == 1:
        core = await anyio.to_thread.run_sync(_build_alone, cfg, limiter=limiter, abandon_on_cancel=True)
        return core, None, limiter
    group = await anyio.to_thread.run_sync(_join_dp_group, cfg, init.dp_group, limiter=limiter, abandon_on_cancel=True)
    from asyncdp.model.distributed import DPContext, TorchDPGroup  # imported by now, on the execution thread

    try:
        ctx = DPContext(group, enable_expert_parallel=cfg.enable_expert_parallel)
        core = await anyio.to_thread.run_sync(functools.partial(build_engine_core, cfg.engine, dp=ctx,
                                                                dp_rank=cfg.dp_rank),
                                              limiter=limiter, abandon_on_cancel=True)
    except BaseException:
        group.destroy()
        raise
    return core, TorchDPGroup.from_group(group, limiter), limiter


def _log_core(cfg: RankConfig, core: EngineCore, build_s: float) -> None:
    """The rank's "weights loaded" and "KV cache" stage lines, from what its executor reports."""
    executor = core.executor
    describe = getattr(executor, "describe_weights", None)  # a simulated executor has no weights
    if describe is not None:
        num_parameters, dtype, device, load_s = describe()
        log.info("%s", weights_line(cfg.dp_rank, num_parameters=num_parameters, dtype=dtype, device=device,
                                    took_s=load_s))
    else:
        log.info("%s", weights_line(cfg.dp_rank, num_parameters=None, dtype=None, device=None, took_s=build_s))
    log.info("%s", kv_cache_line(cfg.dp_rank, num_blocks=executor.num_kv_blocks, block_size=cfg.engine.block_size,
                                 num_bytes=getattr(executor, "kv_cache_bytes", None)))


async def _connect_peers(cfg: RankConfig, init: m.HandshakeInit) -> tuple[dict[int, Link], Link | None]:
    """Connect to the coordinator (``Subscribe``, then wait for ``CoordinatorReady``), then to every client.

    The clients come second: a client drops an engine link whose first frame (``EngineReady``) does not come
    within 30 s, and ``CoordinatorReady`` waits for every rank of the deployment, which on another node may start
    minutes later."""
    coordinator: Link | None = None
    if init.coordinator is not None:
        coordinator = await _reach(cfg, init.coordinator.engine_addr, "coordinator", "the DP coordinator")
        await coordinator.send(m.Subscribe(dp_rank=cfg.dp_rank))
        async with anyio.create_task_group() as beats:
            # The coordinator sends CoordinatorReady once every rank subscribed, which may be long after this
            # one (ranks load their models at different speeds): stay alive to it meanwhile (spec §5.7).
            beats.start_soon(send_heartbeats, coordinator.send, cfg.heartbeat_interval_s, f"rank-{cfg.dp_rank}")
            while not isinstance(msg := await coordinator.receive(), m.CoordinatorReady | m.Teardown):
                pass
            beats.cancel_scope.cancel()
        if isinstance(msg, m.Teardown):  # raised outside the task group: callers catch it as itself
            await coordinator.aclose()
            raise RankTornDown(f"teardown during startup: {msg.reason}")
    clients: dict[int, Link] = {c.client_index: await _reach(cfg, c.addr, f"client-{c.client_index}",
                                                             f"API server {c.client_index}")
                                for c in init.clients}
    return clients, coordinator


async def _reach(cfg: RankConfig, addr: str, name: str, what: str) -> Link:
    """Connect to a peer the handshake named; a peer that is not there (gone since, or unreachable) is a
    :class:`StartupError` that names it, not a traceback."""
    try:
        return await connect(addr, name=name, secret=cfg.link_secret)
    except (OSError, LinkAuthError) as exc:
        raise StartupError(f"rank {cfg.dp_rank}: cannot reach {what} at {addr} that the front-end's handshake "
                           f"named ({exc})") from None


def _ready(cfg: RankConfig, core: EngineCore, *, local: bool, headless: bool) -> m.Ready:
    """``Ready`` for a front-end; a rank of a DP group carries its configuration hash and summary (E6)."""
    summary: dict[str, Any] = {}
    digest = None
    if cfg.dp_size > 1:
        from asyncdp.config.summary import config_hash

        summary = _summary(cfg, core)
        digest = config_hash(summary)
    return m.Ready(dp_rank=cfg.dp_rank, local=local, headless=headless, config_hash=digest, config_summary=summary)


async def _hello(cfg: RankConfig, link: Link, *, local: bool, headless: bool, what: str,
                 config_summary: Mapping[str, Any] | None = None) -> m.HandshakeInit:
    """Say ``Hello`` on one handshake link and return the front-end's ``HandshakeInit`` (spec §5.3 steps 2-3).
    ``config_summary`` (this launch's parallel configuration) lets the front-end refuse a rank configured
    otherwise before it joins the DP group."""
    await link.send(m.Hello(protocol_version=m.PROTOCOL_VERSION, dp_rank=cfg.dp_rank, local=local,
                            headless=headless, host=socket.gethostname(), pid=os.getpid(),
                            launcher_pid=os.getppid(), config_summary=dict(config_summary or {})))
    try:
        init = await link.receive()
    except ForeignPeerError as exc:  # the handshake address names another service, or another asyncdp version
        raise StartupError(f"rank {cfg.dp_rank}: {exc.handshake_problem(exc.addr)}") from None
    if isinstance(init, m.HandshakeError):
        raise StartupError(f"rank {cfg.dp_rank}: {what} refused the handshake: {init.reason}")
    if not isinstance(init, m.HandshakeInit):
        raise StartupError(f"rank {cfg.dp_rank}: expected HandshakeInit from {what}, got {type(init).__name__}")
    return init


async def start_rank(cfg: RankConfig, handshake: Link, *, local_handshake: Link | None = None, local: bool = True,
                     headless: bool = False, config_summary: Mapping[str, Any] | None = None) -> EngineRank:
    """Handshake over ``handshake`` (already connected) and return a connected rank, ready to run.

    ``handshake`` leads to the head front-end (rank 0's: the coordinator's addresses, the DP group's rendezvous);
    ``local_handshake``, on a hybrid node with ``S > 0``, to this node's own front-end, which hands out the client
    addresses (spec §5.4). ``local``/``headless`` are what ``Hello`` says to the head (E4)."""
    init = await _hello(cfg, handshake, local=local, headless=headless, what="the front-end",
                        config_summary=config_summary)
    if local_handshake is not None:
        own = await _hello(cfg, local_handshake, local=True, headless=False, what="this node's front-end",
                           config_summary=config_summary)
        init = m.HandshakeInit(clients=own.clients, coordinator=init.coordinator, dp_group=init.dp_group,
                               client_count=own.client_count)

    building_since = time.monotonic()
    try:
        core, dp_group, limiter = await _build_core(cfg, init)
    except ConfigError as exc:
        # a flag this machine or model cannot take (--device cuda without CUDA, say): the head fails startup
        # with this one line instead of a handshake that broke off, and this rank logs it without a traceback
        for link in (handshake, local_handshake):
            if link is not None:
                with anyio.move_on_after(1.0):
                    await link.send(m.HandshakeError(reason=str(exc)))
        raise StartupError(f"rank {cfg.dp_rank}: {exc}") from None
    _log_core(cfg, core, time.monotonic() - building_since)
    try:
        clients, coordinator = await _connect_peers(cfg, init)
        ready = _ready(cfg, core, local=local, headless=headless)  # the summary reads the checkpoint: once
        await handshake.send(ready)
        if local_handshake is not None:
            await local_handshake.send(msgspec.structs.replace(ready, local=True, headless=False))
        coord_client_addr = init.coordinator.client_addr if init.coordinator else None
        for link in clients.values():
            await link.send(
                m.EngineReady(
                    dp_rank=cfg.dp_rank,
                    max_model_len=core.max_model_len,
                    num_kv_blocks=core.executor.num_kv_blocks,
                    block_size=cfg.engine.block_size,
                    coordinator_client_addr=coord_client_addr,
                    pid=os.getpid(),
                )
            )
    except BaseException:
        core.shutdown()
        if dp_group is not None:
            dp_group.abort()
        raise
    start_grammar_warm_up(cfg.dp_rank, core)  # off the path to readiness
    return EngineRank(cfg, core, clients, coordinator, dp_group=dp_group, limiter=limiter)


_PEER_LOSS = ("connection reset by peer", "connection closed by peer", "read error", "broken pipe")


def _lost_peer(exc: BaseException) -> str | None:
    """The one-line cause when ``exc`` is only a DP collective that failed because a peer is gone (a group
    error, or gloo's "Connection reset by peer"), else None (a real failure: logged with its traceback)."""
    leaves = leaf_exceptions(exc)
    for leaf in leaves:
        text = str(leaf)
        if not (isinstance(leaf, DPGroupError) or
                (isinstance(leaf, RuntimeError) and any(p in text.lower() for p in _PEER_LOSS))):
            return None
    return str(leaves[0]).splitlines()[0][:300] if leaves else None


async def run_rank_process(role: EngineRole, control: ControlChannel) -> int:
    started_at = time.monotonic()
    cfg = rank_config(role)
    addr = role.handshake_addr
    rank: EngineRank | None = None
    code = 0

    async with anyio.create_task_group() as tg:

        async def on_signals() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    if rank is None:  # still starting: nothing to drain
                        tg.cancel_scope.cancel()
                        return
                    rank.request_shutdown()

        def on_command(cmd: m.ControlMessage) -> None:
            if isinstance(cmd, m.Shutdown) and rank is not None:
                rank.request_shutdown()
            elif isinstance(cmd, m.Stopping) and rank is not None:  # the node stops; engines come after the API
                rank.expect_stop()

        async def on_control() -> None:
            nonlocal code
            await follow_parent(control, on_command, who=f"rank {cfg.dp_rank}")
            code = 1
            tg.cancel_scope.cancel()

        tg.start_soon(on_signals)
        tg.start_soon(on_control)
        local_handshake: Link | None = None
        try:
            with anyio.fail_after(HANDSHAKE_TIMEOUT_S):
                handshake = await connect_with_retry(addr, timeout_s=HANDSHAKE_TIMEOUT_S, what="the front-end",
                                                     secret=cfg.link_secret)
                if role.local_handshake_addr is not None:
                    addr = role.local_handshake_addr
                    local_handshake = await connect_with_retry(addr, timeout_s=HANDSHAKE_TIMEOUT_S,
                                                               what="this node's front-end", secret=cfg.link_secret)
        except (TimeoutError, LinkAuthError) as exc:
            if isinstance(exc, LinkAuthError):
                log.error("rank %d: %s", cfg.dp_rank, exc)
            else:
                log.error("did not receive handshake from the front-end at %s within %.0f s", addr,
                          HANDSHAKE_TIMEOUT_S)
            tg.cancel_scope.cancel()  # a bare return would wait forever for the signal and control tasks
            return 1
        try:
            rank = await start_rank(cfg, handshake, local_handshake=local_handshake, local=role.local,
                                    headless=role.headless, config_summary=role.config_summary)
            log.info("rank %d ready in %.1f s (max model length %d tokens)", cfg.dp_rank,
                     time.monotonic() - started_at, rank.core.max_model_len)
            await control.send(m.ChildReady(dp_rank=cfg.dp_rank))
            await rank.run()
        except (RankTornDown, StartupError) as exc:  # a teardown, or a refusal that says why: no traceback
            log.error("%s", exc)
            code = 1
            if isinstance(exc, RankTornDown) and exc.peer_stopped:  # the launcher gives its own stop a grace
                with anyio.move_on_after(1.0):
                    await control.send(m.PeerLeftGroup(dp_rank=cfg.dp_rank, reason=exc.cause))
        except Exception as exc:
            leaves = leaf_exceptions(exc)
            lost = _lost_peer(exc)
            if rank is None and leaves and all(isinstance(x, anyio.EndOfStream | anyio.BrokenResourceError)
                                               for x in leaves):
                # the coordinator or a front-end closed its link before this rank was up: the peer that gave up
                # (a startup deadline, a refusal, a failure elsewhere) logs why; a traceback here adds nothing
                log.error("rank %d: a peer closed its link during startup (%s); stopping", cfg.dp_rank,
                          type(leaves[0]).__name__)
            elif lost is not None and cfg.is_moe and cfg.dp_size > 1:  # expected when a peer of the group dies
                log.error("rank %d: the DP group lost a peer during a collective: %s", cfg.dp_rank, lost)
            else:
                log.exception("rank %d failed", cfg.dp_rank)
            code = 1
        finally:
            await handshake.aclose()
            if local_handshake is not None:
                await local_handshake.aclose()
            if rank is not None:
                rank.core.shutdown()
        tg.cancel_scope.cancel()
    return code
