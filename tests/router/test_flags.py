"""``asyncdp route`` refuses a bad command line with one ``asyncdp: error: ...`` line and exit status 2, before
anything starts; good flags become RouterSettings."""

from __future__ import annotations

import re

import pytest

from asyncdp.cli import build_parser, main
from asyncdp.router.command import settings_from
from asyncdp.router.settings import RouterSettings


@pytest.mark.parametrize(("argv", "says"), [
    ([], "give at least one --endpoint"),
    (["--endpoint", "127.0.0.1:8000"], "--endpoint must be a base URL"),
    (["--endpoint", "http://127.0.0.1"], "--endpoint must be a base URL"),
    (["--endpoint", "ftp://127.0.0.1:21"], "--endpoint must be a base URL"),
    (["--endpoint", "http://127.0.0.1:8000/v1"], "--endpoint must be a base URL"),
    (["--endpoint", "http://127.0.0.1:8000?x=1"], "--endpoint must be a base URL"),
    (["--endpoint", "http://127.0.0.1:99999"], "--endpoint must be a base URL"),
    (["--endpoint", "http://127.0.0.1:0"], "--endpoint must be a base URL"),
    (["--endpoint", "http://h:1", "--endpoint", "http://H:1/"], "is given twice"),
    (["--endpoint", "http://h:1", "--poll-interval-s", "0"], "--poll-interval-s must be a number of seconds > 0"),
    (["--endpoint", "http://h:1", "--poll-interval-s", "nan"], "--poll-interval-s must be"),
    (["--endpoint", "http://h:1", "--stale-after-s", "-1"], "--stale-after-s must be a number of seconds > 0"),
    (["--endpoint", "http://h:1", "--stale-after-s", "0.01"], "must be at least --poll-interval-s"),
    (["--endpoint", "http://h:1", "--shutdown-timeout", "-1"], "--shutdown-timeout must be"),
    (["--endpoint", "http://h:1", "--port", "70000"], "--port must be in 0..65535"),
    (["--endpoint", "http://h:1", "--poll-interval-s", "fast"], "invalid float value"),
    (["--endpoint", "http://h:1", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_bad_flag_is_one_error_line_and_exit_status_2(argv, says, capsys):
    assert main(["route", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("asyncdp: error: ") and says in lines[0], out.err


def test_good_flags_become_settings_with_normalised_urls():
    ns = build_parser().parse_args(["route", "--endpoint", "http://127.0.0.1:8000/", "--endpoint",
                                    "HTTPS://Example.com:8443", "--host", "127.0.0.1", "--port", "0",
                                    "--poll-interval-s", "0.1", "--stale-after-s", "2", "--shutdown-timeout", "30"])
    assert settings_from(ns) == RouterSettings(endpoints=("http://127.0.0.1:8000", "https://example.com:8443"),
                                               host="127.0.0.1", port=0, poll_interval_s=0.1, stale_after_s=2.0,
                                               shutdown_timeout_s=30.0)


def test_the_defaults_poll_every_50_ms_and_drop_endpoints_silent_for_a_second():
    s = settings_from(build_parser().parse_args(["route", "--endpoint", "http://[::1]:8000"]))
    assert (s.endpoints, s.host, s.port, s.poll_interval_s, s.stale_after_s, s.shutdown_timeout_s) == (
        ("http://[::1]:8000",), "0.0.0.0", 8000, 0.05, 1.0, 0.0)


def test_every_route_flag_is_in_the_reference_with_its_default(monkeypatch, capsys):
    from tests.test_docs_cli import help_text, section, tables

    rows = {row[0].strip("`"): row for row in tables(section("## `asyncdp route`"))[0][1:]}
    documented = set(rows)
    flags = {f for f in re.findall(r"^  (--[a-z-]+)", help_text(monkeypatch, "route"), flags=re.M) if f != "--help"}
    assert flags == documented
    for name, default in (("--poll-interval-s", "0.05"), ("--stale-after-s", "1.0"), ("--port", "8000"),
                          ("--shutdown-timeout", "0"), ("--host", "`0.0.0.0`")):
        assert rows[name][1] == default
