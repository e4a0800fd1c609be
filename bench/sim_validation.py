"""The simulator against a real server: one workload, predicted vs measured TTFT (issue 10 item 5, validation).

The same resolved workload (default: the tiny shared-prefix W1 of ``bench/routing_real.py``; ``--workload``,
``--options``, ``--trace`` choose another) is run twice per policy (``--policies``, default ``vllm,asyncdp``):

* **predicted**: :func:`asyncdp.bench.simulate.simulate` with ``ClusterSpec(2, load_profile(--profile))``, the
  calibrated CPU profile of tiny-dense (``bench/profiles/cpu_tiny_dense.json``, written by ``asyncdp bench
  calibrate``): the production coordinator, rank loop, scheduler and block manager, the ``sim`` executor's cost
  model in place of the model, virtual time;
* **measured**: a real ``asyncdp serve builtin:tiny-dense -dp 2 --lb-policy POLICY`` on CPU with the profile's
  capacities (KV blocks unless the workload sets them, ``--max-num-seqs``, ``--max-num-batched-tokens``) and its
  torch thread count, replayed over HTTP at wall-clock send times by ``bench/http_replay.py``.

It prints TTFT mean/p50/p90/p99, TPOT mean, e2e p99 and the prefix hit rate side by side with measured/predicted,
then each policy's TTFT over the first policy's on both sides (does the simulator rank the policies as the
server does?), then what the two do not model alike. Nothing is asserted. ``--json OUT`` writes both metric sets.

    PYTHONPATH=$PWD .venv/bin/python bench/sim_validation.py [--profile FILE] [--policies vllm,asyncdp]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from asyncdp.bench import metrics  # noqa: E402
from asyncdp.bench.profiles import Profile, load_profile, profile_hash  # noqa: E402
from asyncdp.bench.records import Workload  # noqa: E402
from asyncdp.bench.runner import Runner  # noqa: E402
from asyncdp.bench.simulate import ClusterSpec  # noqa: E402
from asyncdp.errors import ConfigError  # noqa: E402
from bench.http_replay import (  # noqa: E402
    add_workload_args,
    checked_workload,
    describe,
    serve_and_replay,
)
from bench.serving import policy_list, positive_int, run_cli  # noqa: E402

DEFAULT_PROFILE = Path(__file__).resolve().parent / "profiles" / "cpu_tiny_dense.json"
KEYS = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "e2e_p99_s", "prefix_hit_rate")

DIFFERENCES = """\
Where the simulator and the real server differ in what they model:
- HTTP and JSON: the real client sends each prompt as a JSON list of token ids and reads one SSE chunk per token;
  the API server parses, validates and renders them. The simulator's router calls DPClient.generate directly,
  with a fixed 0.2 ms dispatch and 0.2 ms return latency (spec section 5).
- Tokenization: none on either side for token-id prompts, but the real server detokenizes every output token
  (byte-level) and builds one chunk per token; the simulator emits token ids only.
- Processes and CPU: the real deployment is an API-server process, a coordinator and two engine processes plus
  this load generator on a shared 2-core machine, so engine steps compete for cores with each other and with
  the HTTP path; the profile was fitted on one engine stepping alone. The simulator gives every rank its own
  dedicated device and costs no CPU for the API process.
- Step time: the simulator charges a + b*P + c*D + d*K (+ e*sum p*(c0 + p/2) when the profile has e, the
  prefill attention that grows faster than linearly on CPU) per step exactly: no noise, no Python or allocator
  variance, and a fixed part a that the fit may have clamped to 0 (then short steps, e.g. a few decodes, cost
  less than on the engine, and TPOT is underpredicted). The profile's r2 and max relative error above say how
  far the fit is from its own sweep.
- Telemetry: both run the real coordinator (vllm_coord: 100 ms snapshots) and the real policy code; the real
  snapshots travel over sockets and can arrive later under CPU contention.
