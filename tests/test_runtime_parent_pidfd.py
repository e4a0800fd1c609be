"""A child of a parent that forks from a worker thread (trio's ``open_process``) still gets its bounded grace when
the parent dies, and nothing while the parent lives, by watching the parent's pidfd instead of asking for the
kernel's parent-death signal (which follows the forking thread, not the process)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest

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
    marker = tmp_path / "cleaned"
    middle = subprocess.Popen([sys.executable, "-c", _MIDDLE, _CHILD, str(marker)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # the child shares the middle's stdin
    exited = -1
    try:
        assert middle.stdout is not None
        child = int(middle.stdout.readline())
        exited = os.pidfd_open(child)  # readable once the child has exited (it is not ours to wait for)
        assert middle.stdout.readline().strip() == "armed"
        # twice the grace, the forking thread long gone: nothing fires while the parent lives
        assert select.select([exited], [], [], 1.0)[0] == [] and not marker.exists()
        middle.kill()
        middle.wait()
        killed = time.monotonic()
        assert select.select([exited], [], [], 10.0)[0] == [exited], "the child outlived its parent"
        took = time.monotonic() - killed
        assert marker.read_text() == "cleaned"
        assert 0.4 <= took < 5, took  # the grace was given, and not much more
    finally:
        middle.kill()
        middle.wait()
        for pipe in (middle.stdin, middle.stdout):
            if pipe is not None:
                pipe.close()
        if exited >= 0:
            if not select.select([exited], [], [], 0)[0]:
                signal.pidfd_send_signal(exited, signal.SIGKILL)
            os.close(exited)
