"""The DP process group of a MoE deployment (spec §5.5) and the DP control collective over it (§8.3).

Rendezvous. The head hosts a ``TCPStore`` bound to port 0 on the DP address (:func:`host_rendezvous_store`) and
sends the real port in ``HandshakeInit.dp_group``; every engine joins as a store client and initialises the
group with group rank = ``dp_rank`` (:func:`init_dp_group`, retried up to 5 times on "address in use", E10).
The head itself never joins the group: the store only brokers the rank addresses. With a deployment secret the
ranks join through a sealed view of the store (opaque key names, encrypted and authenticated values, under keys
bound to this launch by ``HandshakeInit.dp_group.launch_nonce``), so a stranger who reaches its port can neither
read the rank addresses nor plant one, nor replay one from an earlier launch (:mod:`asyncdp.model.rendezvous`).
gloo's pair sockets listen on the interface facing the DP address (:mod:`asyncdp.model.gloo_interface`).

Groups. ``DPProcessGroup.data`` carries the per-forward collectives (token-count exchange and the MoE expert
collectives of ``asyncdp.model.expert_parallel``); it is gloo on CPU and NCCL on CUDA. ``control`` is always a
separate gloo group for the lockstep sync all-reduce. ``exchange`` is the group of the token-count exchange:
``data``, or ``control`` when NCCL is disabled for DP synchronisation.

Ordering. Collectives pair up by order on every rank, so every one of them is issued from the rank's execution
thread: the engine runs its steps with ``anyio.to_thread.run_sync(..., limiter=L)`` and :class:`TorchDPGroup`
runs its all-reduce through the same ``CapacityLimiter(1)`` ``L``. The loop that awaits them is one task, so
steps and syncs enter the thread in loop order, identical on every rank (spec §8.3 invariant).

Teardown. :meth:`TorchDPGroup.abort` makes every later call raise ``DPGroupAborted`` and asks the communicator
to abort (best effort: a gloo collective already blocked may stay blocked; the fatal path hard-exits, §8.8).
"""

from __future__ import annotations

import datetime
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import anyio.to_thread
import torch
import torch.distributed as dist

# The control-group errors live in the one exception tree; DPGroupInfo is the rendezvous a rank is handed.
from asyncdp.config.deployment import threads_per_engine
from asyncdp.errors import DPGroupAborted, DPGroupError, StartupError
from asyncdp.messages import DPGroupInfo
from asyncdp.model import rendezvous
from asyncdp.model.gloo_interface import pin_gloo_interface
from asyncdp.model.rendezvous import STORE_TIMEOUT_S, host_rendezvous_store

log = logging.getLogger(__name__)

__all__ = ["DPContext", "DPGroupAborted", "DPGroupError", "DPProcessGroup", "TorchDPGroup", "cpu_threads_per_engine",
           "dp_backend", "host_rendezvous_store", "init_dp_group", "retry_address_in_use"]

INIT_ATTEMPTS = 5  # spec E10
INIT_RETRY_DELAY_S = 0.5
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
T = TypeVar("T")


def dp_backend(device_type: str) -> str:
    """The data-group backend for ``HandshakeInit.dp_group.backend``: NCCL on CUDA, gloo otherwise."""
    return "nccl" if device_type == "cuda" else "gloo"


@dataclass(slots=True)
class DPProcessGroup:
    """This rank's membership of the DP process group (one per engine process)."""

    dp_rank: int
    dp_size: int
    backend: str  # of ``data``
    data: dist.ProcessGroup  # MoE expert collectives
    exchange: dist.ProcessGroup  # per-forward token-count exchange
    control: dist.ProcessGroup  # gloo: lockstep sync all-reduce
    device: torch.device  # where ``data`` tensors live
    # The store the group was made with: a sealed one is a Python object torch calls back into (new groups, NCCL's
    # lazy communicators), so it must outlive the group.
    store: dist.Store | None = field(default=None, repr=False)

    @property
    def exchange_device(self) -> torch.device:
        return self.device if self.exchange is self.data else torch.device("cpu")

    def abort(self) -> None:
        """Best effort: abort every communicator (NCCL unblocks pending collectives; gloo ones stay blocked
        until a peer closes its connections, which is why the fatal path still hard-exits, spec §8.8)."""
        for pg in {id(g): g for g in (self.data, self.exchange, self.control)}.values():
            _abort_pg(pg)

    def destroy(self) -> None:
        """Leave the group (orderly shutdown only: peers must leave too)."""
        if dist.is_initialized():
            dist.destroy_process_group()


