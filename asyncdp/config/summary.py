"""What must agree across the ranks and launches of one deployment (spec §5.3 ``Ready.config_hash`` and
``config_summary``, ``NodeHello``, E6). Pure.

Every rank (and every launch, in its ``NodeHello``) summarises the settings that must agree with
:func:`parallel_config_summary`; :func:`config_hash` digests a summary; :func:`summary_differences` and
:func:`config_mismatch_message` name the fields where two summaries differ, so a mismatch is reported by field,
not by hash. :func:`model_identity` names a checkpoint the same way on every node.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping

from asyncdp.config.flags import EngineConfig

# Every setting that must agree across MoE lockstep ranks (and, through NodeHello and Hello, across every launch and
# rank of any deployment), in the order E6 reports them. scheduling_policy is beyond spec §5.3's list: the API servers
# check a request's priority against their own launch's --scheduling-policy, the engines schedule (and refuse) by
# theirs, so a head and a node that disagree would accept a request on one side and refuse or reorder it on the other.
CONFIG_SUMMARY_FIELDS = (
    "model", "dtype", "quantization", "dp_size", "tp_size", "pp_size", "enable_expert_parallel", "num_experts",
    "dp_sync_interval", "prefill_schedule_interval", "max_model_len", "block_size", "scheduling_policy",
    "protocol_version",
)

SummaryValue = str | int | bool


def parallel_config_summary(
        engine: EngineConfig, *, model_identity: str, dp_size: int, tp_size: int = 1, pp_size: int = 1,
        enable_expert_parallel: bool, num_experts: int, sync_interval: int, prefill_schedule_interval: int,
        max_model_len: int, protocol_version: int) -> dict[str, SummaryValue]:
    """The readable ``Ready.config_summary`` of one rank; keys are :data:`CONFIG_SUMMARY_FIELDS`, in order.

    ``model_identity`` names the model and its revision (the caller decides how, e.g. a content hash of
    ``config.json`` plus the weight files' names and sizes). ``max_model_len`` is the resolved limit, not the
    flag. dtype, block size and scheduling policy come from ``engine``; quantization is always ``"none"`` in this
    build.
    """
    return {
        "model": str(model_identity),
        "dtype": str(engine.dtype),
        "quantization": "none",
        "dp_size": int(dp_size),
        "tp_size": int(tp_size),
        "pp_size": int(pp_size),
        "enable_expert_parallel": bool(enable_expert_parallel),
        "num_experts": int(num_experts),
        "dp_sync_interval": int(sync_interval),
        "prefill_schedule_interval": int(prefill_schedule_interval),
        "max_model_len": int(max_model_len),
        "block_size": int(engine.block_size),
        "scheduling_policy": str(engine.scheduling_policy),
        "protocol_version": int(protocol_version),
    }


def config_hash(summary: Mapping[str, SummaryValue]) -> str:
    """Stable digest of a summary: BLAKE2b (16 bytes, hex) of its JSON with sorted keys and no spaces.

    Key order, process and Python version do not matter; ``True`` and ``1`` hash differently (JSON keeps them
    apart), so a bool flag can never collide with a count.
    """
    text = json.dumps(dict(summary), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.blake2b(text.encode("ascii"), digest_size=16).hexdigest()


def _show(value: object) -> str:
    if isinstance(value, str) and value and not any(ch.isspace() or ch == "," for ch in value):
        return value
    return repr(value)  # quote what would be ambiguous in a comma-separated list


def summary_differences(summary: Mapping[str, SummaryValue], reference: Mapping[str, SummaryValue]) -> list[str]:
    """``<field>=<a> vs <b>`` for every field where ``summary`` (a) differs from ``reference`` (b): known fields in
    :data:`CONFIG_SUMMARY_FIELDS` order, then unknown ones sorted; a field one side lacks shows ``<missing>``."""
    missing = object()
    extra = sorted((set(summary) | set(reference)) - set(CONFIG_SUMMARY_FIELDS))
    diffs = []
    for name in (*CONFIG_SUMMARY_FIELDS, *extra):
        a, b = summary.get(name, missing), reference.get(name, missing)
        # type() too: 1 and True compare equal in Python but not in the hash
        if a is missing and b is missing or (a == b and type(a) is type(b)):
            continue
        diffs.append(f"{name}={'<missing>' if a is missing else _show(a)} vs "
                     f"{'<missing>' if b is missing else _show(b)}")
    return diffs


def config_mismatch_message(dp_rank: int, summary: Mapping[str, SummaryValue],
                            rank0_summary: Mapping[str, SummaryValue]) -> str:
    """E6: ``configuration mismatch: engine rank r differs from rank 0 in <field>=<a> vs <b>, ...``.

    ``<a>`` is rank ``dp_rank``'s value, ``<b>`` rank 0's (see :func:`summary_differences`).
    """
    diffs = summary_differences(summary, rank0_summary)
    head = f"configuration mismatch: engine rank {dp_rank} differs from rank 0"
    if not diffs:
        return f"{head} in config_hash only (the summaries are equal; the ranks hash them differently)"
    return f"{head} in {', '.join(diffs)}"


def model_identity(model_path: str) -> str:
    """The model's name and revision for the configuration summary: its folder's name and a digest of its
    ``config.json`` (every node computes the same value for the same checkpoint)."""
    with open(os.path.join(model_path, "config.json"), "rb") as f:
        digest = hashlib.blake2b(f.read(), digest_size=8).hexdigest()
    return f"{os.path.basename(os.path.normpath(model_path))}@{digest}"
