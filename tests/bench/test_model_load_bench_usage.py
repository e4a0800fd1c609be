"""bench/model_load.py answers a bad command line with one usage line and exit 2 (a model it cannot resolve too),
before it starts any interpreter."""

from __future__ import annotations

import pytest

from tests.bench.test_bench_script_usage import assert_usage_error, run_script


@pytest.mark.parametrize(("args", "needles"), [
    (["--runs", "0"], ["--runs", "got 0"]),
    (["--startups", "-1"], ["--startups", "got -1"]),
    (["--baseline", "bench"], ["--baseline bench", "holds no asyncdp tree"]),
    (["--model", "builtin:nosuch"], ["'builtin:nosuch'", "builtin:tiny-dense"]),
])
def test_model_load_usage_errors(args: list[str], needles: list[str]) -> None:
    assert_usage_error(run_script("model_load.py", *args), "model_load.py", *needles)