- Clock: the simulator sends at exact virtual times; the real load generator sends at wall-clock times and can
  fall behind (the max send lag printed per policy says by how much)."""


def profile_caps(path: Path) -> tuple[Profile, dict[str, object]]:
    profile = load_profile(str(path))
    meta = json.loads(path.read_text())
    return profile, meta


def predicted(workload: Workload, policy: str, seed: int, profile: Profile) -> dict[str, float]:
    """The simulator's metrics, from a run in a process of its own (:mod:`asyncdp.bench.runner`: so it does not
    depend on what ran in this process before)."""
    with Runner(1) as runner:
        log = runner.run(workload, policy, seed, ClusterSpec(workload.dp_size, profile))
    return metrics.compute(log)


def side_by_side(pred: dict[str, float], meas: dict[str, float], keys: tuple[str, ...] = KEYS) -> str:
    lines = [f"{'metric':<16}{'predicted (sim)':>17}{'measured (real)':>17}{'measured/predicted':>20}"]
    for k in keys:
        ratio = meas[k] / pred[k] if pred[k] else math.nan
        lines.append(f"{k:<16}{pred[k]:>17.4f}{meas[k]:>17.4f}{ratio:>20.2f}")
    return "\n".join(lines)


def policy_ratios(out: dict[str, dict[str, dict[str, float]]]) -> str:
    """Whether the simulator ranks the policies as the server does: each policy's metric over the first's, in the
    simulator and on the server."""
    base = next(iter(out))
    lines = [f"\npolicies over {base}, predicted vs measured (does the simulator order them right?):",
             f"{'policy':<14}" + "".join(f"{k:>24}" for k in KEYS[:3])]
    for policy, sides in out.items():
        cells = []
        for k in KEYS[:3]:
            p, m = (sides[s][k] / out[base][s][k] if out[base][s][k] else math.nan for s in ("predicted", "measured"))
            cells.append(f"{f'{p:.2f} vs {m:.2f}':>24}")
        lines.append(f"{policy:<14}" + "".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE, help="calibrated cost profile (JSON)")
    ap.add_argument("--policies", type=policy_list, default="vllm,asyncdp",
                    help="comma-separated load-balancing policies; the first is the base of the policy ratios")
    ap.add_argument("--torch-threads", type=positive_int, default=None,
                    help="torch threads per engine (default: the profile's 'threads', else 1)")
    add_workload_args(ap)
    args = ap.parse_args(argv)
    # Every argument is checked here, before the first simulation or server: a bad one is a usage error (exit 2).
    if not args.profile.is_file():
        ap.error(f"no profile at {args.profile}: run `asyncdp bench calibrate --output {args.profile}` first, "
                 "or pass --profile FILE")
    try:
        profile, meta = profile_caps(args.profile)
        threads = args.torch_threads or int(str(meta.get("threads", 1)))
    except (ConfigError, ValueError) as exc:
        ap.error(f"--profile {args.profile}: {exc}")
    workload = checked_workload(ap, args)
    print(describe(workload))
    print(f"profile {args.profile} ({profile.name}, hash {profile_hash(profile)}): a={profile.a_ms} ms, "
          f"b={profile.b_ms_per_token} ms/token, c={profile.c_ms_per_seq} ms/seq, d={profile.d_ms_per_kv_token} "
          f"ms/KV token, e={profile.e_ms_per_token_pair} ms/token pair; fit r2={meta.get('r2')}, max rel error={meta.get('max_rel_error')}; "
          f"{threads} torch thread(s) per engine", flush=True)
    out: dict[str, dict[str, dict[str, float]]] = {}
    failed = 0
    for policy in args.policies:
        t = time.monotonic()
        pred = predicted(workload, policy, args.seed, profile)
        print(f"[{policy}] simulated in {time.monotonic() - t:.1f} s", file=sys.stderr, flush=True)
        caps = (profile.kv_blocks, profile.max_num_seqs, profile.max_num_batched_tokens)
        rep = serve_and_replay(policy, workload, args, ["--torch-threads", str(threads)], caps)
        meas = rep.metrics()
        failed += int(meas["failed"])
        out[policy] = {"predicted": pred, "measured": meas}
        print(f"\npolicy {policy}: {meas['completed']:.0f} completed, {meas['failed']:.0f} failed, "
              f"max send lag {meas['max_send_lag_s'] * 1e3:.1f} ms, load average {meas['load_1m']:.2f} (2 cores)")
        print(side_by_side(pred, meas))
    if len(out) > 1:
        print(policy_ratios(out))
    print()
    print(DIFFERENCES)
    if args.json:
        Path(args.json).write_text(json.dumps({"profile": str(args.profile), "profile_hash": profile_hash(profile),
                                               "workload": workload.name, "options": workload.options,
                                               "policies": out}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    run_cli(main)
