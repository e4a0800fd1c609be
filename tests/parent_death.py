"""The parent-death check the runtime tests share: a middle process starts a child that arms
``runtime.exit_after_parent_death``; the middle is SIGKILLed; the child must do nothing while the middle lives,
then get its grace, clean up and exit."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path


def assert_grace_after_parent_death(middle_script: str, child_script: str, marker: Path) -> None:
    """``middle_script`` prints the child's pid, then relays the child's ``armed``; ``child_script`` writes
    ``cleaned`` to ``marker`` in its clean-up (0.5 s grace)."""
    middle = subprocess.Popen([sys.executable, "-c", middle_script, child_script, str(marker)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # the child shares its stdin
    exited = -1
    try:
        assert middle.stdout is not None
        child = int(middle.stdout.readline())
        exited = os.pidfd_open(child)  # readable once the child has exited (it is not ours to wait for)
        assert middle.stdout.readline().strip() == "armed"
        # twice the grace: nothing fires while the parent lives
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
