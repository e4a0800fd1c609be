"""A child of a parent that forks from a worker thread (trio's ``open_process``) still gets its bounded grace when
the parent dies, and nothing while the parent lives, by watching the parent's pidfd instead of asking for the
kernel's parent-death signal (which follows the forking thread, not the process)."""

from __future__ import annotations

import os

import pytest

from tests.parent_death import assert_grace_after_parent_death

_CHILD = """
import os, sys
from asyncdp import runtime
marker = sys.argv[1]
runtime.exit_after_parent_death(os.getppid(), 0.5, lambda: open(marker, "w").write("cleaned"), by_signal=False)
print("armed", flush=True)
sys.stdin.read()  # the main thread is stuck in C (until the test closes the pipe): the grace must start anyway
"""
# The parent forks the child from a thread that then exits, as trio's thread cache does.
_MIDDLE = """
import subprocess, sys, threading
children = []
spawner = threading.Thread(target=lambda: children.append(subprocess.Popen([sys.executable, "-c", sys.argv[1],
                                                                             sys.argv[2]])))
spawner.start()
spawner.join()
print(children[0].pid, flush=True)
sys.stdin.read()  # killed by the test; the test's end closes the pipe, so neither outlives it
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfd is Linux 5.3+")
def test_a_child_forked_from_an_exited_thread_gets_its_grace_only_once_the_parent_dies(tmp_path) -> None:
    assert_grace_after_parent_death(_MIDDLE, _CHILD, tmp_path / "cleaned")
