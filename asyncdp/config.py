"""Frozen per-role configuration, and all validation of user input.

This is the only module that reads ``os.environ``. Every check raises :class:`~asyncdp.errors.ConfigError` with a
message that names the flag, its value and what to change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from asyncdp.errors import ConfigError

DEFAULT_MODEL = "builtin:tiny-moe"


@dataclass(frozen=True, slots=True)
class SimCostProfile:
    """Step-time model of the simulated executor: ``a + b*prefill_tokens + c*decode_seqs + d*kv_tokens`` (ms)."""

    a_ms: float = 0.0
    b_ms_per_token: float = 0.0
    c_ms_per_seq: float = 0.0
    d_ms_per_kv_token: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything one rank's engine core needs. Shared by the offline ``LLM`` and the engine process."""

    model: str = DEFAULT_MODEL
    tokenizer: str | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's own limit
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derived from kv_cache_memory_bytes
    kv_cache_memory_bytes: int = 1 << 30
    enable_prefix_caching: bool = True
    executor: str = "torch"  # "torch" | "sim"
    sim_cost: SimCostProfile = SimCostProfile()
    seed: int = 0
    dtype: str = "auto"  # "auto" | "float32" | "bfloat16" | "float16"
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    torch_threads: int | None = None  # None: leave torch's default

    def replace(self, **changes: object) -> EngineConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def validate(self) -> EngineConfig:
        def need(cond: bool, flag: str, allowed: str, value: object) -> None:
            if not cond:
                raise ConfigError(f"{flag} must be {allowed} (got {value!r}).")

        need(self.max_num_seqs >= 1, "--max-num-seqs", ">= 1", self.max_num_seqs)
        need(self.max_num_batched_tokens >= 1, "--max-num-batched-tokens", ">= 1", self.max_num_batched_tokens)
        need(self.max_model_len is None or self.max_model_len >= 2, "--max-model-len", ">= 2", self.max_model_len)
        need(self.block_size in (1, 2, 4, 8, 16, 32, 64, 128), "--block-size", "a power of two in [1, 128]",
             self.block_size)
        need(self.num_kv_blocks is None or self.num_kv_blocks >= 1, "--num-kv-blocks", ">= 1", self.num_kv_blocks)
        need(self.executor in ("torch", "sim"), "--executor", "one of torch, sim", self.executor)
        need(self.dtype in ("auto", "float32", "bfloat16", "float16"), "--dtype",
             "one of auto, float32, bfloat16, float16", self.dtype)
        need(self.device in ("auto", "cpu", "cuda"), "--device", "one of auto, cpu, cuda", self.device)
        need(self.torch_threads is None or self.torch_threads >= 1, "--torch-threads", ">= 1", self.torch_threads)
        return self


def prometheus_multiproc_dir() -> str | None:
    """The directory of Prometheus multiprocess mode (env ``PROMETHEUS_MULTIPROC_DIR``), or None.

    prometheus_client reads the same variable when it is first imported, so launchers set it in the
    environment of their children before those start.
    """
    import os

    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
