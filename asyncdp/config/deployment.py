"""The pure mode derivation of ``asyncdp serve`` (spec §3, §4.1, §11.3): ServeConfig -> DeploymentConfig.

:func:`resolve` runs pass 1 (process layout from the raw flags) and pass 2 (resolved parallel configuration), in
that order, exactly as §3.1/§3.2 write them, plus the multi-port M-rules. It returns a :class:`DeploymentConfig`
(the CLI pairs it with the flags in a :class:`ResolvedServeConfig`) and never starts anything; every failure is a :class:`~asyncdp.errors.ConfigError`, which the CLI turns into
exit code 2 before any child process exists. The environment comes in as a mapping (``asyncdp.config.flags`` is the
only reader of ``os.environ``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncdp.config.flags import TOOL_CALL_PARSERS, ServeConfig, environ
from asyncdp.errors import ConfigError

# ---------------------------------------------------------------- resolved deployment (§3)


@dataclass(frozen=True, slots=True)
class DeploymentConfig:
    """The resolved data-parallel layout of this process (spec §3.3). Built only by :func:`resolve`."""

    mode: str  # one of MODES
    dp_size: int
    dp_size_local: int  # L; 0 = API-only head
    dp_start_rank: int  # S: global rank of the first local engine (external: the one rank)
    api_server_count: int  # C; 0 on a headless node; 1 on the multi-port parent (children use 1 each)
    headless: bool
    external: bool
    hybrid: bool
    local_engines_only: bool  # R10: clients manage local ranks only (hybrid, external)
    is_moe: bool
    num_experts: int
    enable_expert_parallel: bool  # effective: False on a dense model (V24)
    coordinator_here: bool  # this node's front-end (owner of rank 0) starts the coordinator (§3.3)
    managed_ranks: tuple[int, ...]  # ranks a client routes to; () on headless and multi-port parents
    data_parallel_address: str
    data_parallel_rpc_port: int
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    children: tuple[ResolvedServeConfig, ...] = ()  # multi-port: one resolved external-LB config per local rank
    warnings: tuple[str, ...] = field(default=())  # to be logged by the caller (auto-switch, V24)

    @property
    def dp_rank(self) -> int:
        return self.dp_start_rank

    @property
    def local_ranks(self) -> tuple[int, ...]:
        """Global ranks of the engines this node runs: ``S .. S+L-1`` (none on the multi-port parent)."""
        if self.mode == "multi-port":
            return ()
        return tuple(range(self.dp_start_rank, self.dp_start_rank + self.dp_size_local))

    @property
    def waves(self) -> bool:
        """MoE lockstep with wave coordination (§6.4)."""
        return self.is_moe and self.dp_size > 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedServeConfig(ServeConfig):
    """The flags of ``asyncdp serve`` together with the deployment :func:`resolve` derived from them."""

    deployment: DeploymentConfig

    @classmethod
    def with_deployment(cls, config: ServeConfig, deployment: DeploymentConfig) -> ResolvedServeConfig:
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(ServeConfig)}
        return cls(**fields, deployment=deployment)


_V9 = ("non-MoE models do not support external data-parallel mode; launch independent asyncdp instances "
       "without --data-parallel-* flags.")


@dataclass(slots=True)
class _Layout:  # pass 1 result
    headless: bool
    api_server_count: int
    is_multi: bool


def threads_per_engine(num_local_engines: int, cpu_count: int | None = None) -> int:
    """Torch intra-op threads for each of a node's ``num_local_engines`` CPU engines: the node's cores (``cpu_count``,
    default this machine's) divided among them, at least 1 (spec §5.5). A launcher divides them among its engines;
    the multi-port supervisor among its children, each of which runs one."""
    return max(1, (cpu_count or os.cpu_count() or 1) // max(1, num_local_engines))


def _pass1(c: ServeConfig) -> _Layout:
    """§3.1: process layout from the raw arguments."""
    headless, asc = c.headless, c.api_server_count
    if headless:
        if asc is not None and asc > 0:
            raise ConfigError(f"--api-server-count={asc} cannot be used with --headless "
                              "(headless nodes run engines only).")
        asc = 0
    elif asc == 0:
        headless = True  # an explicit 0 means --headless
    is_external = c.data_parallel_external_lb or c.data_parallel_rank is not None
    if not c.data_parallel_hybrid_lb and not c.data_parallel_multi_port_external_lb:
        is_hybrid = c.data_parallel_start_rank is not None  # start rank 0 counts
        is_multi = False
    else:
        is_hybrid = c.data_parallel_hybrid_lb
        is_multi = c.data_parallel_multi_port_external_lb
    if is_multi + is_external + is_hybrid > 1:
        raise ConfigError("choose one data-parallel load-balancing mode: "
                          "--data-parallel-multi-port-external-lb, --data-parallel-external-lb "
                          "(or --data-parallel-rank), --data-parallel-hybrid-lb (or --data-parallel-start-rank).")
    if asc is None:
        if is_multi or is_external:
            asc = 1
        elif is_hybrid:
            asc = c.data_parallel_size_local or 1
        else:
            asc = c.data_parallel_size  # internal LB
    return _Layout(headless=headless, api_server_count=asc, is_multi=is_multi)


@dataclass(slots=True)
class _Parallel:  # pass 2 result
    rank: int
    local: int
    external: bool
    hybrid: bool
    warnings: list[str]


def _pass2(c: ServeConfig, headless: bool, *, is_moe: bool, env: Mapping[str, str]) -> _Parallel:
    """§3.2: resolved parallel configuration, rules R1-R8 in order."""
    _check_lb_flags(c, headless)  # R1-R3
    rank, local, inferred_rank = _infer_from_nodes(c)  # R4
    external = c.data_parallel_external_lb or rank is not None  # R5
    hybrid = c.data_parallel_hybrid_lb
    if c.data_parallel_size > 1 and external and not is_moe:  # R6
        raise ConfigError(_V9)
    par = _place_local_ranks(c, headless, rank=rank, local=local, inferred_rank=inferred_rank, external=external,
                             hybrid=hybrid, is_moe=is_moe, env=env)  # R7
    _check_ranks(c, headless, par)  # R8
    return par


def _check_lb_flags(c: ServeConfig, headless: bool) -> None:
    """R1-R3: load-balancing flags that cannot go together."""
    if headless and c.data_parallel_hybrid_lb:  # R1
        raise ConfigError("--data-parallel-hybrid-lb cannot be used with --headless.")
    if c.data_parallel_hybrid_lb and c.data_parallel_external_lb:  # R2
        raise ConfigError("--data-parallel-hybrid-lb and --data-parallel-external-lb cannot be enabled together.")
    if headless and (c.data_parallel_external_lb or c.data_parallel_rank is not None):  # R3
        raise ConfigError("--headless cannot be combined with external LB (--data-parallel-external-lb or "
                          "--data-parallel-rank); headless nodes belong to internal-LB deployments.")


def _infer_from_nodes(c: ServeConfig) -> tuple[int | None, int | None, int]:
    """R4: with ``--nnodes > 1``, the rank (external LB) or the local size this node's share of the world gives.
    Returns ``(rank, local, inferred_rank)``."""
    dp, tp, pp = c.data_parallel_size, c.tensor_parallel_size, c.pipeline_parallel_size
    rank, local = c.data_parallel_rank, c.data_parallel_size_local
    if c.nnodes <= 1:
        return rank, local, 0
    if c.data_parallel_backend != "mp":
        raise ConfigError(f"--nnodes {c.nnodes} requires --data-parallel-backend mp "
                          f"(got {c.data_parallel_backend}); use mp or --nnodes 1.")
    world, per_rank = dp * tp * pp, tp * pp
    if world % c.nnodes != 0:
        raise ConfigError(f"--nnodes {c.nnodes} must evenly divide the total world size {world} (dp*tp*pp).")
    if not 0 <= c.node_rank < c.nnodes:
        raise ConfigError(f"--node-rank must be between 0 and {c.nnodes - 1} (got {c.node_rank}).")
    local_world = world // c.nnodes
    if per_rank > local_world:
        raise ConfigError(f"a data-parallel rank would span nodes (tp*pp={per_rank} > {world}/{c.nnodes}); "
                          "multi-node tensor/pipeline parallelism is not supported.")
    inferred_rank = (c.node_rank * local_world) // per_rank
    if dp > 1 and c.data_parallel_external_lb:
        if rank is not None and rank != inferred_rank:
            raise ConfigError(f"--data-parallel-rank {rank} conflicts with rank {inferred_rank} inferred from "
                              "--node-rank/--nnodes; drop one of them.")
        rank = inferred_rank
    elif local is None:
        local = max(local_world // per_rank, 1)
    return rank, local, inferred_rank


def _place_local_ranks(c: ServeConfig, headless: bool, *, rank: int | None, local: int | None, inferred_rank: int,
                       external: bool, hybrid: bool, is_moe: bool, env: Mapping[str, str]) -> _Parallel:
    """R7: this node's first rank and local size, and the LB mode they settle (hybrid with one rank is external)."""
    dp, start = c.data_parallel_size, c.data_parallel_start_rank
    warnings: list[str] = []
    if external:
        if rank is None:
            raise ConfigError("--data-parallel-external-lb requires a rank: set --data-parallel-rank, "
                              "or use --nnodes/--node-rank so it can be inferred.")
        if local not in (None, 1):
            raise ConfigError(f"an external data-parallel rank requires --data-parallel-size-local 1 (got {local}).")
        return _Parallel(rank=rank, local=1, external=True, hybrid=False, warnings=warnings)
    if local is not None:
        if start is not None and not headless:
            hybrid = True  # start rank 0 counts
        if hybrid and local == 1:
            warnings.append("hybrid LB with one local rank is external LB; switching to external")
            external, hybrid = True, False
            if dp > 1 and not is_moe:
                raise ConfigError(_V9 + " (hybrid LB with --data-parallel-size-local 1 is external LB)")
        if local == dp:
            hybrid = False  # single node: internal
        rank = start if start is not None else inferred_rank
        return _Parallel(rank=rank, local=local, external=external, hybrid=hybrid, warnings=warnings)
    if hybrid:
        raise ConfigError("--data-parallel-hybrid-lb requires --data-parallel-size-local.")
    if start is not None and start != 0:
        raise ConfigError(f"--data-parallel-start-rank {start} requires --data-parallel-size-local.")
    span = c.data_parallel_backend == "ray" and env.get("VLLM_RAY_DP_PACK_STRATEGY") == "span"
    return _Parallel(rank=0, local=1 if span else dp, external=False, hybrid=False, warnings=warnings)


def _check_ranks(c: ServeConfig, headless: bool, par: _Parallel) -> None:
    """R8: the resolved rank range fits the deployment."""
    dp, rank, local, external = c.data_parallel_size, par.rank, par.local, par.external
    if local > dp:
        raise ConfigError(f"--data-parallel-size-local ({local}) must be <= --data-parallel-size ({dp}).")
    if external and dp <= 1:
        raise ConfigError(f"external data-parallel mode requires --data-parallel-size > 1 (got {dp}).")
    if (dp > 1 or local == 0) and not 0 <= rank < dp:
        raise ConfigError(f"data-parallel rank {rank} must be in the range [0, {dp}).")
    if not external and rank + local > dp:
        raise ConfigError(f"--data-parallel-start-rank {rank} plus --data-parallel-size-local {local} exceeds "
                          f"--data-parallel-size {dp}.")
    if headless and local <= 0:
        raise ConfigError(f"--data-parallel-size-local must be > 0 on a headless node (got {local}).")
    if dp > 1 and not (external or par.hybrid or headless) and rank != 0:
        raise ConfigError(f"this node owns ranks {rank}..{rank + local - 1} but only the head (rank 0) runs API "
                          "servers in internal LB mode; add --headless, or use --data-parallel-hybrid-lb.")


def _check_devices(c: ServeConfig, local: int) -> None:
    need = local * c.tensor_parallel_size * c.pipeline_parallel_size
    if c.device_ids is not None and len(c.device_ids) < need:
        raise ConfigError(f"--device-ids lists {len(c.device_ids)} devices; {local} ranks x tp*pp need {need}.")


def _expert_checks(c: ServeConfig, *, is_moe: bool, num_experts: int, warnings: list[str]) -> bool:
    c.vllm.check_eplb(enable_expert_parallel=c.enable_expert_parallel,
                      ep_size=c.data_parallel_size * c.tensor_parallel_size)
    if not c.enable_expert_parallel:
        return False
    if not is_moe:
        warnings.append("--enable-expert-parallel ignored: model has no experts.")  # V24
        return False
    ep_size = c.data_parallel_size * c.tensor_parallel_size
    if ep_size > num_experts:
        raise ConfigError(f"expert-parallel size (dp*tp = {ep_size}) exceeds the number of experts ({num_experts}).")
    return True


def _multi_port_children(c: ServeConfig, *, is_moe: bool) -> tuple[int, list[ServeConfig]]:
    """M1-M14 (§4.1) and the child derivation of §11.3. Returns the start rank and the unresolved child configs."""
    local, dp = c.data_parallel_size_local, c.data_parallel_size
    flag = "--data-parallel-multi-port-external-lb"
    if c.uds is not None:
        raise ConfigError(f"{flag} does not support --uds.")
    if c.headless or c.api_server_count not in (None, 1):
        got = 0 if c.headless else c.api_server_count
        raise ConfigError(f"{flag} requires --api-server-count=1 (got {got}{', --headless' if c.headless else ''}).")
    if c.data_parallel_rank is not None:
        raise ConfigError(f"{flag} manages child --data-parallel-rank values itself "
                          f"(got --data-parallel-rank {c.data_parallel_rank}).")
    if c.data_parallel_external_lb or c.data_parallel_hybrid_lb:
        raise ConfigError(f"{flag} cannot be combined with --data-parallel-external-lb or --data-parallel-hybrid-lb.")
    if dp < 2:
        raise ConfigError(f"{flag} requires --data-parallel-size > 1 (got {dp}).")
    if local is None or local < 2:
        raise ConfigError(f"{flag} requires --data-parallel-size-local >= 2 (got {local}).")
    if local > dp:
        raise ConfigError(f"--data-parallel-size-local cannot exceed --data-parallel-size ({local} > {dp}).")
    if dp % local != 0:
        raise ConfigError(f"--data-parallel-size must be divisible by --data-parallel-size-local ({dp} % {local} != 0).")
    start = c.data_parallel_start_rank if c.data_parallel_start_rank is not None else c.node_rank * local
    if start + local > dp:
        raise ConfigError(f"multi-port supervised ranks {start}..{start + local - 1} would exceed "
                          f"--data-parallel-size {dp}.")
    if c.port == 0:  # child i serves --port + i: port 0 would give rank 0 a random port, rank 1 port 1, ...
        raise ConfigError(f"{flag} serves local rank i on --port + i: give a fixed --port, not 0.")
    first, last = c.port, c.port + local - 1
    if first <= c.data_parallel_supervisor_port <= last:
        raise ConfigError(f"--data-parallel-supervisor-port {c.data_parallel_supervisor_port} overlaps with "
                          f"child rank ports {first}-{last}.")
    if last > 65535:
        raise ConfigError(f"child ports {first}-{last} exceed 65535.")
    _check_devices(c, local)
    if not is_moe:  # M14: every child is an external rank
        raise ConfigError(_V9)
    per_rank = c.tensor_parallel_size * c.pipeline_parallel_size
    children = []
    for i in range(local):
        devices = (c.device_ids[i * per_rank:(i + 1) * per_rank] if c.device_ids is not None
                   else tuple(range(i * per_rank, (i + 1) * per_rank)))
        children.append(c.replace(
            port=c.port + i, data_parallel_rank=start + i, data_parallel_size_local=1, api_server_count=1,
            data_parallel_start_rank=None, data_parallel_hybrid_lb=False, data_parallel_external_lb=False,
            data_parallel_multi_port_external_lb=False, headless=False, device_ids=tuple(devices)))
    return start, children


def resolve(config: ServeConfig, *, is_moe: bool, num_experts: int,
            env: Mapping[str, str] | None = None) -> DeploymentConfig:
    """Derive the deployment from the flags and the model's facts (spec §3). Pure; raises ConfigError.

    ``env`` is only consulted for ``VLLM_RAY_DP_PACK_STRATEGY`` (defaults to ``os.environ``).
    """
    env = environ() if env is None else env
    c = config
    if c.enable_auto_tool_choice and c.tool_call_parser is None:  # vLLM refuses it too
        raise ConfigError(f"--enable-auto-tool-choice requires --tool-call-parser (one of "
                          f"{', '.join(TOOL_CALL_PARSERS)}): the parser that finds the tool calls in the model's text.")
    address = c.data_parallel_address or c.master_addr or "127.0.0.1"  # R9 (ray's node IP: ray is V22)
    common: dict[str, Any] = dict(
        dp_size=c.data_parallel_size, is_moe=is_moe, num_experts=num_experts,
        data_parallel_address=address, data_parallel_rpc_port=c.data_parallel_rpc_port,
        tensor_parallel_size=c.tensor_parallel_size, pipeline_parallel_size=c.pipeline_parallel_size,
        nnodes=c.nnodes, node_rank=c.node_rank)
    warnings: list[str] = []
    if c.data_parallel_multi_port_external_lb:
        start, unresolved = _multi_port_children(c, is_moe=is_moe)
        _pass1(c)
        children = tuple(ResolvedServeConfig.with_deployment(child, resolve(child, is_moe=is_moe,
                                                                             num_experts=num_experts, env=env))
                         for child in unresolved)
        ep = _expert_checks(c, is_moe=is_moe, num_experts=num_experts, warnings=warnings)
        return DeploymentConfig(
            mode="multi-port", dp_size_local=len(children), dp_start_rank=start, api_server_count=1,
            headless=False, external=False, hybrid=False, local_engines_only=True, enable_expert_parallel=ep,
            coordinator_here=False, managed_ranks=(), children=children, warnings=tuple(warnings), **common)

    layout = _pass1(c)
    par = _pass2(c, layout.headless, is_moe=is_moe, env=env)
    warnings.extend(par.warnings)
    _check_devices(c, par.local)
    ep = _expert_checks(c, is_moe=is_moe, num_experts=num_experts, warnings=warnings)
    if c.data_parallel_backend == "ray":
        raise ConfigError("--data-parallel-backend ray is not available in this build; use mp.")  # V22

    dp, rank, local = c.data_parallel_size, par.rank, par.local
    coordinator_needed = dp > 1 and (is_moe or not par.external)
    managed: tuple[int, ...]
    if layout.headless:
        mode, managed, coordinator_here = "headless", (), False
    elif par.external:
        mode, managed, coordinator_here = "external", (rank,), coordinator_needed and rank == 0
    elif par.hybrid:
        mode, managed = "hybrid", tuple(range(rank, rank + local))
        coordinator_here = coordinator_needed and rank == 0
    elif dp == 1 and local == 1:
        mode, managed, coordinator_here = "single", (0,), False
    else:
        mode, managed, coordinator_here = "internal", tuple(range(dp)), coordinator_needed
    return DeploymentConfig(
        mode=mode, dp_size_local=local, dp_start_rank=rank, api_server_count=layout.api_server_count,
        headless=layout.headless, external=par.external, hybrid=par.hybrid,
        local_engines_only=par.external or par.hybrid, enable_expert_parallel=ep,
        coordinator_here=coordinator_here, managed_ranks=managed, warnings=tuple(warnings), **common)
