"""What building and loading a model costs an engine process: ``load_model`` in a fresh interpreter.

Each run starts a new Python (one torch thread, as an engine with the machine to itself), imports the loader, and
times ``load_model`` on the model's checkpoint: the model built on its device and every weight read from the
``*.safetensors`` files, plus whatever that first use of torch imports. With ``--baseline DIR`` (a checkout of
another tree: ``git archive 1707dc0 | tar -x -C DIR``, where the model was built on the meta device) the runs
alternate between the two trees and the ratios are printed. ``--startups N`` also starts ``asyncdp serve MODEL
-dp 2`` N times from each tree, alternately, and compares the launcher's "startup took" (the whole deployment, of
which each engine's model load is one part).

    python bench/model_load.py --model builtin:tiny-dense --runs 7 --startups 3 --baseline /tmp/asyncdp-before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from bench.serving import baseline_trees, measure_startup, non_negative_int, positive_int, run_cli  # noqa: E402

_ONE_LOAD = """
import json, sys, time
import torch
torch.set_num_threads(1)
from pathlib import Path
from asyncdp.model.loader import load_model
since = time.perf_counter()
load_model(Path(sys.argv[1]), device=torch.device("cpu"), dtype=torch.float32)
took = time.perf_counter() - since
print(json.dumps({"load_s": took, "imported": sorted({"torch._dynamo", "sympy"} & set(sys.modules))}))
"""


def _one_load(tree: Path, checkpoint: Path) -> tuple[float, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _ONE_LOAD, str(checkpoint)], cwd=tree, env=env, check=True,
                         capture_output=True, text=True, timeout=600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["load_s"]), [str(module) for module in result["imported"]]


def main() -> int:
    parser = argparse.ArgumentParser(prog="model_load.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny-dense", help="a built-in name or a checkpoint directory")
    parser.add_argument("--runs", type=positive_int, default=5, help="fresh interpreters per tree")
    parser.add_argument("--startups", type=non_negative_int, default=0,
                        help="also start `asyncdp serve MODEL -dp 2` this many times per tree (0: none)")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, run alternately")
    args = parser.parse_args()
    trees = baseline_trees(parser, args.baseline)
    from asyncdp.model import resolve_model

    checkpoint = resolve_model(args.model)
    times: dict[str, list[float]] = {name: [] for name in trees}
    imported: dict[str, set[str]] = {name: set() for name in trees}
    for run in range(args.runs):
        for name, tree in trees.items():
            took, modules = _one_load(tree, checkpoint)
            times[name].append(took)
            imported[name].update(modules)
            print(f"run {run + 1}/{args.runs} {name}: load_model {times[name][-1]:.3f} s", file=sys.stderr)
    print(f"{args.model} ({checkpoint}), {args.runs} fresh interpreters per tree")
    for name in trees:
        also = ", ".join(sorted(imported[name])) or "nothing more"
        print(f"  {name:9}  median {statistics.median(times[name]):.3f} s  min {min(times[name]):.3f} s  "
              f"max {max(times[name]):.3f} s  (imports {also})")
    if "baseline" in trees:
        ratio = statistics.median(times["this tree"]) / statistics.median(times["baseline"])
        print(f"  this tree / baseline (medians): {ratio:.3f} x")
    if args.startups:
        startup = {name: [t for _healthy, t in starts]
                for name, starts in measure_startup(trees, args.startups, args.model, "-dp", "2").items()}
        print(f"asyncdp serve {args.model} -dp 2, {args.startups} startups per tree: the launcher's startup took")
        for name in trees:
            listed = ", ".join(f"{t:.2f}" for t in startup[name])
            print(f"  {name:9}  median {statistics.median(startup[name]):.2f} s  ({listed})")
        if "baseline" in trees:
            ratio = statistics.median(startup["this tree"]) / statistics.median(startup["baseline"])
            print(f"  this tree / baseline (medians): {ratio:.3f} x")
    return 0


if __name__ == "__main__":
    run_cli(main)
