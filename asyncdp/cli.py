"""The ``asyncdp`` command line: ``serve``, ``model export|list``, ``bench routing`` and ``route`` (delegated to
:mod:`asyncdp.bench.command`, :mod:`asyncdp.router.command`) and ``--version``.

Theory of operation: argv is normalised (``--data_parallel_size`` is ``--data-parallel-size``), parsed by argparse
into ``{field: value}`` with ``None`` for every flag not given, and handed to :meth:`ServeConfig.from_flags`
(range checks, env overrides). The model's facts (MoE or dense, number of experts) are read, then
:func:`asyncdp.config.deployment.resolve` derives the deployment (spec §3), paired with the flags in a
:class:`~asyncdp.config.deployment.ResolvedServeConfig`. Any :class:`~asyncdp.errors.ConfigError`, argparse errors
included, ends the command with one line ``asyncdp: error: <message>`` on stderr and exit code 2, before any child
process exists; so does a mode this build cannot run yet (:func:`unsupported_reason`: the launch table is
computed for it, not performed). Only then does ``serve`` call ``asyncdp.launcher.head.run_serve(config)``.

Heavy modules (model, launcher) are imported lazily so that ``--help`` and validation stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

from asyncdp.bench.command import add_bench_parser
from asyncdp.bench.command import run as run_bench
from asyncdp.config.deployment import ResolvedServeConfig, resolve
from asyncdp.config.flags import (
    DEFAULT_MODEL,
    DP_BACKENDS,
    HTTP_BACKENDS,
    LB_POLICIES,
    LOG_LEVELS,
    ServeConfig,
    check_tls_files,
    json_strings,
)
from asyncdp.dp.balance import make_policy
from asyncdp.errors import ConfigError
from asyncdp.router import command as route_command

_D = ServeConfig()  # defaults for help texts


class ModelFacts(Protocol):
    @property  # read-only, so frozen dataclasses (and ModelInfo) satisfy it
    def is_moe(self) -> bool: ...

    @property
    def num_experts(self) -> int: ...


ModelFactsFn = Callable[[str], ModelFacts]
RunServeFn = Callable[[ResolvedServeConfig], int]


class _Parser(argparse.ArgumentParser):
    """Argument errors become ConfigError, so every invalid command line reports the same single line."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """Spell ``--flag_name[=value]`` as ``--flag-name[=value]``; the value and everything after ``--`` stay."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + list(argv[i:])
        if token.startswith("--"):
            name, sep, value = token.partition("=")
            token = name.replace("_", "-") + sep + value
        out.append(token)
    return out


def _bool(group: Any, *names: str, help: str, dest: str | None = None) -> None:
    group.add_argument(*names, action=argparse.BooleanOptionalAction, default=None, dest=dest, help=help)


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    """Every ``asyncdp serve`` flag, one argument group per section of spec §2."""
    p.add_argument("model_arg", nargs="?", metavar="MODEL", default=None,
                   help=f"built-in model name or Hugging Face checkpoint directory (default: {DEFAULT_MODEL})")
    p.add_argument("--model", default=None, help="same as the positional MODEL")
    _add_topology_flags(p.add_argument_group("data-parallel topology"))
    _add_front_end_flags(p.add_argument_group("front-end and processes"))
    _add_supervisor_flags(p.add_argument_group("multi-port supervisor"))
    _add_tuning_flags(p.add_argument_group("asyncdp data-parallel tuning"))
    _add_engine_flags(p.add_argument_group("engine"))


