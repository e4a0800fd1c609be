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
import dataclasses
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

from asyncdp.bench.command import add_bench_parser
from asyncdp.bench.command import run as run_bench
from asyncdp.config.deployment import ResolvedServeConfig, resolve
from asyncdp.config.files import check_tls_files
from asyncdp.config.flags import ServeConfig, json_strings
from asyncdp.config.generation_config import generation_notice, generation_source, resolve_generation_defaults
from asyncdp.config.serve_args import add_serve_flags
from asyncdp.dp.balance import make_policy
from asyncdp.errors import ConfigError
from asyncdp.router import command as route_command


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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="asyncdp", allow_abbrev=False,
                     description="Data-parallel LLM serving (vLLM-compatible DP deployment).")
    parser.add_argument("--version", action="version", version=f"asyncdp {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = sub.add_parser("serve", help="serve a model over the OpenAI API", allow_abbrev=False)
    add_serve_flags(serve)
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
    if config.chat_template is not None:  # read here too (exit 2): the API servers get its text
        from asyncdp.config.chat_template import read_chat_template
        config = config.replace(chat_template=read_chat_template(config.chat_template))
    from asyncdp.model.info import ModelInfo, check_fits_model  # JSON only, no torch

    model_fields = {}
    if isinstance(facts, ModelInfo):  # the checkpoint's limits and defaults (fakes in tests carry none)
        check_fits_model(config.engine, facts)
        model_fields = dict(facts.generation_defaults)
    config = with_generation_defaults(config, model_fields)
    deployment = resolve(config, is_moe=bool(facts.is_moe), num_experts=int(facts.num_experts), env=env)
    notice = generation_notice(config.vllm.generation_defaults, config.vllm.generation_config)
    notices = (*(() if notice is None else (notice,)),
               *config.vllm.notices(expert_parallel=deployment.enable_expert_parallel))
    if notices:  # said once before startup, with the deployment's own warnings (vLLM's warnings)
        deployment = dataclasses.replace(deployment, warnings=(*deployment.warnings, *notices))
    return ResolvedServeConfig.with_deployment(config, deployment)


def with_generation_defaults(config: ServeConfig, model_fields: dict[str, Any]) -> ServeConfig:
    """``config`` with the sampling defaults of ``--generation-config`` and ``--override-generation-config``
    resolved (``model_fields``: the checkpoint's) and checked here (exit 2), not in each API server."""
    from asyncdp.sampling_params import default_sampling_params

    flags, override = config.vllm, config.vllm.override()
    defaults = resolve_generation_defaults(flags.generation_config, override, model_fields)
    default_sampling_params(defaults, generation_source(flags.generation_config, override))  # (range checks)
    return config.replace(vllm=dataclasses.replace(flags, generation_defaults=defaults))


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
    # vLLM's other flags: a value that would change what asyncdp computes, or that needs machinery it lacks
    return config.vllm.unsupported_reason(expert_parallel=d.enable_expert_parallel)


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
