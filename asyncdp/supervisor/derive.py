"""The command line of each child of the multi-port supervisor (spec §11.3), derived from the parent's. Pure.

A child is ``python -m asyncdp serve`` with the parent's arguments as the user typed them (the model, ``-dp``,
``-dpa``/``-dpp``, ``--host``, TLS, ``--shutdown-timeout``, engine flags ... pass through unchanged), minus the
flags that describe the supervisor or that the supervisor sets per child, plus
``--data-parallel-rank r --port p --data-parallel-size-local 1 --api-server-count 1 --device-ids ...``, and
``--torch-threads`` (the node's cores divided among the children, spec §5.5) unless the parent gives one.
The rank, port and devices come from the resolved deployment (:func:`asyncdp.config.deployment.resolve` derives
``DeploymentConfig.children``); this module only spells them. Every alias and ``_`` spelling of a removed flag is
recognised, in the ``--flag value``, ``--flag=value`` and (one-letter short flags) ``-n2`` forms; a test keeps
the tables below equal to the parser's aliases.

The child is told it is supervised by ``ASYNCDP_SUPERVISED_RANK=r`` in its environment: it then names itself
``asyncdp-api-dp{r}`` and logs as ``APIServer_DP{r}``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from asyncdp.config.deployment import DeploymentConfig, ResolvedServeConfig, threads_per_engine
from asyncdp.config.flags import SUPERVISED_RANK_ENV
from asyncdp.errors import ConfigError

# ``asyncdp serve`` arguments (without ``serve``) and an environment -> the resolved config (the CLI's parser).
ResolveArgs = Callable[[Sequence[str], Mapping[str, str]], ResolvedServeConfig]

# Switches (no value) that select multi-port mode: a child is a plain external-LB rank server.
STRIPPED_SWITCHES = frozenset({"--data-parallel-multi-port-external-lb", "-dpm"})
# Flags with a value that the supervisor sets per child, or that only the supervisor reads.
STRIPPED_WITH_VALUE = frozenset({
    "--port",
    "--data-parallel-size-local", "-dpl",
    "--data-parallel-start-rank", "-dpr",
    "--nnodes", "-n",
    "--node-rank", "-r",
    "--api-server-count", "-asc",
    "--data-parallel-supervisor-port",
    "--dp-supervisor-probe-interval-s",
    "--dp-supervisor-probe-timeout-s",
    "--dp-supervisor-probe-failure-threshold",
    "--device-ids",
})
# argparse also reads a one-letter short flag with its value attached: -n2, -r1.
_ATTACHED_SHORT = tuple(f for f in STRIPPED_WITH_VALUE if len(f) == 2)
TORCH_THREADS = "--torch-threads"


@dataclass(frozen=True, slots=True)
class ChildCommand:
    """How to start one supervised child: its rank and port (for probing and messages), argv and extra env."""

    dp_rank: int
    port: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # added to the supervisor's environment

    @property
    def serve_args(self) -> tuple[str, ...]:
        """The arguments after ``python -m asyncdp serve``."""
        return self.argv[4:] if self.argv[1:4] == ("-m", "asyncdp", "serve") else self.argv[1:]

    def describe(self, pid: int | None = None) -> str:
        where = f"child rank {self.dp_rank} (port {self.port}"
        return where + (")" if pid is None else f", pid {pid})")


def _flag_name(token: str) -> str:
    """``--flag_name=value`` -> ``--flag-name``; ``-dpl=2`` -> ``-dpl``; a non-flag token stays as it is."""
    name = token.partition("=")[0]
    return name.replace("_", "-") if name.startswith("--") else name


def strip_supervisor_flags(args: Sequence[str]) -> list[str]:
    """The parent's ``serve`` arguments without the flags in :data:`STRIPPED_SWITCHES` and
    :data:`STRIPPED_WITH_VALUE` (and their values). Everything after ``--`` is kept as it is."""
    out: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return out + list(args[i:])
        name = _flag_name(token)
        if name in STRIPPED_SWITCHES and "=" not in token:
            i += 1
        elif name in STRIPPED_WITH_VALUE:
            i += 1 if "=" in token else 2  # --flag=value, or --flag value
        elif _is_attached_short(token):
            i += 1  # -n2
        else:
            out.append(token)
            i += 1
    return out


def _is_attached_short(token: str) -> bool:
    """``-n2``/``-r1``: a one-letter short flag with its value attached (argparse's reading of such a token)."""
    return len(token) > 2 and not token.startswith("--") and token[:2] in _ATTACHED_SHORT


def child_torch_threads(cpu_count: int | None, num_children: int) -> int:
    """Torch intra-op threads per child: the node's cores divided among the children's engines (spec §5.5), as a
    launcher divides them among its node's engines. A child is a node of one rank, so left alone it would take
    every core, and L such engines stepping in lockstep oversubscribe the node (25x slower decoding, 2 ranks on 2
    cores). An unknown count (None) counts as one core."""
    return threads_per_engine(num_children, cpu_count or 1)


def gives_torch_threads(args: Sequence[str]) -> bool:
    """Whether ``args`` (before a ``--``) set ``--torch-threads`` in any spelling."""
    for token in args:
        if token == "--":
            return False
        if _flag_name(token) == TORCH_THREADS:
            return True
    return False


def child_serve_args(parent_args: Sequence[str], *, dp_rank: int, port: int,
                     device_ids: Sequence[int] | None, torch_threads: int | None = None) -> list[str]:
    """The ``serve`` arguments of the child for ``dp_rank`` on ``port``: the parent's, stripped, plus the
    per-child flags (before a ``--`` if the parent has one). ``torch_threads`` is added as ``--torch-threads``
    unless the parent gives that flag itself."""
    kept = strip_supervisor_flags(parent_args)
    extra = ["--data-parallel-rank", str(dp_rank), "--port", str(port), "--data-parallel-size-local", "1",
             "--api-server-count", "1"]
    if device_ids is not None:
        extra += ["--device-ids", ",".join(str(d) for d in device_ids)]
    if torch_threads is not None and not gives_torch_threads(parent_args):
        extra += [TORCH_THREADS, str(torch_threads)]
    if "--" in kept:
        cut = kept.index("--")
        return kept[:cut] + extra + kept[cut:]
    return kept + extra


def child_commands(parent_args: Sequence[str], deployment: DeploymentConfig, *, python: str = sys.executable,
                   cpu_count: int | None = None) -> tuple[ChildCommand, ...]:
    """One command per local rank of a resolved multi-port deployment (``deployment.children``), in rank order.

    The devices are always passed: the deployment gives child i ``--device-ids[i*tp*pp:(i+1)*tp*pp]``, or
    ``range(i*tp*pp, (i+1)*tp*pp)`` when the parent has none, and a child started without them would use the
    first devices of the node, like child 0. ``cpu_count`` (the node's cores; the supervisor passes them) adds
    ``--torch-threads`` (:func:`child_torch_threads`) unless the parent gives it; None adds nothing."""
    if deployment.mode != "multi-port":
        raise ValueError(f"child commands exist only in multi-port mode (got mode {deployment.mode!r})")
    threads = None if cpu_count is None else child_torch_threads(cpu_count, len(deployment.children))
    commands = []
    for child in deployment.children:
        rank = child.deployment.dp_rank
        args = child_serve_args(parent_args, dp_rank=rank, port=child.port, device_ids=child.device_ids,
                                torch_threads=threads)
        commands.append(ChildCommand(dp_rank=rank, port=child.port, argv=(python, "-m", "asyncdp", "serve", *args),
                                     env={SUPERVISED_RANK_ENV: str(rank)}))
    return tuple(commands)


def check_child_commands(commands: Sequence[ChildCommand], resolve_args: ResolveArgs) -> None:
    """Pass 2 on every child's derived arguments, before anything is spawned (§11.3): each must resolve to an
    external-LB server of its rank and port, one local rank, one API server. ConfigError otherwise (the
    resolver's own, or one naming the child)."""
    for command in commands:
        child = resolve_args(command.serve_args, command.env)
        d = child.deployment
        got = (d.mode, d.dp_rank, child.port, d.dp_size_local, d.api_server_count)
        if got != ("external", command.dp_rank, command.port, 1, 1):
            raise ConfigError(f"the derived command of {command.describe()} resolves to mode {d.mode}, rank "
                              f"{d.dp_rank}, port {child.port}, {d.dp_size_local} local rank(s), "
                              f"{d.api_server_count} API server(s): {' '.join(command.serve_args)}")
