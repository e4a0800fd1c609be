"""Public test helpers (spec style rule 14: ``asyncdp.testing`` is public on purpose).

:mod:`asyncdp.testing.cluster` runs a whole dense DP deployment (coordinator, engine ranks with the simulated
executor, DP clients) in one event loop over in-memory links; under trio's ``MockClock`` it runs in virtual time.
Names are imported lazily so ``import asyncdp.testing`` stays cheap.
"""

from __future__ import annotations

from typing import Any

_CLUSTER_NAMES = frozenset({
    "InjectedFault", "MemoryLinkListener", "SimCluster", "SimCoordinator", "SimLink", "SimRankExecutor",
    "SimRequest", "open_sim_cluster", "sim_link_pair", "stream_rng",
})

__all__ = sorted(_CLUSTER_NAMES)


def __getattr__(name: str) -> Any:
    if name in _CLUSTER_NAMES:
        from asyncdp.testing import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module 'asyncdp.testing' has no attribute {name!r}")
