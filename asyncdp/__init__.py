"""asyncdp: data-parallel LLM serving on anyio structured concurrency."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncdp.version import __version__

if TYPE_CHECKING:
    from asyncdp.llm import LLM
    from asyncdp.outputs import CompletionOutput, RequestOutput
    from asyncdp.sampling_params import SamplingParams, StructuredOutputs

__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "StructuredOutputs", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: `import asyncdp` must stay cheap (no torch) for the CLI, the coordinator and the API processes.
    if name == "LLM":
        from asyncdp.llm import LLM

        return LLM
    if name in ("CompletionOutput", "RequestOutput"):
        from asyncdp import outputs

        return getattr(outputs, name)
    if name in ("SamplingParams", "StructuredOutputs"):
        from asyncdp import sampling_params

        return getattr(sampling_params, name)
    raise AttributeError(f"module 'asyncdp' has no attribute {name!r}")
