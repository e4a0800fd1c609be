"""bench/grammar_compile_stall.py answers a bad command line with one usage line and exit 2, before it starts any
server."""

from __future__ import annotations

import pytest

from tests.bench.test_bench_script_usage import A_FILE, assert_usage_error, run_script


@pytest.mark.parametrize(("args", "needles"), [
    (["--tools", "0"], ["--tools", "got 0"]),
    (["--plain-tokens", "8", "--lead-chunks", "8"], ["--lead-chunks must be below --plain-tokens"]),
    (["--baseline", "bench"], ["--baseline bench", "holds no asyncdp tree"]),
    (["--json", f"{A_FILE}/out.json"], ["--json", "is a file, not a folder"]),
])
def test_grammar_compile_stall_usage_errors(args: list[str], needles: list[str]) -> None:
    assert_usage_error(run_script("grammar_compile_stall.py", *args), "grammar_compile_stall.py", *needles)
