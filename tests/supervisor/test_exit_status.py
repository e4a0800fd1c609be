"""The supervisor's exit status and settings (spec §11.3 "Exit status", §2.3), as plain functions."""

from __future__ import annotations

from dataclasses import dataclass

from asyncdp.cli import build_serve_config
from asyncdp.supervisor.children import describe_exit
from asyncdp.supervisor.process import exit_status
from asyncdp.supervisor.settings import SupervisorSettings


def test_exit_status_is_0_only_after_a_signal_with_every_child_exiting_0_by_itself():
    assert exit_status(failed=False, signalled=True, killed=False, child_codes=[0, 0]) == 0
    assert exit_status(failed=False, signalled=True, killed=False, child_codes=[0, 1]) == 1
    assert exit_status(failed=False, signalled=True, killed=False, child_codes=[0, -15]) == 1
    assert exit_status(failed=False, signalled=True, killed=True, child_codes=[0, -9]) == 1
    assert exit_status(failed=True, signalled=True, killed=False, child_codes=[0, 0]) == 1
    assert exit_status(failed=True, signalled=False, killed=False, child_codes=[0, 0]) == 1
    assert exit_status(failed=False, signalled=False, killed=False, child_codes=[]) == 1


def test_an_exit_is_described_by_its_status_or_its_signal():
    assert [describe_exit(c) for c in (0, 1, -9, -15)] == ["status 0", "status 1", "signal SIGKILL",
                                                           "signal SIGTERM"]


@dataclass(frozen=True)
class Facts:
    is_moe: bool = True
    num_experts: int = 8


def test_settings_come_from_the_supervisor_flags_host_tls_and_shutdown_timeout():
    config = build_serve_config(
        ["-dp", "4", "-dpl", "2", "-dpm", "--port", "8000", "--data-parallel-supervisor-port", "9300",
         "--dp-supervisor-probe-interval-s", "1", "--dp-supervisor-probe-timeout-s", "2",
         "--dp-supervisor-probe-failure-threshold", "4", "--host", "0.0.0.0", "--shutdown-timeout", "10",
         "--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem", "--backend", "trio"],
        env={}, model_facts=lambda _n: Facts())
    s = SupervisorSettings.from_config(config)
    assert (s.supervisor_port, s.probe_interval_s, s.probe_timeout_s, s.probe_failure_threshold) == (9300, 1, 2, 4)
    assert (s.host, s.shutdown_timeout_s, s.stop_grace_s, s.backend) == ("0.0.0.0", 10, 15, "trio")
    assert (s.tls, s.scheme, s.ssl_keyfile, s.ssl_certfile) == (True, "https", "k.pem", "c.pem")
    assert SupervisorSettings().stop_grace_s == 5 and SupervisorSettings().scheme == "http"
