"""W3: prefix repetition (vLLM ``benchmark_serving --dataset-name prefix_repetition``), spec §4 W3.

``num_prefixes`` prefixes of ``prefix_len`` tokens, each followed by a unique suffix of ``suffix_len``; there are
``num_requests // num_prefixes`` prompts per prefix and the order is shuffled. Default: 10 prefixes, 256/256,
output 128; 1 000 requests full, 200 quick. Arrival: burst (vLLM's ``--request-rate inf``) unless ``arrival``.

``preset=ray_scaling`` [secondary lengths; scaling rule ours]: prefix 512, suffix 128, output 128,
``num_prefixes = 16·dp``, 8 prompts per prefix, 2 048 blocks per rank, for dp in {4, 8, 16, 32, 64} (option
``dp``; default 4 quick, 8 full, 32 dp32). One rank then holds about 4/dp of the prefix set.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncdp.bench.records import Workload
from asyncdp.bench.workloads.common import Builder, Options, arrival_options, check_scale, open_loop, stream

_DP = {"quick": 4, "full": 8, "dp32": 32}


def generate(scale: str, seed: int, options: Mapping[str, Any] | None = None) -> Workload:
    opts = Options("w3", options, scale)
    preset = opts.choice("preset", "default", ("default", "ray_scaling"))
    ray = preset == "ray_scaling"
    check_scale("w3", scale, tuple(_DP) if ray else ("quick", "full"))
    dp = opts.get("dp", _DP[scale], least=1)
    if ray:
        n_prefixes = opts.get("num_prefixes", 16 * dp, least=1)
        n_requests = opts.get("num_requests", 8 * n_prefixes)
    else:
        n_prefixes = opts.get("num_prefixes", 10, least=1)
        n_requests = opts.get("num_requests", 1000 if scale == "full" else 200)
    prefix_len = opts.get("prefix_len", 512 if ray else 256)
    suffix_len = opts.get("suffix_len", 128 if ray else 256)
    output_len = opts.get("output_len", 128, least=1)
    mode, rate = arrival_options(opts, "burst", 16.0)
    opts.expect_requests(n_requests, f"num_requests={n_requests}")
    opts.check()

    per_prefix = n_requests // n_prefixes
    order = [(k, i) for k in range(n_prefixes) for i in range(per_prefix)] if per_prefix else []
    stream(seed, "w3").shuffle(order)
    times, arrival = open_loop(len(order), mode, rate, stream(seed, "w3/arrivals"))
    b = Builder()
    for (k, i), t in zip(order, times, strict=True):
        b.add(segments=[(f"w3/prefix/{k}", prefix_len), (f"w3/suffix/{k}/{i}", suffix_len)],
              output_length=output_len, group=f"p{k}", t_arrival_ms=t, client=i)
    return b.build(name="w3", scale=scale, seed=seed, options=opts, arrival=arrival, dp_size=dp,
                   kv_blocks_per_rank=2048 if ray else None)
