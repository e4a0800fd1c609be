"""A start gate for tests/e2e/test_supervisor_stop_while_children_start.py, on ``PYTHONPATH`` only for the command
it holds.

With ``ASYNCDP_TEST_START_GATE=DIR`` in the environment, each child of the process the test starts (the second
generation: the gate counts them in ``ASYNCDP_TEST_START_GATE_DEPTH``, which its children inherit) creates
``DIR/<its pid>`` as its interpreter starts, before any code of asyncdp runs, and then waits, in Python code, until
``DIR/release`` exists: a signal sent to such a child once its file exists reaches it, for certain, before it has
any signal handling of its own.
"""

import os
import time

_dir = os.environ.get("ASYNCDP_TEST_START_GATE")

if _dir:
    _depth = int(os.environ.get("ASYNCDP_TEST_START_GATE_DEPTH", "0"))
    os.environ["ASYNCDP_TEST_START_GATE_DEPTH"] = str(_depth + 1)
    if _depth == 1:
        open(os.path.join(_dir, str(os.getpid())), "w").close()  # noqa: SIM115 - a marker
        while not os.path.exists(os.path.join(_dir, "release")):
            time.sleep(0.01)
