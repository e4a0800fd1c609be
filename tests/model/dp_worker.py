"""One DP rank for the multi-process tests and the bench: joins a real gloo group, then serves commands.

Run as a script: ``python dp_worker.py HOST PORT``. It connects back to the parent (``DPRanks``, loopback, a
``multiprocessing.connection.Connection`` over the socket), receives ``("setup", {...})`` and then one command
at a time, answering each with ``("ok", result)`` or ``("error", traceback)``. ``("exit", None)`` leaves the
group and ends the process.

``DPRanks`` is the parent side: it hosts the rendezvous store, starts ``dp_size`` workers, and sends every
command to every rank before collecting the answers (the ranks' collectives pair up with each other), each wait
bounded by a deadline. Closing it ends the workers, killing any that do not exit in time.

The commands run the lockstep drivers of ``lockstep_drivers.py`` (``run_schedule``, ``run_core``,
``time_decode``), which the single-process references share.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import traceback
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from lockstep_drivers import run_core, run_schedule, time_decode

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    def __init__(self, setup: dict[str, Any]) -> None:
        import torch

        from asyncdp.config.flags import EngineConfig
        from asyncdp.engine.model_runner import TorchExecutor
        from asyncdp.messages import DPGroupInfo
        from asyncdp.model.distributed import DPContext, init_dp_group

        torch.set_num_threads(1)
        self.dp_rank = setup["dp_rank"]
        info = DPGroupInfo(master_addr="127.0.0.1", master_port=setup["port"], dp_size=setup["dp_size"],
                           backend="gloo", launch_nonce=bytes(16))  # no secret: the plain store
        self.group = init_dp_group(info, self.dp_rank, timeout_s=60.0)
        config = EngineConfig(model=setup["model"], device="cpu", dtype="float32", num_kv_blocks=64, block_size=16,
                              max_num_seqs=8, torch_threads=1)
        contexts = {"ep": DPContext(self.group, enable_expert_parallel=True),
                    "ep-uneven": DPContext(self.group, enable_expert_parallel=True, ep_padded_max_rows=0),
                    "tp": DPContext(self.group, enable_expert_parallel=False)}
        self.executors = {name: TorchExecutor(config, Path(setup["model"]), dp=dp) for name, dp in contexts.items()}

    def greedy(self, args: dict[str, Any]) -> dict[str, Any]:
        executor = self.executors[args["mode"]]
        before = executor.num_dp_exchanges
        backends = [block.backend for block in executor.model.moe_blocks()]
        dispatch_before = [(getattr(b, "num_padded", 0), getattr(b, "num_uneven", 0)) for b in backends]
        outs, logprobs = run_schedule(executor, args["prompts"], args["max_tokens"], start_step=args["start_step"],
                                      total_steps=args["total_steps"],
                                      empty_batch_steps=args.get("empty_batch_steps", False))
        padded = sum(getattr(b, "num_padded", 0) - d[0] for b, d in zip(backends, dispatch_before, strict=True))
        uneven = sum(getattr(b, "num_uneven", 0) - d[1] for b, d in zip(backends, dispatch_before, strict=True))
        return {"outputs": outs, "logprobs": logprobs, "exchanges": executor.num_dp_exchanges - before,
                "padded_dispatches": padded, "uneven_dispatches": uneven}

    def core_generate(self, args: dict[str, Any]) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        def all_reduce_sum(value: int) -> int:
            t = torch.tensor([value], dtype=torch.int64)
            dist.all_reduce(t, group=self.group.control)
            return int(t.item())

        return run_core(self.executors[args["mode"]], args["requests"], all_reduce_sum=all_reduce_sum)

    def decode_timing(self, args: dict[str, Any]) -> list[float]:
        return time_decode(self.executors[args["mode"]], batch=args["batch"], prompt_len=args["prompt_len"],
                           steps=args["steps"], idle=args.get("idle", False))

    def collective_latency(self, args: dict[str, Any]) -> dict[str, float]:
        """Seconds per collective of the kinds a forward issues, tiny payloads (latency-bound, as in decode)."""
        import time

        import torch
        import torch.distributed as dist

        group, n = self.group.data, args["iterations"]
        counts = torch.ones(self.group.dp_size, dtype=torch.int64)
        rows = torch.zeros(args["rows"] * self.group.dp_size, args["width"])
        gathered = torch.empty(rows.shape[0] * self.group.dp_size, rows.shape[1])
        kinds = {
            "all_to_all_single(counts)": lambda: dist.all_to_all_single(torch.empty_like(counts), counts, group=group),
            "all_to_all_single(rows)": lambda: dist.all_to_all_single(torch.empty_like(rows), rows, group=group),
            "all_gather_single(rows)": lambda: dist.all_gather_single(gathered, rows, group=group),
            "reduce_scatter_single(rows)": lambda: dist.reduce_scatter_single(
                torch.empty(rows.shape[0] // self.group.dp_size, rows.shape[1]), rows, group=group),
            "all_reduce(1 int)": lambda: dist.all_reduce(torch.ones(1, dtype=torch.int64), group=self.group.control),
        }
        out = {}
        for name, fn in kinds.items():
            fn()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            out[name] = (time.perf_counter() - t0) / n
        return out

    def all_reduce(self, args: dict[str, Any]) -> dict[str, Any]:
        import anyio

        from asyncdp.errors import DPGroupAborted
        from asyncdp.model.distributed import TorchDPGroup

        async def main() -> dict[str, Any]:
            group = TorchDPGroup.from_group(self.group, anyio.CapacityLimiter(1))
            out: dict[str, Any] = {"rank": group.dp_rank, "size": group.dp_size}
            out["sum"] = await group.all_reduce(args["values"], "sum")
            out["max"] = await group.all_reduce(args["values"], "max")
            # abort() on a twin that records instead of aborting the communicators: the pair stays usable.
            aborts: list[int] = []
            twin = TorchDPGroup(self.group.control, group.dp_rank, group.dp_size, anyio.CapacityLimiter(1),
                                on_abort=lambda: aborts.append(1))
            twin.abort()
            twin.abort()
            try:
                await twin.all_reduce([1])
            except DPGroupAborted:
                out["after_abort"] = "aborted"
            out["communicator_aborts"] = len(aborts)
            return out

        return anyio.run(main)

    def backends(self, args: dict[str, Any]) -> dict[str, Any]:
        """EP and TP backends against the full layer on random data, with the given per-rank token counts."""
        import torch

        from asyncdp.model.expert_parallel import (
            ExpertParallelBackend,
            ForwardSizes,
            TensorParallelExpertsBackend,
            expert_shard_for,
        )
        from asyncdp.model.moe import LocalExperts

        hidden, num_experts, inter, top_k = 16, args["num_experts"], 12, 2
        gen = torch.Generator().manual_seed(7)
        full = LocalExperts(hidden, num_experts, inter)
        full.w13.data = torch.randn(num_experts, 2 * inter, hidden, generator=gen)
        full.w2.data = torch.randn(num_experts, hidden, inter, generator=gen)
        gen.manual_seed(100 + self.dp_rank)
        num_tokens = args["tokens"][self.dp_rank]
        x = torch.randn(num_tokens, hidden, generator=gen)
        if args.get("route_to") is not None:  # every pair of this rank to experts of one rank
            shard = expert_shard_for(num_experts, inter, args["route_to"], self.group.dp_size, True)
            ids = torch.full((num_tokens, top_k), shard.expert_start, dtype=torch.int64)
            ids[:, 1] = (shard.expert_end or num_experts) - 1
            if top_k > 1 and ids[0, 0] == ids[0, 1]:
                ids[:, 1] = (ids[:, 0] + 1) % num_experts
        else:
            ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)]) \
                if num_tokens else torch.empty(0, top_k, dtype=torch.int64)
        weights = torch.rand(num_tokens, top_k, generator=gen)
        expected = full(x, ids, weights)
        result: dict[str, Any] = {}
        for mode in ("ep", "ep-uneven", "tp"):
            ep = mode != "tp"
            s = expert_shard_for(num_experts, inter, self.dp_rank, self.group.dp_size, ep)
            e0, e1, i0, i1 = s.resolve(num_experts, inter)
            part = LocalExperts(hidden, e1 - e0, i1 - i0, expert_start=e0, num_experts=num_experts,
                                intermediate_start=i0)
            part.w13.data = torch.cat([full.w13.data[e0:e1, i0:i1], full.w13.data[e0:e1, inter + i0: inter + i1]], 1)
            part.w2.data = full.w2.data[e0:e1, :, i0:i1].clone()
            sizes = ForwardSizes(self.group.exchange, self.dp_rank, self.group.dp_size, torch.device("cpu"))
            sizes.exchange(num_tokens)
            backend = (ExpertParallelBackend(part, self.group.data, self.dp_rank, self.group.dp_size, num_experts,
                                             sizes=sizes, padded_max_rows=0 if mode == "ep-uneven" else 256)
                       if ep else TensorParallelExpertsBackend(part, self.group.data, sizes))
            got = backend(x, ids, weights)
            result[mode] = {
                "shape": list(got.shape), "max_abs_err": float((got - expected).abs().max()) if num_tokens else 0.0,
                "sizes": sizes.sizes}
        return result


class DPRanks:
    """``dp_size`` worker processes joined in one gloo DP group over loopback (the parent hosts the store)."""

    def __init__(self, model: Path, dp_size: int, *, timeout_s: float = 90.0) -> None:
        from asyncdp.model.distributed import host_rendezvous_store

        self.timeout_s = timeout_s
        self.procs: list[subprocess.Popen[bytes]] = []
        self.conns: list[Connection] = []
        self.store, port = host_rendezvous_store("127.0.0.1", timeout_s=timeout_s)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        with socket.create_server(("127.0.0.1", 0)) as server:
            server.settimeout(timeout_s)
            addr = server.getsockname()
            try:
                for _ in range(dp_size):
                    self.procs.append(subprocess.Popen(
                        [sys.executable, __file__, addr[0], str(addr[1])], env=env, cwd=ROOT))
                for _ in range(dp_size):
                    sock, _ = server.accept()
                    sock.setblocking(True)
                    self.conns.append(Connection(sock.detach()))
                self.call("setup", [{"model": str(model), "port": port, "dp_size": dp_size, "dp_rank": r}
                                    for r in range(dp_size)])
            except BaseException:
                self.close()
                raise

    def call(self, cmd: str, args: list[Any]) -> list[Any]:
        """Send ``cmd`` with ``args[r]`` to rank r, for every rank, then wait for every answer."""
        for conn, a in zip(self.conns, args, strict=True):
            conn.send((cmd, a))
        results = []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(self.timeout_s):
                raise TimeoutError(f"rank {rank} did not answer {cmd!r} within {self.timeout_s} s")
            status, value = conn.recv()
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed {cmd!r}:\n{value}")
            results.append(value)
        return results

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("exit", None))
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for conn in self.conns:
            conn.close()

    def __enter__(self) -> DPRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> int:
    host, port = sys.argv[1], int(sys.argv[2])
    conn = Client((host, port))
    worker: Worker | None = None
    try:
        while True:
            cmd, args = conn.recv()
            if cmd == "exit":
                conn.send(("ok", None))
                return 0
            try:
                if cmd == "setup":
                    worker = Worker(args)
                    conn.send(("ok", {"dp_rank": worker.dp_rank}))
                else:
                    assert worker is not None, "setup first"
                    conn.send(("ok", getattr(worker, cmd)(args)))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    finally:
        if worker is not None:
            worker.group.destroy()
        conn.close()


if __name__ == "__main__":
    sys.exit(main())
