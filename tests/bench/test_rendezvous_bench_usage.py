"""bench/rendezvous.py answers a bad command line with one usage line and exit 2, before any group or server."""

from __future__ import annotations

import pytest

from tests.bench.test_bench_script_usage import A_FILE, assert_usage_error, run_script


@pytest.mark.parametrize(("args", "needles"), [
    (["--baseline", "/nonexistent-tree"], ["--baseline /nonexistent-tree holds no asyncdp tree"]),
    (["--joins", "-1"], ["--joins"]),
    (["--startups", "x"], ["--startups", "'x'"]),
    (["--json", f"{A_FILE}/out.json"], ["--json"]),
], ids=["baseline", "joins", "startups", "json"])
def test_rendezvous_bench_refuses_a_bad_command_line(args: list[str], needles: list[str]) -> None:
    assert_usage_error(run_script("rendezvous.py", *args), "rendezvous.py", *needles)
