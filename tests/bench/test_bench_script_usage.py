"""The scripts in bench/ answer a bad command line with a usage error, never a traceback.

House rule (docs/benchmarks.md): one line ``<script>: error: ...`` on stderr naming the bad value, exit status 2,
found before any server or run starts. Each case runs the script as a subprocess from the repository root, as a
user would, and takes a second or two: the checks come before anything long.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncdp.errors import ConfigError
from bench.serving import ServerStartError, _log_tail, asyncdp_serve, run_cli

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
    # routing_real: an unknown policy used to start a server that failed and hid why
    ("routing_real.py", ["--policies", "vllm,nosuch"], ["'nosuch'", "valid policies", "asyncdp@local"]),
    ("routing_real.py", ["--options", "[1]"], ["--options", "'[1]'"]),
    ("routing_real.py", ["--options", "{bad"], ["--options", "'{bad'"]),
    ("routing_real.py", ["--policies", "vllm", "--concurrency", "0"], ["--concurrency", "got 0"]),
    ("routing_real.py", ["--policies", "vllm", "--kv-blocks", "-1"], ["--kv-blocks", "got -1"]),
    ("routing_real.py", ["--policies", "vllm", "--log-dir", A_FILE], ["--log-dir", A_FILE, "is a file, not a folder"]),
    ("routing_real.py", ["--policies", "vllm", "--json", f"{A_FILE}/out.json"],
     ["--json", f"{A_FILE}/out.json", "is a file, not a folder"]),
    ("routing_real.py", ["--policies", "vllm", "--trace", "/nonexistent/trace.jsonl"], ["/nonexistent/trace.jsonl"]),
    # sim_validation: an unknown policy failed in the runner, and its pool's thread raised a TypeError
    ("sim_validation.py", ["--policies", "nosuch"], ["'nosuch'", "valid policies"]),
    ("sim_validation.py", ["--profile", "/nonexistent/profile.json"], ["/nonexistent/profile.json", "calibrate"]),
    ("sim_validation.py", ["--torch-threads", "-1"], ["--torch-threads", "got -1"]),
    ("sim_validation.py", ["--policies", "vllm", "--workload", "nosuch"], ["'nosuch'"]),
    # lockstep: the output path is an option, checked before the runs
    ("lockstep.py", ["--json", "bench"], ["--json", "is a folder"]),
    ("lockstep.py", ["--json", f"{A_FILE}/out.json"], ["--json", f"{A_FILE}/out.json", "is a file, not a folder"]),
    # the rest of bench/: counts below 1, unwritable outputs, unknown models found before any run
    ("lockstep_collectives.py", ["--batch", "0"], ["--batch", "got 0"]),
    ("lockstep_collectives.py", ["--rounds", "0"], ["--rounds", "got 0"]),
    ("lockstep_collectives.py", ["--model", "/nonexistent/model"], ["/nonexistent/model"]),
    ("lockstep_collectives.py", ["--json", f"{A_FILE}/out.json"],
     ["--json", f"{A_FILE}/out.json", "is a file, not a folder"]),
    ("engine_step_overhead.py", ["--prompt-len", "0"], ["--prompt-len", "got 0"]),
    ("engine_step_overhead.py", ["--json", "bench"], ["--json", "is a folder"]),
    ("engine_throughput.py", ["--model", "nosuch"], ["--model", "'nosuch'", "builtin:tiny-dense"]),
    ("engine_throughput.py", ["--model", "builtin:nosuch"], ["--model", "'builtin:nosuch'"]),
    ("engine_throughput.py", ["--threads", "-1"], ["--threads", "got -1"]),
    ("engine_throughput.py", ["--hf-batch-size", "0"], ["--hf-batch-size", "got 0"]),
    ("engine_throughput.py", ["--device", "nosuch"], ["--device", "'nosuch'"]),
    ("engine_throughput.py", ["--json", f"{A_FILE}/out.json"],
     ["--json", f"{A_FILE}/out.json", "is a file, not a folder"]),
    ("frontend_overhead.py", ["--json", f"{A_FILE}/out.json"],
     ["--json", f"{A_FILE}/out.json", "is a file, not a folder"]),
    ("multinode.py", ["--log", f"{A_FILE}/multinode.log"], ["--log", f"{A_FILE}/multinode.log", "is a file, not a folder"]),
    ("router_agreement.py", ["--prompts", "0"], ["--prompts", "got 0"]),
    ("router_agreement.py", ["--system", "-1"], ["--system", "got -1"]),
    ("routing_decision.py", ["--out", "bench"], ["--out", "is a folder"]),
    ("user_tools.py", ["--only", "nosuch"], ["'nosuch'", "lm-eval mc", "guidellm chat"]),
    ("user_tools.py", ["--requests", "0"], ["--requests", "got 0"]),
    ("user_tools.py", ["--timeout-s", "0"], ["--timeout-s"]),
]


@pytest.mark.parametrize(("script", "args", "needles"), CASES, ids=[f"{s} {' '.join(a)}" for s, a, _ in CASES])
def test_bad_argument_is_a_usage_error(script: str, args: list[str], needles: list[str], tmp_path: Path) -> None:
    env = {"ASYNCDP_TOOLS_DIR": str(tmp_path / "tools")} if script == "user_tools.py" else None
    if script == "user_tools.py" and "--out" not in args:
        args = [*args, "--out", str(tmp_path / "user_tools.json")]  # never the repository's bench/results
    assert_usage_error(run_script(script, *args, env=env), script, *needles)


@pytest.mark.parametrize("only", ["", "lm-eval", "guidellm"])
def test_user_tools_names_the_missing_venv_and_how_to_install_it(only: str, tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    out = run_script("user_tools.py", "--only", only, "--out", str(tmp_path / "user_tools.json"),
                     env={"ASYNCDP_TOOLS_DIR": str(tools)})
    assert_usage_error(out, "user_tools.py", "not installed", "pip install torch==2.13.0", "docs/benchmarks.md")
    for tool, venv, exe in (("lm-eval", "lmeval", "lm-eval"), ("guidellm", "guidellm", "guidellm")):
        needed = tool.startswith(only)  # --only "" selects every run
        assert (str(tools / venv / "bin" / exe) in out.stderr) == needed, (tool, out.stderr)
        assert (f"python3.11 -m venv {tools / venv}\n" in out.stderr) == needed, (tool, out.stderr)
    assert not (tmp_path / "user_tools").exists()  # nothing ran: no server, no tool


@pytest.mark.skipif(not in_git_work_tree(), reason="needs the repository's git work tree")
@pytest.mark.parametrize(("script", "flag"), [("lockstep.py", "--json"), ("routing_decision.py", "--out"),
                                              ("routing_real.py", "--json")])
def test_a_tracked_file_is_never_an_output(script: str, flag: str) -> None:
    before = (ROOT / "README.md").read_bytes()
    out = run_script(script, flag, "README.md")
    assert_usage_error(out, script, f"{flag} README.md", "tracked by git")
    assert (ROOT / "README.md").read_bytes() == before


def test_lockstep_writes_where_json_says(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "lockstep.json"
    out = run_script("lockstep.py", "--ranks", "2", "--json", str(target))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"wrote {target}" in out.stdout
    rows = json.loads(target.read_text())["rows"]
    assert rows and {row["dp"] for row in rows} == {2}


def test_a_server_that_does_not_start_is_reported_with_its_output(tmp_path: Path) -> None:
    """What routing_real.py and sim_validation.py print when ``asyncdp serve`` exits before it is ready: its own
    last lines (here its usage error for the flag), not a bare exit status."""
    with open(tmp_path / "serve.log", "wb") as log, pytest.raises(ServerStartError) as err, \
            asyncdp_serve("builtin:tiny-dense", "--lb-policy", "nosuch", log=log, timeout_s=60.0):
        pass
    assert "exited with 2 before ready" in str(err.value)
    assert "--lb-policy" in str(err.value) and "'nosuch'" in str(err.value)


def test_multinode_names_the_launch_that_failed_to_start_with_its_output(tmp_path: Path) -> None:
    # A setting every launch of the script inherits makes the first one exit 2 at once: the script says which
    # launch, with its usage error from the log, exit 1, and does not wait out its 180 s readiness timeout.
    out = run_script("multinode.py", "--log", str(tmp_path / "multinode.log"),
                     env={"ASYNCDP_DP_LB_POLICY": "nosuch"}, timeout=90.0)
    assert_usage_error(out, "multinode.py", "the one-node launch exited with 2 before ready", "'nosuch'", status=1)


def test_run_cli_turns_errors_into_one_line(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["bench/routing_real.py"])
    for exc, status in ((ConfigError("bad workload"), 2), (ServerStartError("asyncdp serve exited with 1"), 1)):
        def main(exc: Exception = exc) -> int:
            raise exc
        with pytest.raises(SystemExit) as exit_info:
            run_cli(main)
        assert exit_info.value.code == status
        assert capsys.readouterr().err == f"routing_real.py: error: {exc}\n"


def test_log_tail_reads_the_file_a_log_stream_writes(tmp_path: Path) -> None:
    assert _log_tail(None) == ""
    assert _log_tail(io.BytesIO(b"no name")) == ""
    with open(tmp_path / "x.log", "wb") as log:
        log.write(b"".join(b"line %d\n" % i for i in range(30)))
        tail = _log_tail(log, lines=3)
    assert tail == "; its last output:\n  line 27\n  line 28\n  line 29"
