"""Per-step cost of the MoE DP collectives on CPU (gloo, loopback): a decode step at dp = 2, EP on and off, vs dp = 1.

Two real rank processes (``tests/model/dp_worker.py``) join one gloo group; each decodes ``--batch`` sequences of
the built-in tiny MoE model (or a checkpoint given with ``--model``). The same steps run at dp = 1 in this process
with no group at all. Cases, side by side in one run:

* ``dp=1`` batch B and batch 2B (the same total tokens as dp = 2);
* ``dp=2 EP padded`` (the decode dispatch: no counts exchange), ``dp=2 EP uneven`` (counts all-to-all, then
  uneven all-to-alls) and ``dp=2 TP-experts`` (EP off) with B sequences on each rank;
* the same with rank 1 idle (dummy steps only), the lockstep price a rank pays for keeping a busy peer company.

A forward issues 1 token-count all-gather plus, per MoE layer, 2 all-to-alls (EP padded), 3 (EP uneven) or an
all-gather and a reduce-scatter (EP off); the table also gives the measured latency of each collective alone. Medians over
``--steps`` decode steps, best of ``--rounds`` interleaved rounds; the machine is shared, so compare ratios
within one run.

    python bench/lockstep_collectives.py [--batch 4] [--steps 40] [--json bench/results/lockstep_collectives.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "model"))

from dp_worker import DPRanks  # noqa: E402
from lockstep_drivers import time_decode  # noqa: E402

from asyncdp.config.flags import EngineConfig  # noqa: E402
from asyncdp.errors import ConfigError  # noqa: E402
from asyncdp.model import export_builtin  # noqa: E402
from asyncdp.model.info import load_config  # noqa: E402
from bench.serving import check_output, positive_int  # noqa: E402


def _ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="MoE checkpoint directory (default: builtin:tiny-moe)")
    ap.add_argument("--batch", type=positive_int, default=4, help="decode sequences per rank")
    ap.add_argument("--prompt-len", type=positive_int, default=32)
    ap.add_argument("--steps", type=positive_int, default=40)
    ap.add_argument("--rounds", type=positive_int, default=3,
                    help="interleaved repetitions; each case keeps its best")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "lockstep_collectives.json")
    a = ap.parse_args()
    check_output(ap, "--json", a.json)  # before the rank processes start, not after the runs
    # torch only now: a usage error answers without the seconds of its import
    import torch

    from asyncdp.engine.model_runner import TorchExecutor
    from asyncdp.model.decoder import ArchSpec

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or export_builtin("builtin:tiny-moe", Path(tmp) / "tiny-moe")
        try:
            spec = ArchSpec.from_config(load_config(model))
        except ConfigError as exc:
            ap.error(str(exc))
        if not spec.sparse_layers:
            ap.error(f"--model {model}: not a mixture-of-experts model (no sparse layers)")
        config = EngineConfig(model=str(model), device="cpu", dtype="float32", num_kv_blocks=2048, block_size=16,
                              max_num_seqs=2 * a.batch, torch_threads=1)
        single = TorchExecutor(config, model)
        common = {"prompt_len": a.prompt_len, "steps": a.steps}
        layers = len(spec.sparse_layers)
        cases: dict[str, tuple[int, str]] = {}  # case -> (collectives per step, note)
        best: dict[str, float] = {}

        def record(case: str, ms: float, collectives: int, note: str = "") -> None:
            cases.setdefault(case, (collectives, note))
            best[case] = min(best.get(case, ms), ms)

        with DPRanks(model, 2, timeout_s=300.0) as ranks:
            for _ in range(a.rounds):  # interleaved rounds; each case keeps its best round (noise is one-sided)
                record(f"dp=1 batch {a.batch}", _ms(time_decode(single, batch=a.batch, **common)), 0)
                record(f"dp=1 batch {2 * a.batch}", _ms(time_decode(single, batch=2 * a.batch, **common)), 0,
                       "same total tokens as dp=2")
                for mode, name, per_layer in (("ep", "EP padded", 2), ("ep-uneven", "EP uneven", 3),
                                              ("tp", "TP-experts", 2)):
                    busy = ranks.call("decode_timing", [{"mode": mode, "batch": a.batch, **common}] * 2)
                    record(f"dp=2 {name}, both busy", max(_ms(t) for t in busy), 1 + per_layer * layers,
                           f"batch {a.batch} per rank; slower rank's median")
                    mixed = ranks.call("decode_timing", [{"mode": mode, "batch": a.batch, **common},
                                                         {"mode": mode, "batch": a.batch, "idle": True, **common}])
                    record(f"dp=2 {name}, rank 1 idle", _ms(mixed[0]), 1 + per_layer * layers,
                           "rank 1 runs dummy steps")
            width = spec.hidden + 2 * spec.top_k
            latency = ranks.call("collective_latency", [{"iterations": 200, "rows": a.batch * spec.top_k,
                                                         "width": width}] * 2)[0]
    base = best[f"dp=1 batch {a.batch}"]
    rows: list[dict[str, object]] = [
        {"case": case, "ms_per_step": round(best[case], 3), "collectives_per_step": coll, "note": note}
        for case, (coll, note) in cases.items()]
    for row in rows:
        row["ratio_vs_dp1"] = round(float(row["ms_per_step"]) / base, 2)  # type: ignore[arg-type]
    print(f"{'case':32} {'ms/step':>9} {'x dp=1':>7} {'coll/step':>9}  note")
    for row in rows:
        print(f"{row['case']:32} {row['ms_per_step']:9.3f} {row['ratio_vs_dp1']:7.2f} "
              f"{row['collectives_per_step']:9}  {row['note']}")
    print("\ncollective latency (gloo, loopback, decode-sized payloads):")
    for name, s in latency.items():
        print(f"  {name:30} {s * 1e3:7.3f} ms")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({
        "load_average_1m": round(os.getloadavg()[0], 2), "cpu_count": os.cpu_count(), "batch_per_rank": a.batch,
        "prompt_len": a.prompt_len, "steps": a.steps, "rounds": a.rounds, "moe_layers": layers,
        "num_experts": spec.num_experts, "top_k": spec.top_k, "cases": rows,
        "collective_latency_ms": {k: round(v * 1e3, 4) for k, v in latency.items()}}, indent=2) + "\n")
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; wrote {a.json}")


if __name__ == "__main__":
    main()
