"""The parent side of ``rendezvous_rank.py``: rank processes of one group, started at once (each imports torch,
then waits), each joining when the test says (:meth:`Ranks.join` hands it the secret and the launch nonce), each
killed at the end. One :class:`Ranks` is one launch: it draws the launch nonce a head would."""

from __future__ import annotations

import datetime
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncdp.messages import LAUNCH_NONCE_BYTES

ROOT = Path(__file__).resolve().parents[2]
RANK_SCRIPT = Path(__file__).with_name("rendezvous_rank.py")
RANK_TIMEOUT_S = 20.0  # each rank's gloo and store timeout
DEADLINE_S = 90.0  # a rank's import of torch, its rendezvous and its all-reduce, on a loaded machine


class Ranks:
    """Rank processes of one group, each killed at the end if it has not exited."""

    def __init__(self, port: int, dp_size: int, secret: bytes | None, *, wrapper: Sequence[str] = ()) -> None:
        """``wrapper``: a command that runs each rank (the rank's command line is appended to it)."""
        self.port, self.dp_size, self.secret, self.wrapper = port, dp_size, secret, tuple(wrapper)
        self.launch_nonce = secrets.token_bytes(LAUNCH_NONCE_BYTES)
        self.procs: dict[int, subprocess.Popen[str]] = {}

    def start(self) -> None:
        """Every rank's process, which imports torch and waits for :meth:`join`."""
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        env.pop("GLOO_SOCKET_IFNAME", None)
        for dp_rank in range(self.dp_size):
            self.procs[dp_rank] = subprocess.Popen(
                [*self.wrapper, sys.executable, str(RANK_SCRIPT), str(self.port), str(self.dp_size), str(dp_rank),
                 str(RANK_TIMEOUT_S)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def join(self, dp_rank: int) -> None:
        """Rank ``dp_rank`` joins the group now (it is handed the secret and the launch nonce)."""
        stdin = self.procs[dp_rank].stdin
        assert stdin is not None
        stdin.write((self.secret or b"").hex() + "\n" + self.launch_nonce.hex() + "\n")
        stdin.close()

    def result(self, dp_rank: int) -> dict[str, object]:
        proc = self.procs[dp_rank]
        proc.wait(timeout=DEADLINE_S)
        assert proc.stdout is not None
        lines = proc.stdout.read().strip().splitlines()
        assert lines, f"rank {dp_rank} printed nothing (exit {self.procs[dp_rank].returncode})"
        return json.loads(lines[-1])

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None and not pipe.closed:
                    pipe.close()


def stranger_store(port: int) -> Any:
    """A client of the rendezvous store on 127.0.0.1:``port`` that holds no secret: the stranger of the tests."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=DEADLINE_S))


def first_key(store: Any) -> str:
    """Polls (a real process writes it; a store has no watch on its keys) until a key appears in ``store``."""
    deadline = time.monotonic() + DEADLINE_S
    while not (keys := store.list_keys()):
        assert time.monotonic() < deadline, "no rank wrote to the rendezvous store"
        time.sleep(0.05)
    return str(keys[0])
