"""bench/router_overhead.py answers a bad command line with a usage error before it starts anything (the house
rule of docs/benchmarks.md, as tests/bench/test_bench_script_usage.py checks it for the other scripts)."""

from __future__ import annotations

import pytest

from tests.bench.test_bench_script_usage import A_FILE, assert_usage_error, run_script


@pytest.mark.parametrize(("args", "needles"), [
    (["--requests", "0"], ["--requests", "got 0"]),
    (["--concurrency", "-1"], ["--concurrency", "got -1"]),
    (["--json", f"{A_FILE}/out.json"], ["--json", f"{A_FILE}/out.json", "is a file, not a folder"]),
    (["--baseline-checkout", "docs"], ["--baseline-checkout", "docs is not a checkout of asyncdp"]),
])
def test_bad_argument_is_a_usage_error(args: list[str], needles: list[str]) -> None:
    assert_usage_error(run_script("router_overhead.py", *args), "router_overhead.py", *needles)
