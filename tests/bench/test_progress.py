"""The progress of ``bench routing`` and ``bench calibrate`` where stderr is not a terminal (a CI log, a pipe): plain
lines, no carriage returns, at most one every few seconds plus the first and the last; a bar on a terminal."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from asyncdp.bench.progress import EVERY_S, Progress

ROOT = Path(__file__).resolve().parents[2]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_thousand_items_over_a_minute_give_a_few_plain_lines():
    clock, out = _Clock(), io.StringIO()
    with Progress(1000, prefix="asyncdp bench", unit="run", stream=out, clock=clock) as progress:
        for k in range(1000):
            clock.now = k * 0.06  # 60 s in all
            progress.advance(f"w1 vllm seed {k}")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert 3 <= len(lines) <= 60 / EVERY_S + 2, lines
    assert lines[0] == "asyncdp bench: 1/1000 runs done (0 %) after 0 s; latest: w1 vllm seed 0"
    assert lines[-1] == "asyncdp bench: 1000/1000 runs done (100 %) after 60 s; latest: w1 vllm seed 999"


def test_on_a_terminal_it_is_a_bar_redrawn_at_most_twice_a_second():
    clock, out = _Clock(), _Terminal()
    with Progress(500, prefix="asyncdp bench calibrate", unit="point", stream=out, clock=clock) as progress:
        for k in range(500):
            progress.advance(f"decode D={k}")
    text = out.getvalue()
    assert "500/500" in text and "point" in text
    assert text.count("\r") < 50  # each item forced a redraw before (set_postfix_str refreshed the bar)


def test_bench_routing_into_a_pipe_writes_plain_progress_lines_without_carriage_returns(tmp_path):
    # stderr a pipe (a CI log): tqdm's bar wrote "\r" and a redraw per run there, one endless line
    proc = subprocess.run([sys.executable, "-m", "asyncdp", "bench", "routing", "--workload", "w1", "--option",
                           "groups=2", "--option", "prompts_per_group=2", "--option", "system_len=32", "--policies",
                           "vllm,round_robin,random,power_of_two", "--seeds", "1,2", "--jobs", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if " runs done " in line]
    assert lines[0].startswith("asyncdp bench: 1/8 runs done (12 %) after ")
    assert lines[-1].startswith("asyncdp bench: 8/8 runs done (100 %) after ")
    assert len(lines) < 8  # not a line per run: the first, one every 10 s at most, the last
