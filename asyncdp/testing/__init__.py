"""Public test helpers (style rule 14: ``asyncdp.testing`` is public on purpose).

- :class:`FakeEngineClient`: a deterministic in-process engine client, to test HTTP code without engines.
- :func:`byte_tokenizer`: a tiny byte-level Hugging Face tokenizer with a ChatML template.
- :func:`open_sim_cluster` (:mod:`asyncdp.testing.cluster`): a whole dense DP deployment (coordinator, engine
  ranks with the simulated executor, DP clients) in one event loop over in-memory links; under trio's
  ``MockClock`` it runs in virtual time.

Names are imported lazily so ``import asyncdp.testing`` stays cheap.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "FakeEngineClient": "fake_client", "byte_tokenizer": "tokenizer",
    "MemoryLinkListener": "links", "SimLink": "links", "sim_link_pair": "links",
    "InjectedFault": "sim", "SimRankExecutor": "sim", "stream_rng": "sim",
    "SimCluster": "cluster", "SimCoordinator": "sim", "SimRequest": "sim", "open_sim_cluster": "cluster",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncdp.testing' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"asyncdp.testing.{module}"), name)