def _add_topology_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--data-parallel-size", "-dp", type=int, default=None, metavar="N",
                   help="global number of data-parallel ranks (engine replicas) (default: 1)")
    g.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None, metavar="L",
                   help="data-parallel ranks on this node; 0 = API-only head (default: derived)")
    g.add_argument("--data-parallel-rank", "-dpn", type=int, default=None, metavar="R",
                   help="run this process as the single external-LB rank R (MoE models only)")
    g.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=None, metavar="S",
                   help="global rank of the first local rank; selects hybrid LB unless --headless (0 counts too)")
    g.add_argument("--data-parallel-address", "-dpa", default=None, metavar="HOST",
                   help="head-node address for the handshake and the DP process group "
                        "(default: --master-addr, then 127.0.0.1)")
    g.add_argument("--data-parallel-rpc-port", "-dpp", type=int, default=None, metavar="PORT",
                   help=f"head-node TCP handshake port (default: {_D.data_parallel_rpc_port})")
    g.add_argument("--data-parallel-backend", "-dpb", default=None, metavar="{" + ",".join(DP_BACKENDS) + "}",
                   help="process backend; ray is not available in this build (default: mp)")
    _bool(g, "--data-parallel-hybrid-lb", "-dph",
          help="hybrid LB: each node's API servers balance over its own local ranks S..S+L-1 only. "
               "Rank hints (X-data-parallel-rank) are local indices in [0, L) (default: off)")
    _bool(g, "--data-parallel-external-lb", "-dpe",
          help="external LB: one API endpoint per rank, set with --data-parallel-rank (default: off)")
    g.add_argument("--data-parallel-multi-port-external-lb", "-dpm", action="store_true", default=None,
                   help="multi-port supervisor: one child API server per local rank on consecutive ports "
                        "--port .. --port+L-1")
    _bool(g, "--enable-expert-parallel", "-ep",
          help="shard MoE experts by expert across DP x TP ranks (default: off)")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=None, metavar="N",
                   help="tensor-parallel size per rank (default: 1)")
    g.add_argument("--pipeline-parallel-size", "-pp", type=int, default=None, metavar="N",
                   help="pipeline-parallel size per rank (default: 1)")
    g.add_argument("--nnodes", "-n", type=int, default=None, metavar="N",
                   help="number of nodes; lets asyncdp infer this node's ranks (default: 1)")
    g.add_argument("--node-rank", "-r", type=int, default=None, metavar="I",
                   help="index of this node, < --nnodes when --nnodes > 1; with -dpm and no -dpr the node's first "
                        "rank is node-rank x L (default: 0)")
    g.add_argument("--master-addr", default=None, metavar="HOST",
                   help=f"fallback for --data-parallel-address (default: {_D.master_addr})")
    g.add_argument("--master-port", type=int, default=None, metavar="PORT",
                   help=f"rendezvous port of a multi-node TP/PP group, not used for DP (default: {_D.master_port})")
    g.add_argument("--prefill-schedule-interval", type=int, default=None, metavar="N",
                   help="MoE DP prefill cadence in steps; 1 = off (default: 1)")
    g.add_argument("--cpu-distributed-timeout-seconds", type=int, default=None, metavar="S",
                   help="timeout of the CPU (gloo) groups, including the DP control group (default: torch's)")
    _bool(g, "--disable-nccl-for-dp-synchronization",
          help="run the per-forward token-count exchange on the gloo group even on GPU (default: off)")
    g.add_argument("--device-ids", default=None, metavar="IDS",
                   help="devices relative to the visible set, e.g. 0,1,2,3; local rank i uses "
                        "[i*tp*pp, (i+1)*tp*pp)")


def _add_front_end_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--host", default=None, help="HTTP bind host (default: all interfaces)")
    g.add_argument("--port", type=int, default=None,
                   help=f"HTTP port; in multi-port mode the port of local rank 0 (default: {_D.port})")
    g.add_argument("--uds", default=None, metavar="PATH", help="serve HTTP on a Unix domain socket")
    g.add_argument("--headless", action="store_true", default=None,
                   help="engines only: no API server and no coordinator on this node")
    g.add_argument("--api-server-count", "-asc", type=int, default=None, metavar="C",
                   help="API-server processes sharing --port; 0 behaves as --headless (default: per mode)")
    g.add_argument("--shutdown-timeout", dest="shutdown_timeout_s", type=int, default=None, metavar="S",
                   help="0 = abort in-flight requests at shutdown; > 0 = drain for up to S seconds (default: 0)")
    g.add_argument("--ssl-keyfile", default=None, help="TLS key file (requires --ssl-certfile)")
    g.add_argument("--ssl-certfile", default=None, help="TLS certificate file (requires --ssl-keyfile)")
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model name(s) in the API; the first is reported (default: MODEL)")
    g.add_argument("--max-queued-requests", type=int, default=None, metavar="N",
                   help="admission limit per API server; above it requests get HTTP 429 (default: unlimited)")
    g.add_argument("--max-seqs-per-request", type=int, default=None, metavar="N",
                   help="most sequences one request may run, prompts x max(n, best_of); above it HTTP 400 "
                        f"(default: {_D.max_seqs_per_request})")
    g.add_argument("--max-request-body-bytes", type=int, default=None, metavar="BYTES",
                   help="largest request body, checked before parsing; above it HTTP 413 (default: 64 bytes "
                        "per token of --max-model-len, at least 16 MiB)")
    for flag, what in (("--allowed-origins", "origins"), ("--allowed-methods", "methods"),
                       ("--allowed-headers", "request headers")):
        g.add_argument(flag, default=None, metavar="JSON",
                       help=f"CORS: the {what} cross-origin requests may use, a JSON list; \"*\" allows any "
                            '(default: ["*"])')
    _bool(g, "--allow-credentials", help="CORS: allow credentials (cookies, Authorization) on cross-origin requests "
                                         "(default: false)")
    g.add_argument("--api-key", default=None, metavar="KEY",
                   help="answer 401 unless 'Authorization: Bearer KEY' comes with the request, on every route but "
                        "/health, /ping, /version, /metrics, /load and /openapi.json; the environment variable "
                        "ASYNCDP_API_KEY (or VLLM_API_KEY) keeps it out of the process list (default: no key)")
    g.add_argument("--backend", default=None, metavar="{" + ",".join(HTTP_BACKENDS) + "}",
                   help=f"anyio backend of every process (default: {_D.backend})")
    g.add_argument("--lb-policy", "--dp-lb-policy", dest="lb_policy", default=None,
                   metavar="POLICY",
                   help=f"client load-balancing policy, one of {', '.join(LB_POLICIES)}; "
                        f"env ASYNCDP_DP_LB_POLICY (default: {_D.lb_policy})")
    g.add_argument("--log-level", default=None, metavar="{" + ",".join(LOG_LEVELS) + "}",
                   help=f"log level (default: {_D.log_level})")


