"""bench/link_auth.py answers a bad command line with one usage line and exit 2, before any link or server."""

from __future__ import annotations

import pytest

from tests.bench.test_bench_script_usage import assert_usage_error, run_script


@pytest.mark.parametrize(("args", "needles"), [
    (["--baseline", "/nonexistent-tree"], ["--baseline /nonexistent-tree holds no asyncdp tree"]),
    (["--links", "0"], ["--links"]),
    (["--executor", "gpu"], ["--executor", "'gpu'"]),
], ids=["baseline", "links", "executor"])
def test_link_auth_bench_refuses_a_bad_command_line(args, needles):
    assert_usage_error(run_script("link_auth.py", *args), "link_auth.py", *needles)