def _abort_pg(pg: dist.ProcessGroup) -> None:
    try:
        pg.abort()
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        log.debug("process group abort not supported: %s", exc)


def _first_line(exc: BaseException) -> str:
    """torch's C++ errors carry a stack trace after the message."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


cpu_threads_per_engine = threads_per_engine  # (spec §5.5; one definition, in the config layer)


def _is_address_in_use(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "address already in use" in text or "address in use" in text or "eaddrinuse" in text


def retry_address_in_use(fn: Callable[[], T], *, attempts: int = INIT_ATTEMPTS,
                         delay_s: float = INIT_RETRY_DELAY_S, sleep: Callable[[float], None] = time.sleep,
                         what: str = "DP process group") -> T:
    """Call ``fn``; on an "address in use" failure retry, ``attempts`` calls in all, then raise StartupError (E10).

    Any other failure propagates at once. The delay doubles after each failure.
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (RuntimeError, OSError) as exc:
            if not _is_address_in_use(exc):
                raise
            if attempt == attempts:
                raise StartupError(f"{what}: rendezvous failed after {attempts} 'address in use' errors: "
                                   f"{_first_line(exc)}") from exc
            log.warning("%s: address in use (attempt %d of %d); retrying", what, attempt, attempts)
            sleep(delay_s * 2 ** (attempt - 1))
    raise AssertionError("unreachable")


def init_dp_group(info: DPGroupInfo, dp_rank: int, *, timeout_s: float | None = None,
                  device: torch.device | None = None, gloo_exchange: bool = False,
                  secret: bytes | None = None) -> DPProcessGroup:
    """Join the DP process group described by ``info`` as rank ``dp_rank`` (blocking; run it off the loop).

    ``device`` is where the data group's tensors live (CPU unless the backend is NCCL). ``gloo_exchange`` moves
    the per-forward token-count exchange to the gloo control group (``--disable-nccl-for-dp-synchronization``).
    ``secret``: the deployment secret; with one the rendezvous goes through the sealed store every rank derives
    from it (a value it did not seal raises StartupError). Retries up to 5 times on "address in use" (E10); other
    failures raise StartupError at once.
    """
    if not 0 <= dp_rank < info.dp_size:
        raise StartupError(f"dp_rank {dp_rank} is outside the DP group of size {info.dp_size}.")
    backend = info.backend
    if backend == "nccl" and not torch.cuda.is_available():
        raise StartupError("the DP group uses NCCL but CUDA is not available on this engine; "
                           "run every rank on CUDA or every rank on CPU.")
    if backend not in ("gloo", "nccl"):
        raise StartupError(f"unknown DP group backend {backend!r}; expected gloo or nccl.")
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    store_timeout_s = timeout_s if timeout_s is not None else STORE_TIMEOUT_S

    # gloo's pair sockets on the interface facing the DP address, not wherever the hostname resolves
    log.debug("rank %d: gloo listens on interface %s", dp_rank,
              pin_gloo_interface(info.master_addr, info.master_port) or "(its default)")
    where = f"rank {dp_rank}: the DP group's rendezvous store at {info.master_addr}:{info.master_port}"

    def join() -> dist.Store:
        """One attempt: a store client and the group over it. A failed attempt's store is let go (its socket
        closed) before the next attempt: neither this frame nor torch's frames in the traceback keep it."""
        store = rendezvous.join_rendezvous_store(info, secret, timeout_s=store_timeout_s, where=where)
        try:
            dist.init_process_group(backend, store=store, rank=dp_rank, world_size=info.dp_size, timeout=timeout)
        except BaseException as exc:
            if dist.is_initialized():
                dist.destroy_process_group()
            del store
            traceback.clear_frames(exc.__traceback__)  # (the finished frames' locals; the trace itself stays)
            raise
        return store

    try:
        store = retry_address_in_use(
            join, what=f"rank {dp_rank}: DP process group at {info.master_addr}:{info.master_port}")
    except StartupError:
        raise
    except (RuntimeError, OSError) as exc:
        raise StartupError(f"rank {dp_rank}: cannot join the DP process group at "
                           f"{info.master_addr}:{info.master_port}: {_first_line(exc)}") from exc
    data = dist.group.WORLD
    assert data is not None
    # Always a communicator of its own: with NCCL data it must be gloo; with gloo data it keeps the control
    # all-reduce's buffers and tags apart from the forward's collectives.
    control = dist.new_group(backend="gloo", timeout=timeout)
    exchange = control if gloo_exchange else data
    dev = torch.device("cpu") if backend == "gloo" else (device or torch.device("cuda", torch.cuda.current_device()))
    return DPProcessGroup(dp_rank=dp_rank, dp_size=info.dp_size, backend=backend, data=data, exchange=exchange,
                          control=control, device=dev, store=store)


