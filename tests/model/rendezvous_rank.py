"""One rank of a DP group for the rendezvous tests: ``python rendezvous_rank.py PORT DP_SIZE DP_RANK TIMEOUT_S``.

Imports torch, then reads the deployment secret (hex; empty: none) and the launch nonce (hex) from stdin, one line
each, which is the signal to go on: a test starts every rank at once and lets each join when it wants. Then it joins the gloo group at 127.0.0.1:PORT through
``init_dp_group``, runs one all-reduce of ``dp_rank + 1`` on the control group, and prints one JSON line:
``{"sum": n, "listening": ["ip:port", ...]}`` (the TCP sockets this process listens on: gloo's), or
``{"error": "<type>: <message>"}`` when joining or the all-reduce failed. Exits 0 either way.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys


def listening() -> list[str]:
    """This process's listening IPv4 TCP sockets, from its fds and /proc/net/tcp."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    with open("/proc/self/net/tcp") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                addr, port = fields[1].split(":")
                found.append(f"{socket.inet_ntoa(struct.pack('<I', int(addr, 16)))}:{int(port, 16)}")
    return sorted(found)


def main() -> None:
    port, dp_size, dp_rank, timeout_s = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    import torch
    import torch.distributed as dist

    from asyncdp.messages import DPGroupInfo
    from asyncdp.model.distributed import init_dp_group

    torch.set_num_threads(1)
    secret = bytes.fromhex(sys.stdin.readline().strip()) or None
    launch_nonce = bytes.fromhex(sys.stdin.readline().strip())
    info = DPGroupInfo(master_addr="127.0.0.1", master_port=port, dp_size=dp_size, backend="gloo",
                       launch_nonce=launch_nonce)
    try:
        group = init_dp_group(info, dp_rank, timeout_s=timeout_s, secret=secret)
        tensor = torch.tensor([dp_rank + 1], dtype=torch.int64)
        dist.all_reduce(tensor, group=group.control)
        result: dict[str, object] = {"sum": int(tensor.item()), "listening": listening()}
        group.destroy()
    except Exception as exc:  # noqa: BLE001 - reported to the test, which asserts on it
        result = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
