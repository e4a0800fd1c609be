"""The ``/server_info`` document (spec §12.2), built from a DP client's view of the deployment.

Built only for ``GET /server_info`` (never per request): it reads the client through :class:`ServerInfoSource`,
so this module does not import the client.
"""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from asyncdp.apiserver.client_config import ClientConfig
from asyncdp.apiserver.node_table import NodeTable, monotonic_ms, stuck_siblings
from asyncdp.version import __version__


class ServerInfoSource(Protocol):
    """What the document reads from a DP client."""

    cfg: ClientConfig
    processes: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    current_wave: int
    wave_running: bool

    @property
    def coordinator_state(self) -> str: ...

    def engine_states(self) -> dict[int, tuple[bool, float]]: ...

    def inflight_of(self, dp_rank: int) -> int: ...

    def snapshot_age_s(self) -> float | None: ...

    def node_processes(self) -> list[dict[str, Any]] | None: ...


def node_processes(node: NodeTable, client_index: int) -> list[dict[str, Any]]:
    """The node table as one API process reads it: each process's admission count, heartbeat and whether stuck."""
    now = monotonic_ms()
    slots = node.slots()
    stuck = set(stuck_siblings(slots, client_index, now))
    return [{"client_index": s.client_index, "pid": s.pid or None, "inflight": s.inflight,
             "heartbeat_age_s": round((now - s.heartbeat_ms) / 1000, 3) if s.pid else None,
             "stuck": s.client_index in stuck} for s in slots]


def client_server_info(client: ServerInfoSource) -> dict[str, Any]:
    cfg = client.cfg
    now = time.monotonic()
    ranks = []
    engines = client.engine_states()
    on_node = set(cfg.managed_ranks if cfg.local_ranks is None else cfg.local_ranks)
    for local_index, rank in enumerate(cfg.managed_ranks):
        if rank not in engines:
            state, seen = "starting", None
        else:
            alive, last_seen = engines[rank]
            state = "ready" if alive else "dead"
            seen = round(now - last_seen, 3)
        ranks.append({"dp_rank": rank, "local_index": local_index, "local": rank in on_node, "state": state,
                      "last_seen_s": seen, "inflight": client.inflight_of(rank)})
    age = client.snapshot_age_s()
    coordinator = None
    if cfg.dp_size > 1:
        coord_proc = next((p for p in client.processes if p.get("role") == "coordinator"), None)
        coordinator = {
            "host": (coord_proc or {}).get("host", "127.0.0.1"),
            "pid": (coord_proc or {}).get("pid"),
            "state": client.coordinator_state,
            "snapshot_age_s": None if age is None else round(age, 3),
        }
    return {
        "asyncdp_version": __version__,
        "model": cfg.model_name,
        "is_moe": cfg.is_moe,
        "enable_expert_parallel": cfg.enable_expert_parallel,
        "mode": cfg.mode,
        "dp_size": cfg.dp_size,
        # This node's engines (0 on an API-only head), and the first of them.
        "dp_size_local": len(on_node),
        "dp_start_rank": min(on_node) if on_node else 0,
        "managed_ranks": ranks,
        "api_process_count": cfg.client_count,
        "api_process_rank": cfg.client_index,
        # Which process answered: a client can tell this deployment from another one on the same address.
        "api_process_pid": os.getpid(),
        "lb_policy": cfg.lb_policy,
        "wave": {"current": client.current_wave, "running": client.wave_running} if cfg.is_moe else None,
        "coordinator": coordinator,
        "processes": client.processes,
        "nodes": client.nodes,
        # With several API processes on the node: each one's admission count and heartbeat, as read here.
        "api_processes": client.node_processes(),
        "parallel_config": {
            "data_parallel_size": cfg.dp_size,
            "_api_process_count": cfg.client_count,
            "_api_process_rank": cfg.client_index,
        },
    }
