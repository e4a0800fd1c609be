"""What each process of a deployment costs: the startup of ``asyncdp serve MODEL -dp 2`` and every process's
memory, by role, with whether it holds torch.

Each start runs ``asyncdp serve`` from a tree (one torch thread per engine), waits for the launcher's "startup
took" line, reads every process of the tree (its title, ``VmRSS``, whether ``libtorch_cpu`` is mapped), and stops
it. With ``--baseline DIR`` (another checkout: ``git archive REV | tar -x -C DIR``) the starts alternate between
the two trees and the ratios are printed. An API server runs no model: it needs neither torch nor its memory.

    python bench/process_footprint.py --model builtin:tiny-dense --startups 3 --api-server-count 2 --baseline DIR
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from bench.serving import (  # noqa: E402
    baseline_trees,
    descendants,
    measure_startup,
    positive_int,
    run_cli,
)

ROLES = ("launcher", "coordinator", "api", "engine")


def _process(pid: int) -> tuple[str, float, bool] | None:
    """(role, RSS in MiB, torch mapped) of one live process, or None when it is gone or not ours."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        rss_kib = int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0])
        torch = "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except (OSError, IndexError, ValueError):
        return None
    # with --api-server-count 1 the launcher serves the API itself, titled as its API server: it counts as "api"
    role = next((r for r in ROLES if title.startswith(f"asyncdp-{r}")), None)
    return None if role is None else (role, rss_kib / 1024, torch)


def _roles(pid: int) -> dict[str, list[tuple[float, bool]]]:
    """Each role's processes in the tree of the launcher ``pid``, as (RSS MiB, torch mapped)."""
    time.sleep(0.5)  # the engines' first heartbeats and the API servers' first snapshots settle
    roles: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for child in [pid, *descendants(pid)]:
        if (seen := _process(child)) is not None:
            roles[seen[0]].append(seen[1:])
    return roles


def main() -> int:
    parser = argparse.ArgumentParser(prog="process_footprint.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny-dense", help="a built-in name or a checkpoint directory")
    parser.add_argument("--startups", type=positive_int, default=3, help="starts per tree")
    parser.add_argument("--api-server-count", type=positive_int, default=2, help="API servers of the deployment")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, started alternately")
    args = parser.parse_args()
    trees = baseline_trees(parser, args.baseline)
    from asyncdp.model import resolve_model

    resolve_model(args.model)  # a bad name is a usage error before anything starts; a built-in is made once
    rss: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in trees}
    torch: dict[str, dict[str, set[bool]]] = {name: defaultdict(set) for name in trees}
    probed = {name: 0 for name in trees}

    def probe(name: str, pid: int) -> None:
        for role, procs in _roles(pid).items():
            rss[name][role].extend(mib for mib, _ in procs)
            torch[name][role].update(mapped for _, mapped in procs)
        probed[name] += 1
        print(f"start {probed[name]}/{args.startups} {name} read", file=sys.stderr)

    starts = measure_startup(trees, args.startups, args.model, "-dp", "2", "--api-server-count",
                             str(args.api_server_count), probe=probe)
    took = {name: [seconds for _, seconds in runs] for name, runs in starts.items()}
    print(f"asyncdp serve {args.model} -dp 2 --api-server-count {args.api_server_count}, "
          f"{args.startups} starts per tree (medians)")
    for name in trees:
        print(f"  {name:9}  startup took {statistics.median(took[name]):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in took[name])})")
        for role in ROLES:
            if rss[name][role]:
                holds = "torch" if torch[name][role] == {True} else "no torch" if torch[name][role] == {False} \
                    else "torch in some"
                print(f"    {role:11} RSS {statistics.median(rss[name][role]):7.1f} MiB  ({holds})")
    if "baseline" in trees:
        print("  this tree / baseline:")
        print(f"    startup took {statistics.median(took['this tree']) / statistics.median(took['baseline']):.3f} x")
        for role in ROLES:
            if rss["this tree"][role] and rss["baseline"][role]:
                ratio = statistics.median(rss["this tree"][role]) / statistics.median(rss["baseline"][role])
                print(f"    {role:11} RSS {ratio:.3f} x")
    return 0


if __name__ == "__main__":
    run_cli(main)
