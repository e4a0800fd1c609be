"""bench/process_footprint.py answers a bad command line with one usage line and exit 2 (a model it cannot
resolve too), before it starts any deployment."""

from __future__ import annotations

import pytest

from tests.bench.test_bench_script_usage import assert_usage_error, run_script


@pytest.mark.parametrize(("args", "needles"), [
    (["--startups", "0"], ["--startups", "got 0"]),
    (["--api-server-count", "0"], ["--api-server-count", "got 0"]),
    (["--baseline", "bench"], ["--baseline bench", "holds no asyncdp tree"]),
    (["--model", "builtin:nosuch"], ["'builtin:nosuch'", "builtin:tiny-dense"]),
])
def test_process_footprint_usage_errors(args: list[str], needles: list[str]) -> None:
    assert_usage_error(run_script("process_footprint.py", *args), "process_footprint.py", *needles)
