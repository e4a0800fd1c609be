"""Public test helpers (style rule 14: ``asyncdp.testing`` is public on purpose).

- :class:`FakeEngineClient`: a deterministic in-process engine client, to test HTTP code without engines.
- :func:`byte_tokenizer`: a tiny byte-level Hugging Face tokenizer with a ChatML template.
- :func:`open_sim_cluster` (:mod:`asyncdp.testing.cluster`): a whole DP deployment (coordinator, engine
  ranks with the simulated executor, real DP clients; dense or MoE) in one event loop over in-memory links;
  under trio's ``MockClock`` it runs in virtual time. ``SimCluster.stall_client`` plays a client that stops
  reading.
- :func:`open_rank_cluster` (:mod:`asyncdp.testing.rank_cluster`): MoE ranks in lockstep with the real
  coordinator, driven by :class:`FakeRankClient` (client 0, which places every request on the rank the test
  names and records outputs, utility results and stats); :func:`sim_rank_core` builds one rank's core.
- :func:`timer_ties_in_arming_order` (:mod:`asyncdp.testing.sim`): trio wakes same-instant timers in the order
  they were armed, not by memory address, so a virtual-time run does not depend on the heap's layout.

Names are imported lazily so ``import asyncdp.testing`` stays cheap.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "FakeEngineClient": "fake_client", "byte_tokenizer": "tokenizer",
    "MemoryLinkListener": "links", "SimLink": "links", "sim_link_pair": "links",
    "InjectedFault": "sim", "SimRankExecutor": "sim", "stream_rng": "sim", "timer_ties_in_arming_order": "sim",
    "SimCluster": "cluster", "SimCoordinator": "sim", "SimRequest": "sim", "open_sim_cluster": "cluster",
    "FakeRankClient": "rank_cluster", "RankCluster": "rank_cluster", "RankResult": "rank_cluster",
    "open_rank_cluster": "rank_cluster", "sim_rank_core": "rank_cluster",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncdp.testing' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"asyncdp.testing.{module}"), name)
