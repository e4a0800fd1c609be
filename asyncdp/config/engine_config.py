"""One rank's engine configuration (:class:`EngineConfig`) and the simulated executor's cost profile, with their
checks. :mod:`asyncdp.config.flags` re-exports both: the serve flags hold an EngineConfig, and the offline ``LLM``
builds one from its keyword arguments.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from asyncdp.config.choices import ENGINE_CHOICES
from asyncdp.errors import ConfigError

DEFAULT_MODEL = "builtin:tiny-moe"


@dataclass(frozen=True, slots=True)
class SimCostProfile:
    """Step-time model of the simulated executor (ms): ``a + b*prefill_tokens + c*decode_seqs + d*kv_tokens +
    e*Σ p*(c0 + p/2)``, the last sum over the step's prefill chunks of ``p`` tokens after ``c0`` of context
    (prefill attention, quadratic in the chunk: routing-bench §5; 0 unless a profile turns it on)."""

    a_ms: float = 0.0
    b_ms_per_token: float = 0.0
    c_ms_per_seq: float = 0.0
    d_ms_per_kv_token: float = 0.0
    e_ms_per_token_pair: float = 0.0

    @classmethod
    def parse(cls, text: str) -> SimCostProfile:
        """Parse ``--sim-cost "a,b,c,d[,e]"`` (milliseconds)."""
        parts = [p.strip() for p in text.split(",")]
        try:
            values = [float(p) for p in parts]
        except ValueError:
            values = []
        if len(values) not in (4, 5) or any(v < 0 for v in values):
            raise ConfigError(f"--sim-cost must be four or five non-negative numbers 'a,b,c,d[,e]' in ms "
                              f"(got {text!r}).")
        return cls(*values)


# EngineConfig's annotations (strings, under ``from __future__ import annotations``) -> the type its value must have.
_FIELD_TYPES: dict[str, type] = {"int": int, "int | None": int, "bool": bool, "str": str, "str | None": str}


def _is(kind: type, value: object) -> bool:
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))  # True is no count


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
    scheduling_policy: str = "fcfs"  # SCHEDULING_POLICIES
    # vLLM's share of a CUDA device's memory for the weights and the KV cache (None: not given, the KV cache takes
    # kv_cache_memory_bytes); no effect on CPU, as in vLLM's CPU backend
    gpu_memory_utilization: float | None = None

    def replace(self, **changes: object) -> EngineConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def validate(self) -> EngineConfig:
        def need(cond: bool, flag: str, allowed: str, value: object) -> None:
            if not cond:
                raise ConfigError(f"{flag} must be {allowed} (got {value!r}).")

        for field in dataclasses.fields(self):  # LLM(**engine_args) passes Python values: types first
            kind = _FIELD_TYPES.get(str(field.type))
            value = getattr(self, field.name)
            if kind is not None and not (value is None and "None" in str(field.type) or _is(kind, value)):
                flag = "--" + field.name.replace("_", "-")
                raise ConfigError(f"{field.name} ({flag}) must be {kind.__name__}"
                                  f"{' or None' if 'None' in str(field.type) else ''} (got {value!r}).")
        need(self.max_num_seqs >= 1, "--max-num-seqs", ">= 1", self.max_num_seqs)
        need(self.max_num_batched_tokens >= 1, "--max-num-batched-tokens", ">= 1", self.max_num_batched_tokens)
        need(self.max_model_len is None or self.max_model_len >= 2, "--max-model-len", ">= 2", self.max_model_len)
        need(self.block_size in (1, 2, 4, 8, 16, 32, 64, 128), "--block-size", "a power of two in [1, 128]",
             self.block_size)
        need(self.num_kv_blocks is None or self.num_kv_blocks >= 2, "--num-kv-blocks",
             ">= 2 (block 0 is the engine's scratch block)", self.num_kv_blocks)
        need(self.kv_cache_memory_bytes >= 1, "--kv-cache-memory-bytes", ">= 1", self.kv_cache_memory_bytes)
        for f, choices in ENGINE_CHOICES.items():  # --executor, --dtype, --device, --scheduling-policy
            need(getattr(self, f) in choices, "--" + f.replace("_", "-"), "one of " + ", ".join(choices), getattr(self, f))
        need(self.torch_threads is None or self.torch_threads >= 1, "--torch-threads", ">= 1", self.torch_threads)
        share = self.gpu_memory_utilization
        need(share is None or (isinstance(share, int | float) and not isinstance(share, bool) and 0 < share <= 1),
             "--gpu-memory-utilization", "in (0, 1]", share)
        cost = self.sim_cost  # SimCostProfile.parse checks the flag's text; a profile built in Python is checked here
        need(isinstance(cost, SimCostProfile) and all(
            isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < math.inf
            for v in dataclasses.astuple(cost)), "sim_cost (--sim-cost)",
             "a SimCostProfile of non-negative finite numbers (ms)", cost)
        return self
