"""The ten workload generators of spec routing-bench §4, by name.

``WORKLOADS[name](scale, seed, options) -> Workload``; ``scale`` is ``quick`` (CI: dp 4), ``full`` (dp 8, the
reference) or ``dp32`` (scale-out, where the spec defines one); ``options`` are the generator's knobs (its
module docstring lists them), and ``preset`` selects a named variant. :func:`build` also takes
``"name@preset"``, and :func:`label` names such a workload in ``bench routing``'s report. Every generator is
deterministic per seed: the same arguments give byte-identical JSONL.

| name | module | what |
|---|---|---|
| w1 | w1_gsp | SGLang generated shared prefix (groups × prompts on a system prompt) |
| w2 | w2_llmd | llm-d shared prefix, 73 % working set, QPS stages |
| w3 | w3_prefix_repetition | vLLM prefix repetition; ``@ray_scaling`` |
| w4 | w4_multiturn | SGLang multi-turn chat, dispatcher at a rate sweep; ``@pressure`` |
| w5 | w5_multiround_qa | production-stack multi-round QA with ramp-up |
| w6 | w6_sharegpt | ShareGPT-like lengths, little sharing |
| w7 | w7_longdoc | long documents by Zipf popularity |
| w8 | w8_token_skew | 2 % 55 k-token prompts; ``@pure_long``, ``@32k_in_1_out`` |
| w9 | w9_bursty | bursty closed loop, ISL = OSL; ``@onoff`` |
| w10 | w10_mooncake | Mooncake-style agent sessions; ``@toolagent`` (default), ``@conversation`` |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from asyncdp.bench.records import Workload
from asyncdp.bench.workloads import (
    w1_gsp,
    w2_llmd,
    w3_prefix_repetition,
    w4_multiturn,
    w5_multiround_qa,
    w6_sharegpt,
    w7_longdoc,
    w8_token_skew,
    w9_bursty,
    w10_mooncake,
)
from asyncdp.bench.workloads.common import SCALES
from asyncdp.errors import ConfigError

Generator = Callable[[str, int, Mapping[str, Any] | None], Workload]

WORKLOADS: dict[str, Generator] = {
    "w1": w1_gsp.generate,
    "w2": w2_llmd.generate,
    "w3": w3_prefix_repetition.generate,
    "w4": w4_multiturn.generate,
    "w5": w5_multiround_qa.generate,
    "w6": w6_sharegpt.generate,
    "w7": w7_longdoc.generate,
    "w8": w8_token_skew.generate,
    "w9": w9_bursty.generate,
    "w10": w10_mooncake.generate,
}


def build(spec: str, scale: str = "quick", seed: int = 1, options: Mapping[str, Any] | None = None) -> Workload:
    """Generate ``spec`` (``name`` or ``name@preset``) at ``scale`` with ``seed`` and ``options``."""
    name, _, preset = spec.partition("@")
    generator = WORKLOADS.get(name.lower())
    if generator is None:
        raise ConfigError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}.")
    opts = dict(options or {})
    if preset:
        if opts.get("preset", preset) != preset:
            raise ConfigError(f"workload {spec!r}: preset given twice ({preset!r} and {opts['preset']!r}).")
        opts["preset"] = preset
    return generator(scale, seed, opts)


def label(spec: str, options: Mapping[str, Any] | None = None) -> str:
    """How ``bench routing`` names the workload ``spec`` that :func:`build` makes with ``options``: the generator's
    name and the preset given, as ``@preset`` or as option ``preset`` (``w8@pure_long``; ``w8`` without one). The
    other options are not part of it (the report shows them beside it)."""
    name, _, preset = spec.partition("@")
    preset = preset or str((options or {}).get("preset", ""))
    return f"{name.lower()}@{preset}" if preset else name.lower()


__all__ = ["SCALES", "WORKLOADS", "Generator", "build", "label"]
