"""The router's timeouts, connection pool, body limits and TLS files are flags: a bad value is one
``asyncdp: error: ...`` line naming the flag and exit status 2; left out, each keeps the value it had as a
constant."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from asyncdp.cli import build_parser, main
from asyncdp.router.command import settings_from
from asyncdp.router.settings import RouterSettings
from tests.router.route_process import route

EP = ("--endpoint", "http://h:1")


@pytest.mark.parametrize(("argv", "says"), [
    ([*EP, "--connect-timeout-s", "0"], "--connect-timeout-s must be a number of seconds > 0, got 0"),
    ([*EP, "--connect-timeout-s", "inf"], "--connect-timeout-s must be a number of seconds > 0"),
    ([*EP, "--connect-timeout-s", "soon"], "argument --connect-timeout-s: invalid float value"),
    ([*EP, "--poll-timeout-s", "-1"], "--poll-timeout-s must be a number of seconds > 0"),
    ([*EP, "--poll-timeout-s", "2"], "--poll-timeout-s (2) must be at most --stale-after-s (1)"),
    ([*EP, "--upstream-keepalive-s", "0"], "--upstream-keepalive-s must be a number of seconds > 0"),
    ([*EP, "--upstream-max-idle-connections", "-1"], "--upstream-max-idle-connections must be >= 0"),
    ([*EP, "--upstream-max-idle-connections", "2.5"], "argument --upstream-max-idle-connections: invalid int"),
    ([*EP, "--max-request-body-bytes", "1023"], "--max-request-body-bytes must be >= 1024, got 1023"),
    ([*EP, "--replay-buffer-bytes", "-1"], "--replay-buffer-bytes must be in 0..--max-request-body-bytes"),
    ([*EP, "--max-request-body-bytes", "2048", "--replay-buffer-bytes", "4096"], "--replay-buffer-bytes must be"),
    ([*EP, "--ssl-keyfile", "k.pem"], "--ssl-keyfile and --ssl-certfile must be provided together"),
    ([*EP, "--ssl-certfile", "c.pem"], "--ssl-keyfile and --ssl-certfile must be provided together"),
    ([*EP, "--ssl-certfile", "/nonexistent/c.pem", "--ssl-keyfile", "/nonexistent/k.pem"],
     "--ssl-certfile '/nonexistent/c.pem' is not a readable file"),
    ([*EP, "--upstream-ca-file", "/nonexistent/ca.pem"], "no --endpoint is an https:// URL"),
    (["--endpoint", "https://h:1", "--upstream-ca-file", "/nonexistent/ca.pem"],
     "--upstream-ca-file '/nonexistent/ca.pem' is not a readable file"),
])
def test_a_bad_value_is_one_error_line_naming_the_flag_and_exit_status_2(argv, says, capsys):
    assert main(["route", *argv]) == 2
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert out.out == "" and len(lines) == 1 and lines[0].startswith("asyncdp: error: ") and says in lines[0], out.err


def test_files_that_are_not_a_certificate_and_its_key_are_refused(tmp_path: Path, capsys) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert main(["route", "--endpoint", "https://h:1", "--ssl-certfile", str(junk), "--ssl-keyfile", str(junk)]) == 2
    assert "do not load as a certificate and its private key" in capsys.readouterr().err
    assert main(["route", "--endpoint", "https://h:1", "--upstream-ca-file", str(junk)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--upstream-ca-file" in err and "does not load as PEM CA certificates" in err


def test_left_out_each_keeps_the_value_it_had_as_a_constant() -> None:
    s = settings_from(build_parser().parse_args(["route", *EP]))
    assert (s.connect_timeout_s, s.poll_deadline_s, s.upstream_keepalive_s, s.upstream_max_idle_connections,
            s.max_request_body_bytes) == (5.0, 1.0, 2.0, 256, 64 * 1024 * 1024)
    assert s.replay_buffer_bytes == 1024 * 1024 and s.ssl_certfile is None and s.upstream_ca_file is None
    assert s.scheme == "http"


def test_the_poll_timeout_follows_stale_after_unless_given() -> None:
    parse = build_parser().parse_args
    assert settings_from(parse(["route", *EP, "--stale-after-s", "3"])).poll_deadline_s == 3.0
    s = settings_from(parse(["route", *EP, "--stale-after-s", "3", "--poll-timeout-s", "0.5"]))
    assert s.poll_deadline_s == 0.5


def test_given_values_become_settings() -> None:
    s = settings_from(build_parser().parse_args([
        "route", *EP, "--connect-timeout-s", "0.5", "--upstream-keepalive-s", "1", "--upstream-max-idle-connections",
        "0", "--max-request-body-bytes", "4096", "--replay-buffer-bytes", "0"]))
    assert s == RouterSettings(endpoints=("http://h:1",), connect_timeout_s=0.5, upstream_keepalive_s=1.0,
                               upstream_max_idle_connections=0, max_request_body_bytes=4096, replay_buffer_bytes=0)


def test_a_silent_endpoint_is_dropped_after_the_poll_timeout_given(tmp_path: Path) -> None:
    """An endpoint that accepts connections and never answers: the log names the --poll-timeout-s bound."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never accepts: the kernel completes connects
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with route(tmp_path / "router.log", url, args=("--poll-timeout-s", "0.2", "--stale-after-s", "5")) as router:
            assert router.stop() == 0
    assert f"endpoint {url} is not used: GET /load took more than 0.2 s" in router.log()
