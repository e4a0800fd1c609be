"""The ``vllm serve`` flags beyond data parallelism that carry over to ``asyncdp serve`` (docs/reference/cli.md,
"vLLM flags that carry over"), with vLLM's defaults, and their checks.

Theory of operation. Each flag falls in one of three groups:

1. honoured: asyncdp does what it asks (``--max-logprobs``, ``--uvicorn-log-level``, ``--enable-log-requests``
   with ``--max-log-len`` and ``--enable-log-outputs``, ``--generation-config`` with
   ``--override-generation-config``, whose sampling defaults :mod:`asyncdp.config.generation_config` resolves;
   ``--all2all-backend allgather_reducescatter`` and ``--expert-placement-strategy linear``, which name how its
   MoE ranks exchange and place experts; ``--gpu-memory-utilization`` is an engine setting, in
   :class:`~asyncdp.config.engine_config.EngineConfig`);
2. accepted without effect, because asyncdp already behaves as the flag asks (no CUDA graphs: ``--enforce-eager``;
   prefills always chunked: ``--enable-chunked-prefill``; never downloads: ``--download-dir``, ``--revision``), or
   because what the flag changes is never an output (``--enable-eplb``: no expert is moved or replicated;
   ``--enable-dbo``: no microbatches; ...);
3. refused with exit 2 for a value that would change what asyncdp computes or needs machinery it lacks
   (``--quantization fp8``, ``--kv-cache-dtype fp8``, ``--cpu-offload-gb 4``, ``--no-enable-chunked-prefill``,
   ``--all2all-backend deepep_low_latency``, ``--kv-transfer-config`` with a connector, ...):
   :meth:`VllmFlags.unsupported_reason` says which and what to change, in the form of :func:`asyncdp.cli.
   unsupported_reason` ("<what> is not supported in this build yet; <what to change>").

:class:`VllmFlags` holds their values (``ServeConfig.vllm``); :meth:`VllmFlags.validate` checks ranges and choices
(exit 2 with "must be"; the JSON flags: :mod:`asyncdp.config.vllm_json_flags`), and :meth:`VllmFlags.check_eplb`
vLLM's rules between the EPLB flags and expert parallelism. None of them is part of the configuration summary the
ranks and launches compare (:mod:`asyncdp.config.summary`): a refused value never starts, and an accepted one changes
nothing a peer sees. That holds for ``--all2all-backend`` too: the only value accepted, ``allgather_reducescatter``,
names the exchange asyncdp's MoE ranks run without expert parallelism, and it is refused with it, so what the group
runs follows from ``--enable-expert-parallel`` alone, which is compared.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from asyncdp.config.generation_config import GenerationDefaults, parse_override
from asyncdp.config.vllm_json_flags import check_json_flags, eplb_settings, json_flags_refusal
from asyncdp.errors import ConfigError

# vLLM's --max-logprobs default (-1: no cap but the vocabulary's size).
DEFAULT_MAX_LOGPROBS = 20
UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
TOKENIZER_MODES = ("auto", "hf", "slow", "mistral", "custom")
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
DISTRIBUTED_EXECUTOR_BACKENDS = ("ray", "mp", "uni", "external_launcher")
# vLLM's All2AllBackend (vllm/config/parallel.py), sorted as its --help lists them. naive and pplx are removed there:
# vLLM runs allgather_reducescatter instead, with a warning, and so does asyncdp.
ALL2ALL_BACKENDS = ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
                    "flashinfer_all2allv", "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided",
                    "mori_high_throughput", "mori_low_latency", "naive", "nixl_ep", "pplx")
_ALL_GATHER = ("allgather_reducescatter", "naive", "pplx")
EXPERT_PLACEMENT_STRATEGIES = ("linear", "round_robin")
# The values of the choice flags that change nothing here (any other is refused: group 3).
_HONOURED = {"tokenizer_mode": ("auto", "hf"), "kv_cache_dtype": ("auto",), "load_format": ("auto", "safetensors"),
             "distributed_executor_backend": (None, "mp", "uni")}


def _is_compilation_config(raw: str) -> bool:
    """``--compilation-config`` / ``-O``: a JSON object, or an optimization level 0..3 (``-O3``)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return False
    return isinstance(value, dict) or (type(value) is int and 0 <= value <= 3)


def human_readable_int(raw: str) -> int:
    """vLLM's form of token and byte counts: ``2048``, ``2k`` (2000), ``2K`` (2048), ``1.5m``, ``32G``."""
    text = raw.strip()
    units = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    number, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1)
    try:
        return int(number) * unit if unit == 1 or text[-1].isupper() else int(float(number) * unit)
    except ValueError:  # (argparse puts the flag's name before it)
        raise argparse.ArgumentTypeError(f"{raw!r} is not a count such as 2048, 2k (2000) or 2K (2048)") from None