class TorchDPGroup:
    """The ``DPGroup`` protocol (``asyncdp.engine.dp_group``) over a torch process group.

    ``pg`` should be the gloo control group (``DPProcessGroup.control``); ``limiter`` is the engine's step
    limiter, so the all-reduce runs on the execution thread, in order with the step collectives.
    """

    def __init__(self, pg: dist.ProcessGroup, dp_rank: int, dp_size: int, limiter: anyio.CapacityLimiter, *,
                 on_abort: Callable[[], None] | None = None) -> None:
        self._pg = pg
        self._on_abort = on_abort
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self._limiter = limiter
        self._aborted: str | None = None

    @classmethod
    def from_group(cls, group: DPProcessGroup, limiter: anyio.CapacityLimiter) -> TorchDPGroup:
        return cls(group.control, group.dp_rank, group.dp_size, limiter, on_abort=group.abort)

    @property
    def aborted(self) -> bool:
        return self._aborted is not None

    def _check_aborted(self) -> None:
        if self._aborted is not None:
            raise DPGroupAborted(f"DP group aborted: {self._aborted}")

    def _all_reduce_sync(self, values: list[int], op: str) -> list[int]:
        self._check_aborted()
        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=_OPS[op], group=self._pg)
        return [int(v) for v in tensor.tolist()]

    async def all_reduce(self, values: list[int], op: str = "sum") -> list[int]:
        self._check_aborted()
        if op not in _OPS:
            raise DPGroupError(f"all_reduce op must be one of {', '.join(_OPS)} (got {op!r})")
        try:
            result = await anyio.to_thread.run_sync(self._all_reduce_sync, list(values), op,
                                                    limiter=self._limiter, abandon_on_cancel=True)
        except DPGroupError:
            raise
        except RuntimeError as exc:  # torch.distributed.DistError and friends: a peer is gone
            self._check_aborted()
            raise DPGroupError(f"DP control all-reduce failed on rank {self.dp_rank}: {exc}") from exc
        self._check_aborted()
        return result

    def abort(self, reason: str | None = None) -> None:
        if self._aborted is not None:
            return
        self._aborted = reason or f"rank {self.dp_rank} aborted the DP group"
        if self._on_abort is not None:  # every communicator of the rank (data and control)
            self._on_abort()
        else:
            _abort_pg(self._pg)


@dataclass(frozen=True, slots=True)
class DPContext:
    """What ``TorchExecutor`` needs to run as one rank of a MoE DP group (spec §9)."""

    group: DPProcessGroup
    enable_expert_parallel: bool
    # Expert parallelism: padded all-to-all (no counts exchange) while max_tokens * top_k is at most this; 0: never.
    ep_padded_max_rows: int = 256

    @property
    def dp_rank(self) -> int:
        return self.group.dp_rank

    @property
    def dp_size(self) -> int:
        return self.group.dp_size