def _add_supervisor_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--data-parallel-supervisor-port", type=int, default=None, metavar="PORT",
                   help=f"port of the aggregated /health, /ready, /readyz (default: {_D.data_parallel_supervisor_port})")
    g.add_argument("--dp-supervisor-probe-interval-s", type=float, default=None, metavar="S",
                   help="time between probe rounds, and between retries of a failed connection (default: 5.0)")
    g.add_argument("--dp-supervisor-probe-timeout-s", type=float, default=None, metavar="S",
                   help="request timeout: total time of one probe HTTP request, connect plus response "
                        "(default: 5.0)")
    g.add_argument("--dp-supervisor-probe-failure-threshold", type=int, default=None, metavar="N",
                   help="connection attempts per probe once the node is ready; 1 before (default: 3)")


def _add_tuning_flags(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--dp-sync-interval", type=int, default=None, metavar="STEPS",
                   help="MoE: steps between group 'unfinished' all-reduces; env ASYNCDP_DP_SYNC_INTERVAL "
                        f"(default: {_D.dp_sync_interval})")
    g.add_argument("--dp-coordinator-startup-timeout-s", type=float, default=None, metavar="S",
                   help="time allowed for the coordinator to report its addresses; env "
                        f"ASYNCDP_DP_COORDINATOR_STARTUP_TIMEOUT_S (default: {_D.dp_coordinator_startup_timeout_s})")
    g.add_argument("--engine-ready-timeout-s", type=float, default=None, metavar="S",
                   help="time a client waits for EngineReady from all its ranks; env ASYNCDP_ENGINE_READY_TIMEOUT_S, "
                        f"then VLLM_ENGINE_READY_TIMEOUT_S (default: {_D.engine_ready_timeout_s})")
    g.add_argument("--dp-heartbeat-interval-s", type=float, default=None, metavar="S",
                   help="interval of liveness heartbeats; env ASYNCDP_DP_HEARTBEAT_INTERVAL_S "
                        f"(default: {_D.dp_heartbeat_interval_s})")
    g.add_argument("--dp-heartbeat-timeout-s", type=float, default=None, metavar="S",
                   help="silence after which a peer is dead, > 2x the interval; env ASYNCDP_DP_HEARTBEAT_TIMEOUT_S "
                        f"(default: {_D.dp_heartbeat_timeout_s})")
    _bool(g, "--dp-fail-fast",
          help="dense only: tear the deployment down when any rank dies instead of degrading (default: off)")