@dataclass(frozen=True, slots=True)
class VllmFlags:
    """The values of the carried-over flags (``ServeConfig.vllm``); each default is vLLM's."""

    # group 1: honoured
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # the most logprobs, top_logprobs, prompt_logprobs a request may ask
    uvicorn_log_level: str | None = None  # the API servers' HTTP log (logger asyncdp.http); None: --log-level's
    enable_log_requests: bool = False  # one INFO line per prompt of each request accepted
    max_log_len: int | None = None  # the most prompt token ids that line shows (None: all)
    generation_config: str = "auto"  # "auto" (the model's generation_config.json), "vllm" (none) or a folder
    override_generation_config: str = "{}"  # a JSON object of generation_config.json fields, as given
    # not a flag: the sampling defaults the two above give, which the cli resolves (asyncdp.config.generation_config)
    generation_defaults: GenerationDefaults = GenerationDefaults()
    trust_remote_code: bool = False  # asyncdp runs no checkpoint code either way
    enable_log_outputs: bool = False  # with --enable-log-requests: one INFO line per choice generated
    # None: asyncdp's own exchange (all-to-all with expert parallelism, all-gather/reduce-scatter without)
    all2all_backend: str | None = None
    expert_placement_strategy: str = "linear"  # honoured with expert parallelism (contiguous expert blocks)
    # group 2: accepted, asyncdp already does what they ask (group 3 for the values _HONOURED leaves out)
    enforce_eager: bool = False
    enable_chunked_prefill: bool | None = None
    max_seq_len_to_capture: int = 8192
    compilation_config: str = "{}"  # the JSON text (or level) as given
    async_scheduling: bool = False
    swap_space: float = 4.0
    distributed_executor_backend: str | None = None
    tokenizer_mode: str = "auto"
    kv_cache_dtype: str = "auto"
    load_format: str = "auto"
    download_dir: str | None = None
    cpu_offload_gb: float = 0.0
    calculate_kv_scales: bool = False
    quantization: str | None = None
    disable_log_stats: bool = False
    disable_log_requests: bool | None = None  # deprecated in vLLM, where it no longer does anything either
    disable_uvicorn_access_log: bool = False
    disable_custom_all_reduce: bool = False
    enable_eplb: bool = False  # no expert is moved or replicated
    eplb_config: str = "{}"  # the JSON text as given (asyncdp.config.vllm_json_flags.EPLB_FIELDS)
    enable_dbo: bool = False  # each step runs as one batch
    dbo_decode_token_threshold: int = 32
    dbo_prefill_token_threshold: int = 512
    revision: str | None = None  # the model is a local directory or a built-in: vLLM ignores a revision there too
    code_revision: str | None = None
    tokenizer_revision: str | None = None
    max_cudagraph_capture_size: int | None = None
    cudagraph_capture_sizes: tuple[int, ...] | None = None  # (--cuda-graph-sizes too)
    disable_cascade_attn: bool = False  # asyncdp has no cascade attention
    # accepted where they ask for nothing asyncdp lacks, refused otherwise (asyncdp.config.vllm_json_flags)
    hf_overrides: str = "{}"
    kv_transfer_config: str | None = None
    kv_events_config: str | None = None
    limit_mm_per_prompt: str = "{}"

    def __post_init__(self) -> None:
        if isinstance(self.cudagraph_capture_sizes, list):  # (argparse's nargs)
            object.__setattr__(self, "cudagraph_capture_sizes", tuple(self.cudagraph_capture_sizes))

    def validate(self) -> VllmFlags:
        """Ranges and choices, as vLLM checks them (a ConfigError naming the flag)."""

        def need(cond: bool, flag: str, allowed: str, value: object) -> None:
            if not cond:
                raise ConfigError(f"{flag} must be {allowed} (got {value!r}).")

        need(self.max_logprobs >= -1, "--max-logprobs", "-1 (no limit) or >= 0", self.max_logprobs)
        need(self.max_log_len is None or self.max_log_len >= 0, "--max-log-len", ">= 0", self.max_log_len)
        for flag, value, choices in (("--uvicorn-log-level", self.uvicorn_log_level, (None, *UVICORN_LOG_LEVELS)),
                                     ("--tokenizer-mode", self.tokenizer_mode, TOKENIZER_MODES),
                                     ("--kv-cache-dtype", self.kv_cache_dtype, KV_CACHE_DTYPES),
                                     ("--distributed-executor-backend", self.distributed_executor_backend,
                                      (None, *DISTRIBUTED_EXECUTOR_BACKENDS)),
                                     ("--all2all-backend", self.all2all_backend, (None, *ALL2ALL_BACKENDS)),
                                     ("--expert-placement-strategy", self.expert_placement_strategy,
                                      EXPERT_PLACEMENT_STRATEGIES)):
            need(value in choices, flag, "one of " + ", ".join(c for c in choices if c), value)
        need(self.swap_space >= 0, "--swap-space", ">= 0 (GiB)", self.swap_space)
        need(self.cpu_offload_gb >= 0, "--cpu-offload-gb", ">= 0 (GiB)", self.cpu_offload_gb)
        need(_is_compilation_config(self.compilation_config), "--compilation-config (-O)",
             "a JSON object such as '{\"level\": 3}' or an optimization level 0..3", self.compilation_config)
        for flag, threshold in (("--dbo-decode-token-threshold", self.dbo_decode_token_threshold),
                                ("--dbo-prefill-token-threshold", self.dbo_prefill_token_threshold)):
            need(threshold >= 0, flag, ">= 0", threshold)
        parse_override(self.override_generation_config)
        check_json_flags(eplb_config=self.eplb_config, hf_overrides=self.hf_overrides,
                         kv_transfer_config=self.kv_transfer_config, kv_events_config=self.kv_events_config,
                         limit_mm_per_prompt=self.limit_mm_per_prompt)
        return self

    def check_eplb(self, *, enable_expert_parallel: bool, ep_size: int) -> None:
        """vLLM's rules between the EPLB flags and expert parallelism (ParallelConfig's checks), as given."""
        redundant = eplb_settings(self.eplb_config).get("num_redundant_experts", 0)
        if self.enable_eplb and not enable_expert_parallel:
            raise ConfigError("--enable-eplb needs --enable-expert-parallel, as in vLLM.")
        if self.enable_eplb and ep_size <= 1:
            raise ConfigError(f"--enable-eplb needs more than one expert-parallel rank (dp x tp = {ep_size}), "
                              f"as in vLLM.")
        if redundant and not self.enable_eplb:
            raise ConfigError(f"--eplb-config's num_redundant_experts ({redundant}) needs --enable-eplb, as in vLLM.")

    def notices(self, *, expert_parallel: bool) -> tuple[str, ...]:
        """What startup says once about these flags (vLLM's warnings), for values it runs."""
        if self.all2all_backend in ("naive", "pplx") and not expert_parallel:
            return (f"The '{self.all2all_backend}' all2all backend has been removed. Falling back to "
                    f"'allgather_reducescatter'.",)
        return ()

    def override(self) -> dict[str, Any]:
        """``--override-generation-config``'s object (checked by :meth:`validate`)."""
        return parse_override(self.override_generation_config)

    def unsupported_reason(self, *, expert_parallel: bool = False) -> str | None:
        """Group 3: the first flag whose value this build cannot honour, in the house form, or None.
        ``expert_parallel``: the MoE model's experts are split across the ranks (the effective
        ``--enable-expert-parallel``)."""
        if self.enable_chunked_prefill is False:
            return ("--no-enable-chunked-prefill is not supported in this build yet; asyncdp always splits long "
                    "prompts into chunks of --max-num-batched-tokens: drop --no-enable-chunked-prefill")
        if self.quantization is not None:
            return (f"--quantization {self.quantization} is not supported in this build yet; asyncdp runs the "
                    f"checkpoint's unquantized weights: drop --quantization")
        for name, why in (("kv_cache_dtype", "the KV cache takes the model's dtype"),
                          ("tokenizer_mode", "asyncdp loads the checkpoint's fast tokenizer (tokenizer.json)"),
                          ("load_format", "asyncdp loads the checkpoint's safetensors weights"),
                          ("distributed_executor_backend", "each data-parallel rank runs in its own process on "
                                                           "one device")):
            value, honoured = getattr(self, name), _HONOURED[name]
            if value not in honoured:
                flag = "--" + name.replace("_", "-")
                allowed = " or ".join(str(v) for v in honoured if v is not None)
                return (f"{flag} {value} is not supported in this build yet; {why}: drop {flag} "
                        f"(or pass {allowed})")
        if self.cpu_offload_gb > 0:
            return (f"--cpu-offload-gb {self.cpu_offload_gb:g} is not supported in this build yet; the weights stay "
                    f"on the device: drop --cpu-offload-gb (or pass 0)")
        return self._expert_refusal(expert_parallel) or json_flags_refusal(
            hf_overrides=self.hf_overrides, kv_transfer_config=self.kv_transfer_config,
            kv_events_config=self.kv_events_config, limit_mm_per_prompt=self.limit_mm_per_prompt)

    def _expert_refusal(self, expert_parallel: bool) -> str | None:
        """How the MoE ranks exchange tokens and place experts: only as asyncdp's collectives do."""
        backend = self.all2all_backend
        if backend is not None and backend not in _ALL_GATHER:
            return (f"--all2all-backend {backend} is not supported in this build yet; asyncdp's MoE ranks exchange "
                    f"tokens with torch.distributed collectives, not that library's kernels: drop --all2all-backend")
        if not expert_parallel:  # (experts split by their intermediate size: all-gather in, reduce-scatter out)
            return None
        if backend is not None:
            return (f"--all2all-backend {backend} with --enable-expert-parallel is not supported in this build yet; "
                    f"asyncdp's expert-parallel ranks send each token to its experts' ranks with an all-to-all "
                    f"(torch.distributed all_to_all_single), not an all-gather: drop --all2all-backend")
        if self.expert_placement_strategy != "linear":
            return (f"--expert-placement-strategy {self.expert_placement_strategy} is not supported in this build "
                    f"yet; each expert-parallel rank holds a contiguous block of experts: drop "
                    f"--expert-placement-strategy (or pass linear)")
        return None

