"""The supervised children's command lines (spec §11.3 "Ranks, ports, children"), and the env mark they get."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import pytest

from asyncdp.cli import build_parser, build_serve_config
from asyncdp.config.flags import SUPERVISED_RANK_ENV
from asyncdp.errors import ConfigError
from asyncdp.supervisor.derive import (
    STRIPPED_SWITCHES,
    STRIPPED_WITH_VALUE,
    check_child_commands,
    child_commands,
    child_serve_args,
    strip_supervisor_flags,
)


@dataclass(frozen=True)
class Facts:
    is_moe: bool
    num_experts: int


def moe(_name: str) -> Facts:
    return Facts(is_moe=True, num_experts=8)


def resolved(args: list[str], env: dict[str, str] | None = None):
    return build_serve_config(args, env=env or {}, model_facts=moe)


def commands(args: list[str]):
    return child_commands(args, resolved(args).deployment)


def serve_args(command) -> list[str]:
    assert command.argv[:4] == (sys.executable, "-m", "asyncdp", "serve")
    return list(command.serve_args)


def test_node_rank_1_with_4_local_ranks_derives_ranks_4_to_7_on_consecutive_ports():
    cmds = commands(["builtin:tiny-moe", "-dp", "8", "-dpl", "4", "--nnodes", "2", "--node-rank", "1", "-dpm",
                     "--port", "8000"])
    assert [(c.dp_rank, c.port) for c in cmds] == [(4 + i, 8000 + i) for i in range(4)]
    for i, c in enumerate(cmds):
        assert serve_args(c) == ["builtin:tiny-moe", "-dp", "8", "--data-parallel-rank", str(4 + i), "--port",
                                 str(8000 + i), "--data-parallel-size-local", "1", "--api-server-count", "1",
                                 "--device-ids", str(i)]
        assert c.env == {SUPERVISED_RANK_ENV: str(4 + i)}


def test_start_rank_8_child_2_on_port_8000_is_rank_10_on_port_8002():
    cmds = commands(["-dp", "16", "-dpl", "4", "-dpr", "8", "-dpm", "--port", "8000"])
    assert (cmds[2].dp_rank, cmds[2].port) == (10, 8002)
    assert serve_args(cmds[2])[:8] == ["-dp", "16", "--data-parallel-rank", "10", "--port", "8002",
                                       "--data-parallel-size-local", "1"]


@pytest.mark.parametrize("spelling", [
    ["--data-parallel-multi-port-external-lb", "--port", "9000", "--data-parallel-size-local", "2",
     "--data-parallel-start-rank", "2", "--api-server-count", "1", "--nnodes", "2", "--node-rank", "1"],
    ["--data_parallel_multi_port_external_lb", "--port=9000", "--data_parallel_size_local=2",
     "--data_parallel_start_rank", "2", "--api_server_count=1", "--nnodes=2", "--node_rank=1"],
    ["-dpm", "--port", "9000", "-dpl", "2", "-dpr", "2", "-asc", "1", "-n", "2", "-r", "1"],
    ["-dpm", "--port=9000", "-dpl=2", "-dpr=2", "-asc=1", "-n2", "-r1"],
])
def test_every_spelling_of_the_supervisor_flags_is_stripped(spelling):
    kept = ["builtin:tiny-moe", "-dp", "4", "--host", "127.0.0.1", "--shutdown-timeout", "3", "-dpa", "10.0.0.1"]
    supervisor_only = ["--data-parallel-supervisor-port", "9356", "--dp-supervisor-probe-interval-s=1",
                       "--dp_supervisor_probe_timeout_s", "2", "--dp-supervisor-probe-failure-threshold", "4",
                       "--device-ids", "0,1"]
    args = kept[:3] + spelling + kept[3:] + supervisor_only
    assert strip_supervisor_flags(args) == kept
    cmds = commands(args)
    assert [(c.dp_rank, c.port) for c in cmds] == [(2, 9000), (3, 9001)]


def test_each_derived_command_resolves_to_an_external_rank_server_for_its_rank_port_and_devices():
    args = ["builtin:tiny-moe", "-dp", "4", "-dpl", "2", "-dpr", "2", "-dpm", "--port", "8100",
            "--data-parallel-supervisor-port", "9356", "-dpa", "10.0.0.1", "-dpp", "29600", "--device-ids", "6,7",
            "--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem"]
    for c in commands(args):
        child = resolved(serve_args(c), env=dict(c.env))
        d = child.deployment
        assert (d.mode, d.dp_rank, d.dp_size, d.dp_size_local, d.api_server_count) == ("external", c.dp_rank, 4, 1, 1)
        assert (child.port, child.device_ids, child.supervised_rank) == (c.port, (6 + c.dp_rank - 2,), c.dp_rank)
        assert (d.data_parallel_address, d.data_parallel_rpc_port) == ("10.0.0.1", 29600)
        assert (child.ssl_keyfile, child.ssl_certfile) == ("k.pem", "c.pem")
        assert not child.data_parallel_multi_port_external_lb


def test_children_without_device_ids_get_their_own_devices_not_the_first():
    cmds = commands(["-dp", "4", "-dpl", "2", "-dpm", "-tp", "2"])
    assert [serve_args(c)[-1] for c in cmds] == ["0,1", "2,3"]


def test_per_child_flags_go_before_a_double_dash():
    out = child_serve_args(["m", "--port", "1", "--", "--port", "x"], dp_rank=3, port=8003, device_ids=None)
    assert out == ["m", "--data-parallel-rank", "3", "--port", "8003", "--data-parallel-size-local", "1",
                   "--api-server-count", "1", "--", "--port", "x"]


def test_child_commands_exist_only_in_multi_port_mode():
    with pytest.raises(ValueError, match="multi-port"):
        child_commands(["-dp", "2"], resolved(["-dp", "2"]).deployment)


def test_stripped_flag_tables_hold_every_alias_the_parser_knows():
    serve = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "serve" in a.choices)
    by_option = {o: a for a in serve.choices["serve"]._actions for o in a.option_strings}
    stripped = STRIPPED_SWITCHES | STRIPPED_WITH_VALUE
    for option in stripped:
        action = by_option[option]  # each name is a real flag ...
        assert set(action.option_strings) <= stripped, f"an alias of {option} is missing"  # ... with every alias
        assert (action.nargs == 0) == (option in STRIPPED_SWITCHES)
    probe_flags = {o for o in by_option if o.startswith("--dp-supervisor-probe-")}
    assert probe_flags and probe_flags <= stripped


def test_supervised_rank_comes_from_the_environment_only():
    assert resolved(["-dp", "2"]).supervised_rank is None
    assert resolved(["-dp", "2"], env={SUPERVISED_RANK_ENV: " 5 "}).supervised_rank == 5
    with pytest.raises(ConfigError, match=SUPERVISED_RANK_ENV):
        resolved(["-dp", "2"], env={SUPERVISED_RANK_ENV: "five"})
    with pytest.raises(ConfigError, match=SUPERVISED_RANK_ENV):
        resolved(["-dp", "2"], env={SUPERVISED_RANK_ENV: "-1"})


def resolve_args(args, env):
    return build_serve_config(list(args), env=dict(env), model_facts=moe)


def test_pass_2_on_the_derived_commands_accepts_them_and_names_a_child_that_resolves_elsewhere():
    cmds = commands(["-dp", "4", "-dpl", "2", "-dpr", "2", "-dpm", "--port", "8100"])
    check_child_commands(cmds, resolve_args)  # every child: external, its rank and port, 1 local rank, 1 server
    wrong = dataclasses.replace(cmds[1], port=8200)
    with pytest.raises(ConfigError, match=r"child rank 3 \(port 8200\) resolves to mode external, rank 3, port 8101"):
        check_child_commands([cmds[0], wrong], resolve_args)
    bad = dataclasses.replace(cmds[0], argv=(*cmds[0].argv, "--data-parallel-hybrid-lb"))
    with pytest.raises(ConfigError):  # the parser's own error: hybrid and an external rank
        check_child_commands([bad], resolve_args)