def _add_engine_flags(g: argparse._ArgumentGroup) -> None:
    e = _D.engine
    g.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the model's)")
    g.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                   help=f"most sequences per step (default: {e.max_num_seqs})")
    g.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="N",
                   help=f"most tokens per step (default: {e.max_num_batched_tokens})")
    g.add_argument("--max-model-len", type=int, default=None, metavar="N",
                   help="longest prompt plus output, in tokens (default: the model's limit)")
    g.add_argument("--block-size", type=int, default=None, metavar="N", help=f"KV-cache block size (default: {e.block_size})")
    g.add_argument("--num-kv-blocks", type=int, default=None, metavar="N",
                   help="KV-cache blocks per rank (default: from --kv-cache-memory-bytes)")
    g.add_argument("--kv-cache-memory-bytes", type=int, default=None, metavar="BYTES",
                   help=f"KV-cache memory per rank when --num-kv-blocks is not given, capped at what --max-num-seqs "
                        f"full-length sequences use (default: {e.kv_cache_memory_bytes})")
    _bool(g, "--enable-prefix-caching", help="reuse cached KV blocks of shared prompt prefixes (default: on)")
    g.add_argument("--seed", type=int, default=None, help=f"sampling seed (default: {e.seed})")
    g.add_argument("--dtype", default=None, metavar="{auto,float32,bfloat16,float16}",
                   help="model weight and activation dtype (default: auto)")
    g.add_argument("--device", default=None, metavar="{auto,cpu,cuda}",
                   help="execution device (default: auto)")
    g.add_argument("--executor", default=None, metavar="{torch,sim}",
                   help="torch runs the model; sim simulates step times with --sim-cost (default: torch)")
    g.add_argument("--sim-cost", default=None, metavar="A,B,C,D[,E]",
                   help="sim step time in ms: a + b*prefill_tokens + c*decode_seqs + d*kv_tokens "
                        "(+ e*sum of p*(c0 + p/2) over the prefill chunks of p tokens after c0 of context)")
    g.add_argument("--torch-threads", type=int, default=None, metavar="N",
                   help="torch intra-op threads per engine (default: torch's)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="asyncdp", allow_abbrev=False,
                     description="Data-parallel LLM serving (vLLM-compatible DP deployment).")
    parser.add_argument("--version", action="version", version=f"asyncdp {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser("serve", help="serve a model over the OpenAI API", allow_abbrev=False)
    _add_serve_flags(serve)
    model = sub.add_parser("model", help="built-in models")
    msub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    export = msub.add_parser("export", help="write a built-in model as a Hugging Face checkpoint directory")
    export.add_argument("name")
    export.add_argument("dir")
    msub.add_parser("list", help="list the built-in models")
    add_bench_parser(sub)
    route_command.add_route_parser(sub)
    return parser


def _version() -> str:
    from asyncdp.version import __version__

    return __version__


def _serve_flags(ns: argparse.Namespace) -> dict[str, Any]:
    flags = {k: v for k, v in vars(ns).items() if k not in ("command", "model_arg")}
    if ns.model_arg is not None:
        if ns.model is not None and ns.model != ns.model_arg:
            raise ConfigError(f"the model is given twice: {ns.model_arg!r} and --model {ns.model!r}; give one.")
        flags["model"] = ns.model_arg
    for dest in ("allowed_origins", "allowed_methods", "allowed_headers"):
        if flags.get(dest) is not None:
            flags[dest] = json_strings("--" + dest.replace("_", "-"), flags[dest])
    if ns.device_ids is not None:
        try:
            flags["device_ids"] = [int(x) for x in ns.device_ids.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--device-ids must be integers such as 0,1,2,3 (got {ns.device_ids!r}).") from None
    return flags


def default_model_facts(name: str) -> ModelFacts:
    from asyncdp.model import read_model_info, resolve_model

    return read_model_info(resolve_model(name))


def build_serve_config(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                       model_facts: ModelFactsFn | None = None) -> ResolvedServeConfig:
    """Parse ``asyncdp serve`` arguments (without ``serve``) into a validated, resolved ServeConfig, its
    ``deployment`` set. Raises ConfigError for anything invalid (spec §4.1)."""
    ns = build_parser().parse_args(["serve", *normalize_argv(argv)])
    config = ServeConfig.from_flags(_serve_flags(ns), env=env)
    make_policy(config.lb_policy)  # a preset name is checked here (the flag check knows base names only)
    facts = (model_facts or default_model_facts)(config.model)
    if config.engine.tokenizer:
        from asyncdp.model import check_tokenizer
        check_tokenizer(config.engine.tokenizer)  # here (exit 2), not in each API server once the engines loaded
    from asyncdp.model.info import ModelInfo, check_fits_model  # JSON only, no torch

    if isinstance(facts, ModelInfo):  # the checkpoint's limits (fakes in tests carry none)
        check_fits_model(config.engine, facts)
    deployment = resolve(config, is_moe=bool(facts.is_moe), num_experts=int(facts.num_experts), env=env)
    return ResolvedServeConfig.with_deployment(config, deployment)


def unsupported_reason(config: ResolvedServeConfig) -> str | None:
    """What this build cannot run yet (validated already), or None. Checked before anything starts.

    The message names only flags the command line (or the environment) set, and says what to change: this build
    runs every data-parallel mode (internal, hybrid, external, multi-port), one device per rank."""
    d = config.deployment
    if config.uds is not None:
        return "--uds is not supported in this build yet; serve on TCP instead: drop --uds (and pass --host/--port)"
    sharded = _passed(config, ("--tensor-parallel-size", d.tensor_parallel_size > 1 and d.tensor_parallel_size),
                      ("--pipeline-parallel-size", d.pipeline_parallel_size > 1 and d.pipeline_parallel_size))
    if sharded:  # no engine shards a rank yet
        what = " and ".join(f.split("-")[2] for f in sharded)
        return (f"{what} parallelism ({', '.join(sharded)}) is not supported in this build yet; each "
                f"data-parallel rank runs on one device: drop {_names(sharded)}")
    return None


def _names(passed: list[str]) -> str:
    """``["--nnodes 2", "--data-parallel-size-local 2"]`` -> ``"--nnodes and --data-parallel-size-local"``."""
    return " and ".join(flag.split()[0] for flag in passed)


def _passed(config: ServeConfig, *flags: tuple[str, object]) -> list[str]:
    """``--flag value`` (or ``--flag`` for a switch) for each flag whose value is set, in the order given."""
    out = []
    for flag, value in flags:
        if value is True:
            out.append(flag)
        elif value is not None and value is not False:
            out.append(f"{flag} {value}")
    return out


def _run_model_command(ns: argparse.Namespace) -> int:
    model = importlib.import_module("asyncdp.model")  # through sys.modules: tests substitute a fake package

    if ns.model_command == "export":
        try:
            print(model.export_builtin(ns.name, Path(ns.dir)))
        except OSError as exc:  # the model name was checked first: an unknown one is a ConfigError (exit 2)
            print(f"asyncdp: error: cannot write the checkpoint into {ns.dir}: {exc}", file=sys.stderr)
            return 1
        return 0
    for name in model.builtin_names():
        print(name)
    return 0


def main(argv: Sequence[str] | None = None, *, model_facts: ModelFactsFn | None = None,
         run_serve: RunServeFn | None = None, env: Mapping[str, str] | None = None) -> int:
    """Entry point of ``asyncdp``; returns the exit code (2 for an invalid command line)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["serve"]:
            config = build_serve_config(argv[1:], env=env, model_facts=model_facts)
            for warning in config.deployment.warnings:
                print(f"asyncdp: warning: {warning}", file=sys.stderr)
            reason = unsupported_reason(config)
            if reason is not None:
                raise ConfigError(reason)
            if config.ssl_certfile and config.ssl_keyfile:  # now, not in the API servers once the engines loaded
                check_tls_files(config.ssl_certfile, config.ssl_keyfile)
        else:
            ns = build_parser().parse_args(normalize_argv(argv))
            if ns.command == "bench":
                return run_bench(ns)
            if ns.command == "route":
                return route_command.run(ns)
            return _run_model_command(ns)
    except ConfigError as exc:
        print(f"asyncdp: error: {exc}", file=sys.stderr)
        return 2
    if run_serve is None and config.deployment.mode == "multi-port":
        from asyncdp.config.flags import environ
        from asyncdp.supervisor.process import run_supervisor

        def resolve_child(args: Sequence[str], extra_env: Mapping[str, str]) -> ResolvedServeConfig:
            return build_serve_config(list(args), env={**environ(), **extra_env}, model_facts=model_facts)

        try:
            return run_supervisor(config, argv[1:], resolve_args=resolve_child)
        except ConfigError as exc:
            print(f"asyncdp: error: {exc}", file=sys.stderr)
            return 2
    if run_serve is None:
        from asyncdp.launcher.head import run_serve as launcher_run_serve

        run_serve = launcher_run_serve
    return int(run_serve(config))
