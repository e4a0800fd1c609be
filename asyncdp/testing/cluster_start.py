"""How :func:`~asyncdp.testing.cluster.open_sim_cluster` builds the roles of a simulated deployment and wires
them, in the order the real processes start: the coordinator accepts links; every rank subscribes to it and waits
for ``CoordinatorReady``, then sends ``EngineReady`` to every client; it returns once every client saw every rank
ready and, with a coordinator, got its welcome snapshot. See :mod:`asyncdp.testing.cluster`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from asyncdp.apiserver.client import ClientConfig, DPClient
from asyncdp.config.flags import EngineConfig
from asyncdp.coordinator.core import CoordinatorConfig
from asyncdp.engine.core import EngineCore
from asyncdp.engine.dp_group import MemoryDPGroup
from asyncdp.engine.rank import EngineRank, RankConfig
from asyncdp.engine.sim_executor import TokenSource
from asyncdp.testing.links import MemoryLinkListener, SimLink
from asyncdp.testing.sim import SimCoordinator, SimRankExecutor, stream_rng
from asyncdp.transport import Link

if TYPE_CHECKING:
    from asyncdp.testing.cluster import SimCluster


async def start_cluster(cluster: SimCluster, tg: anyio.abc.TaskGroup, engine_config: EngineConfig, vocab_size: int,
                 max_model_len: int, eos_token_ids: Sequence[int], tokenizer: Any, lb_policy: str,
                 coordinator_config: CoordinatorConfig | None, ranks: tuple[int, ...],
                 heartbeat_interval_s: float, heartbeat_timeout_s: float, moe: tuple[int, str] | None,
                 client_outbox_size: int, token_source: TokenSource | None = None,
                 lb_seed: int | None = None) -> None:
    dp_size, num_clients = cluster.dp_size, cluster.num_clients
    if coordinator_config is not None:
        cluster.coordinator = SimCoordinator(
            coordinator_config, MemoryLinkListener(name="coord-engine", codec=cluster.codec),
            MemoryLinkListener(name="coord-client", codec=cluster.codec), anyio.Event())
        await tg.start(cluster._run_coordinator)

    for ci in range(num_clients):
        cfg = ClientConfig(client_index=ci, client_count=num_clients, managed_ranks=ranks, dp_size=dp_size,
                           model_name="sim", max_model_len=max_model_len, lb_policy=lb_policy, is_moe=moe is not None,
                           heartbeat_interval_s=heartbeat_interval_s, heartbeat_timeout_s=heartbeat_timeout_s,
                           lb_seed=0 if lb_seed is None else stream_rng(lb_seed, f"policy/{ci}").getrandbits(64))
        cluster.clients.append(DPClient(cfg, tokenizer))

    rank_client_links: list[dict[int, Link]] = [{} for _ in ranks]
    for r in ranks:
        for ci, client in enumerate(cluster.clients):
            rank_end, client_end = cluster.wiring.engine_pair(r, ci)
            rank_client_links[r][ci] = rank_end
            tg.start_soon(client.attach_engine, client_end)

    coordinator_links: list[SimLink | None] = []
    groups = MemoryDPGroup.create(dp_size) if moe is not None and dp_size > 1 else None
    sync_interval, sync_cadence = moe if moe is not None else (32, "asyncdp")
    for r in ranks:
        executor = SimRankExecutor(engine_config, vocab_size, max_model_len=max_model_len,
                                   avoid_token_ids=eos_token_ids, token_source=token_source)
        cluster._executors.append(executor)
        core = EngineCore(engine_config, executor, tokenizer, eos_token_ids=eos_token_ids,
                          clock=anyio.current_time)
        coord_link = cluster.coordinator.engine_listener.connect() if cluster.coordinator else None
        if coord_link is not None:
            cluster.wiring.add_rank_end(r, coord_link)
        coordinator_links.append(coord_link)
        rank_cfg = RankConfig(dp_rank=r, dp_size=dp_size, engine=engine_config, is_moe=moe is not None,
                              heartbeat_interval_s=heartbeat_interval_s, heartbeat_timeout_s=heartbeat_timeout_s,
                              sync_interval=sync_interval, sync_cadence=sync_cadence,
                              client_outbox_size=client_outbox_size)
        cluster.ranks.append(EngineRank(rank_cfg, core, rank_client_links[r], coord_link, inline_step=True,
                                        dp_group=None if groups is None else groups[r]))
    for r in ranks:
        tg.start_soon(cluster._run_rank, r, coordinator_links[r])

    for client in cluster.clients:
        await client.wait_engines_ready()
    if cluster.coordinator is not None:
        for ci, client in enumerate(cluster.clients):
            link = cluster.coordinator.client_listener.connect()
            cluster.wiring.watch_snapshots(ci, link)
            tg.start_soon(client.attach_coordinator, link)
            await cluster.wiring.first_snapshot[ci].wait()  # the welcome snapshot: the client routes on counts


