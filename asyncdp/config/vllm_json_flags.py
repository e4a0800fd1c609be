"""The JSON-valued ``vllm serve`` flags that carry over (docs/reference/cli.md, "vLLM flags that carry over"):
``--eplb-config``, ``--hf-overrides``, ``--kv-transfer-config``, ``--kv-events-config`` and
``--limit-mm-per-prompt``. Pure.

Each takes a JSON object, kept as its text in :class:`~asyncdp.config.vllm_flags.VllmFlags`. :func:`check_json_flags`
parses them and raises a ConfigError naming what a malformed one must be (exit 2), as vLLM's own parsing refuses it;
:func:`json_flags_refusal` names the first value this build cannot honour, in the house form. ``--eplb-config`` is
always accepted (asyncdp moves and replicates no experts: the outputs are the same by construction); the others
are accepted where they ask for nothing asyncdp lacks: no config overrides (``{}``), no KV connector, no KV cache
events, no media in a prompt (every modality 0).
"""

from __future__ import annotations

import json
from typing import Any

from asyncdp.errors import ConfigError

# vLLM's EPLBConfig (vllm/config/parallel.py): each field and the check of its value; vLLM forbids other keys.
EPLB_FIELDS = {
    "window_size": ("> 0", lambda v: type(v) is int and v > 0),
    "step_interval": ("> 0", lambda v: type(v) is int and v > 0),
    "num_redundant_experts": (">= 0", lambda v: type(v) is int and v >= 0),
    "log_balancedness": ("true or false", lambda v: type(v) is bool),
    "log_balancedness_interval": ("> 0", lambda v: type(v) is int and v > 0),
    "use_async": ("true or false", lambda v: type(v) is bool),
    "policy": ("default", lambda v: v == "default"),
    "communicator": ("torch_nccl, torch_gloo, nixl or pynccl",
                     lambda v: v is None or v in ("torch_nccl", "torch_gloo", "nixl", "pynccl")),
}
_EXAMPLES = {
    "--hf-overrides": '{"rope_theta": 1000000}',
    "--kv-transfer-config": '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}',
    "--kv-events-config": '{"enable_kv_cache_events": false}',
}
_MM_COUNTS = """--limit-mm-per-prompt must be a JSON object of counts such as '{"image": 0, "video": 0}'"""


def json_object(raw: str) -> dict[str, Any] | None:
    """``raw`` as a JSON object, or None when it is not one."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _object(flag: str, raw: str) -> dict[str, Any]:
    value = json_object(raw)
    if value is None:
        raise ConfigError(f"{flag} must be a JSON object such as '{_EXAMPLES[flag]}' (got {raw!r}).")
    return value


def eplb_settings(raw: str) -> dict[str, Any]:
    """``--eplb-config``'s object, every key one of vLLM's :data:`EPLB_FIELDS` with a value in range."""
    value = json_object(raw)
    if value is None or not all(k in EPLB_FIELDS and EPLB_FIELDS[k][1](v) for k, v in value.items()):
        allowed = ", ".join(f"{k} {what}" for k, (what, _) in EPLB_FIELDS.items())
        raise ConfigError(f"--eplb-config must be a JSON object of {allowed} (got {raw!r}).")
    return value


def media_counts(raw: str) -> dict[str, int]:
    """``--limit-mm-per-prompt``'s count per modality: ``{"image": 2}``, or vLLM's ``{"video": {"count": 1, ...}}``."""
    value = json_object(raw)
    counts = {}
    for modality, limit in (value or {}).items():
        count = limit.get("count") if isinstance(limit, dict) else limit
        if type(count) is not int or count < 0:
            value = None
            break
        counts[modality] = count
    if value is None:
        raise ConfigError(f"{_MM_COUNTS} (got {raw!r}).")
    return counts


def check_json_flags(*, eplb_config: str, hf_overrides: str, kv_transfer_config: str | None,
                     kv_events_config: str | None, limit_mm_per_prompt: str) -> None:
    """Each JSON flag is well formed (a ConfigError naming what it must be)."""
    eplb_settings(eplb_config)
    _object("--hf-overrides", hf_overrides)
    for flag, raw in (("--kv-transfer-config", kv_transfer_config), ("--kv-events-config", kv_events_config)):
        if raw is not None:
            _object(flag, raw)
    media_counts(limit_mm_per_prompt)


def json_flags_refusal(*, hf_overrides: str, kv_transfer_config: str | None, kv_events_config: str | None,
                       limit_mm_per_prompt: str) -> str | None:
    """The first JSON flag (checked) whose value this build cannot honour, in the house form, or None."""
    overrides = _object("--hf-overrides", hf_overrides)
    if overrides:
        return (f"--hf-overrides setting {', '.join(overrides)} is not supported in this build yet; asyncdp runs the "
                f"checkpoint's config.json as it is: drop --hf-overrides (or pass {{}})")
    connector = _object("--kv-transfer-config", kv_transfer_config or "{}").get("kv_connector")
    if connector is not None:
        return (f"--kv-transfer-config with kv_connector {connector} is not supported in this build yet; asyncdp has "
                f"no KV connector (disaggregated prefill, KV cache transfer or offloading): drop --kv-transfer-config")
    if _object("--kv-events-config", kv_events_config or "{}").get("enable_kv_cache_events"):
        return ("--kv-events-config with enable_kv_cache_events is not supported in this build yet; asyncdp "
                "publishes no KV cache events: drop --kv-events-config (or set enable_kv_cache_events to false)")
    for modality, count in media_counts(limit_mm_per_prompt).items():
        if count:
            return (f"--limit-mm-per-prompt {modality} {count} is not supported in this build yet; asyncdp serves "
                    f"text-only models, whose prompts hold no media: drop --limit-mm-per-prompt (or give every "
                    f"modality 0)")
    return None
