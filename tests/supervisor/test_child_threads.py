"""The supervised children share the node's cores (spec §5.5) as a launcher's engines do.

A child of the multi-port supervisor is an external-LB server of one rank, so on its own it gives its one engine
every core of the node. With L children stepping in lockstep that oversubscribed the node: on a 2-core machine two
tiny-moe ranks under ``-dpm`` decoded 200 tokens in 49 s against 1.9 s for the same ranks under one launcher. The
supervisor now passes each child ``--torch-threads`` = cores // L, unless the user gave ``--torch-threads``.
"""

from __future__ import annotations

import os

import pytest

from asyncdp.supervisor import process as supervisor_process
from asyncdp.supervisor.derive import child_commands, child_torch_threads
from tests.supervisor.test_derive import resolve_args, resolved, serve_args

MULTI_PORT = ["builtin:tiny-moe", "-dp", "4", "-dpl", "4", "-dpm", "--port", "8000"]


def _threads_of(args: list[str]) -> int | None:
    """The children's resolved ``--torch-threads``, checked equal across children."""
    values = set()
    for c in child_commands(args, resolved(args).deployment, cpu_count=16):
        values.add(resolve_args(serve_args(c), c.env).engine.torch_threads)
    assert len(values) == 1, values
    return values.pop()


def test_the_node_cores_are_divided_among_the_children():
    assert _threads_of(MULTI_PORT) == 4  # 16 cores, 4 children
    assert child_torch_threads(2, 2) == 1
    assert child_torch_threads(2, 4) == 1  # never 0
    assert child_torch_threads(None, 2) == 1


@pytest.mark.parametrize("given", [["--torch-threads", "3"], ["--torch_threads=3"], ["--torch-threads=3"]])
def test_the_users_torch_threads_win_and_are_not_repeated(given):
    args = MULTI_PORT + given
    assert _threads_of(args) == 3
    for c in child_commands(args, resolved(args).deployment, cpu_count=16):
        assert sum(t.replace("_", "-").startswith("--torch-threads") for t in serve_args(c)) == 1


def test_run_supervisor_starts_children_that_share_the_cores(monkeypatch):
    started = []
    monkeypatch.setattr(supervisor_process, "run_children", lambda commands, settings: started.extend(commands) or 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    args = ["builtin:tiny-moe", "-dp", "2", "-dpl", "2", "-dpm", "--port", "8000"]
    assert supervisor_process.run_supervisor(resolved(args), args, resolve_args=resolve_args) == 0
    assert [resolve_args(serve_args(c), c.env).engine.torch_threads for c in started] == [4, 4]
