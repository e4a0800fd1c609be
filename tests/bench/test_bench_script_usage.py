"""The scripts in bench/ answer a bad command line with a usage error, never a traceback.

House rule (docs/benchmarks.md): one line ``<script>: error: ...`` on stderr naming the bad value, exit status 2,
found before any server or run starts. Each case runs the script as a subprocess from the repository root, as a
user would, and takes a second or two: the checks come before anything long.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.serving import ServerStartError, _log_tail, asyncdp_serve

ROOT = Path(__file__).resolve().parents[2]


def run_script(script: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def assert_usage_error(out: subprocess.CompletedProcess[str], script: str, *needles: str, status: int = 2) -> None:
    assert out.returncode == status, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "Exception in thread" not in out.stderr, out.stderr[-3000:]
    assert f"{script}: error: " in out.stderr, out.stderr[-3000:]
    for needle in needles:
        assert needle in out.stderr, (needle, out.stderr[-3000:])


def in_git_work_tree() -> bool:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "ls-files", "--error-unmatch", "README.md"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


A_FILE = "bench/serving.py"  # a path under it cannot be created: "bench/serving.py/out.json"


CASES = [
    # rank_timeline: ConfigErrors of the workload, policy, profile and cluster were tracebacks
    ("rank_timeline.py", ["--workload", "nosuch"], ["'nosuch'", "w1, w2"]),
    ("rank_timeline.py", ["--scale", "quick", "--policies", "asyncdp,nosuch"], ["'nosuch'", "valid policies", "vllm"]),
    ("rank_timeline.py", ["--profile", "nosuch"], ["'nosuch'", "gpu_8b"]),
    ("rank_timeline.py", ["--scale", "quick", "--workload", "w1", "--telemetry", "nosuch"], ["'nosuch'"]),
    ("rank_timeline.py", ["--option", "nokeyvalue"], ["KEY=VALUE", "'nokeyvalue'"]),
    ("rank_timeline.py", ["--every", "0"], ["--every", "got 0"]),
]


@pytest.mark.parametrize(("script", "args", "needles"), CASES, ids=[f"{s} {' '.join(a)}" for s, a, _ in CASES])
def test_bad_argument_is_a_usage_error(script: str, args: list[str], needles: list[str], tmp_path: Path) -> None:
    env = {"ASYNCDP_TOOLS_DIR": str(tmp_path / "tools")} if script == "user_tools.py" else None
    if script == "user_tools.py" and "--out" not in args:
        args = [*args, "--out", str(tmp_path / "user_tools.json")]  # never the repository's bench/results
    assert_usage_error(run_script(script, *args, env=env), script, *needles)


def test_a_server_that_does_not_start_is_reported_with_its_output(tmp_path: Path) -> None:
    """What routing_real.py and sim_validation.py print when ``asyncdp serve`` exits before it is ready: its own
    last lines (here its usage error for the flag), not a bare exit status."""
    with open(tmp_path / "serve.log", "wb") as log, pytest.raises(ServerStartError) as err, \
            asyncdp_serve("builtin:tiny-dense", "--lb-policy", "nosuch", log=log, timeout_s=60.0):
        pass
    assert "exited with 2 before ready" in str(err.value)
    assert "--lb-policy" in str(err.value) and "'nosuch'" in str(err.value)


def test_log_tail_reads_the_file_a_log_stream_writes(tmp_path: Path) -> None:
    assert _log_tail(None) == ""
    assert _log_tail(io.BytesIO(b"no name")) == ""
    with open(tmp_path / "x.log", "wb") as log:
        log.write(b"".join(b"line %d\n" % i for i in range(30)))
        tail = _log_tail(log, lines=3)
    assert tail == "; its last output:\n  line 27\n  line 28\n  line 29"
