"""One rank of a DP group for the rendezvous tests: ``python rendezvous_rank.py PORT DP_SIZE DP_RANK TIMEOUT_S``.

Imports torch, then reads the deployment secret (hex; empty: none) from stdin, which is the signal to go on: a
test starts every rank at once and lets each join when it wants. Then it joins the gloo group at 127.0.0.1:PORT through
``init_dp_group``, runs one all-reduce of ``dp_rank + 1`` on the control group, and prints one JSON line:
``{"sum": n}``, or ``{"error": "<type>: <message>"}`` when joining or the all-reduce failed. Exits 0 either way.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    port, dp_size, dp_rank, timeout_s = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    import torch
    import torch.distributed as dist

    from asyncdp.messages import DPGroupInfo
    from asyncdp.model.distributed import init_dp_group

    torch.set_num_threads(1)
    secret = bytes.fromhex(sys.stdin.readline().strip()) or None
    info = DPGroupInfo(master_addr="127.0.0.1", master_port=port, dp_size=dp_size, backend="gloo")
    try:
        group = init_dp_group(info, dp_rank, timeout_s=timeout_s, secret=secret)
        tensor = torch.tensor([dp_rank + 1], dtype=torch.int64)
        dist.all_reduce(tensor, group=group.control)
        result: dict[str, object] = {"sum": int(tensor.item())}
        group.destroy()
    except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
        result = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
