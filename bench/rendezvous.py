"""What sealing the MoE group's rendezvous store costs: per value, per group join, and on a deployment's startup.

* ``ops``: in this process, the sealed store's work per torch key and value (a name, a seal, an unseal of a
  170-byte gloo address record) and the key derivation, in µs.
* ``joins``: two real rank processes join ``--joins`` gloo groups (``init_dp_group``: the default group, the
  control group, one all-reduce), each at its own store hosted here, alternately through the plain store and the
  sealed one: the median and p90 of the slower rank's time per join, in ms.
* ``startup``: ``asyncdp serve builtin:tiny-moe -dp 2 --enable-expert-parallel`` (torch executor, one thread per
  engine) started ``--startups`` times from this tree and, with ``--baseline DIR`` (a checkout of the tree before
  the sealed store: ``git archive 83623a1 | tar -x -C DIR``), as many times from that one, alternately: the
  launcher's "startup took" figure.

It prints a table and writes JSON.

    python bench/rendezvous.py --joins 200 --startups 4 --baseline /tmp/asyncdp-before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from asyncdp.bench.metrics import percentile  # noqa: E402
from bench.serving import (  # noqa: E402
    baseline_trees,
    check_output,
    measure_startup,
    non_negative_int,
    run_cli,
)

MODEL = "builtin:tiny-moe"
RECORD_BYTES = 170  # one gloo pair-address record


def measure_ops() -> dict[str, float]:
    from asyncdp.messages import LAUNCH_NONCE_BYTES, DPGroupInfo
    from asyncdp.model.rendezvous import derive_keys, seal, store_key, unseal

    info = DPGroupInfo(master_addr="127.0.0.1", master_port=29500, dp_size=2, backend="gloo",
                       launch_nonce=os.urandom(LAUNCH_NONCE_BYTES))
    secret = os.urandom(32)
    keys = derive_keys(secret, info)
    name = store_key(keys, "0//cpu//0/1")
    value = os.urandom(RECORD_BYTES)
    blob = seal(keys, name, value)
    cases = {"derive keys": lambda: derive_keys(secret, info), "name": lambda: store_key(keys, "0//cpu//0/1"),
             "seal": lambda: seal(keys, name, value), "unseal": lambda: unseal(keys, name, blob)}
    return {what: min(timeit.repeat(fn, number=2000, repeat=5)) / 2000 * 1e6 for what, fn in cases.items()}


def rank_main(ports: list[int], dp_rank: int, secret: bytes, launch_nonce: bytes, modes: list[str]) -> None:
    """One rank: join a group at each port (sealed or plain, as ``modes`` says), time it, leave it."""
    import torch
    import torch.distributed as dist

    from asyncdp.messages import DPGroupInfo
    from asyncdp.model.distributed import init_dp_group

    torch.set_num_threads(1)
    times = []
    for port, mode in zip(ports, modes, strict=True):
        info = DPGroupInfo(master_addr="127.0.0.1", master_port=port, dp_size=2, backend="gloo",
                           launch_nonce=launch_nonce)
        t0 = time.perf_counter()
        group = init_dp_group(info, dp_rank, timeout_s=60.0, secret=secret if mode == "sealed" else None)
        dist.all_reduce(torch.ones(1), group=group.control)
        times.append(time.perf_counter() - t0)
        group.destroy()
    print(json.dumps(times))


def measure_joins(n: int) -> dict[str, dict[str, float]]:
    from asyncdp.messages import LAUNCH_NONCE_BYTES
    from asyncdp.model.distributed import host_rendezvous_store

    stores = [host_rendezvous_store("127.0.0.1", timeout_s=60.0) for _ in range(n)]
    ports = [port for _, port in stores]
    modes = ["plain" if i % 2 == 0 else "sealed" for i in range(n)]
    setup = json.dumps({"ports": ports, "secret": os.urandom(32).hex(),
                        "launch_nonce": os.urandom(LAUNCH_NONCE_BYTES).hex(), "modes": modes})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), setup], stdout=subprocess.PIPE, text=True,
                              env=env) for r in range(2)]
    per_rank = [json.loads(proc.communicate(timeout=600)[0]) for proc in procs]
    out = {}
    for mode in ("plain", "sealed"):
        ms = sorted(max(a, b) * 1000 for a, b, m in zip(*per_rank, modes, strict=True) if m == mode)
        out[mode] = {"joins": len(ms), "p50_ms": statistics.median(ms), "p90_ms": percentile(ms, 0.9)}
    return out


def startup_figures(trees: dict[str, Path], n: int) -> dict[str, dict[str, Any]]:
    """The MoE ``-dp 2`` deployment started ``n`` times from each tree: the launcher's "startup took" seconds."""
    runs = measure_startup(trees, n, MODEL, "-dp", "2", "--enable-expert-parallel", "--api-server-count", "1",
                           "--max-model-len", "512", "--executor", "torch")
    took = {name: [t for _, t in v] for name, v in runs.items()}
    return {name: {"startup_took_s": v, "median_s": statistics.median(v)} for name, v in took.items()}


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--rank":
        setup = json.loads(sys.argv[3])
        rank_main(setup["ports"], int(sys.argv[2]), bytes.fromhex(setup["secret"]),
                  bytes.fromhex(setup["launch_nonce"]), setup["modes"])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--joins", type=non_negative_int, default=100, help="group joins, half plain, half sealed")
    parser.add_argument("--startups", type=non_negative_int, default=0, help="startups per tree (0: none)")
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout without the sealed store")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "rendezvous.json")
    args = parser.parse_args()
    check_output(parser, "--json", args.json)
    trees = baseline_trees(parser, args.baseline)
    ops = measure_ops()
    print(f"{'per value':<14} {'µs':>6}")
    for what, us in ops.items():
        print(f"{what:<14} {us:>6.1f}")
    joins = measure_joins(args.joins) if args.joins >= 2 else {}
    if joins:
        print(f"\n{'group join':<8} {'joins':>6} {'p50 ms':>8} {'p90 ms':>8}")
        for mode, r in joins.items():
            print(f"{mode:<8} {r['joins']:>6} {r['p50_ms']:>8.2f} {r['p90_ms']:>8.2f}")
    startup = startup_figures(trees, args.startups) if args.startups else {}
    if startup:
        print(f"\n{'MoE -dp 2':<12} {'startup took (s), each run':<44} {'median':>7}")
        for name, run in startup.items():
            print(f"{name:<12} {', '.join(f'{x:.1f}' for x in run['startup_took_s']):<44} {run['median_s']:>7.1f}")
    args.json.write_text(json.dumps({"ops_us": ops, "joins": joins, "startup": startup,
                                     "baseline": str(args.baseline)}, indent=2))
    return 0


if __name__ == "__main__":
    run_cli(main)
