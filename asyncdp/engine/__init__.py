"""The engine of one rank: requests, KV block manager, scheduler, detokenizer, executors and the sync core.

Nothing here imports torch except ``model_runner`` (and ``sampler``), which are imported only on demand.
"""

from asyncdp.engine.build import build_engine_core
from asyncdp.engine.core import EngineCore, StepOutputs

__all__ = ["EngineCore", "StepOutputs", "build_engine_core"]
