"""A start gate for the port-lock test (:mod:`tests.e2e.test_second_deployment_same_port`), on ``PYTHONPATH`` only
for the deployment it holds.

With ``ASYNCDP_TEST_GATE=PATH`` (a FIFO) in the environment, the first ``python -m asyncdp.worker`` started (the
first child of the launch: its coordinator) opens the FIFO and reads it to the end before it runs. The test knows
that child is waiting once its own non-blocking open for writing succeeds, and lets it go by closing that end.
Meanwhile the launcher has bound the HTTP port and waits for the coordinator: no API server listens yet.
"""

import os

_gate = os.environ.get("ASYNCDP_TEST_GATE")
if _gate:
    with open("/proc/self/cmdline", "rb") as _f:
        _is_worker = b"asyncdp.worker" in _f.read().split(b"\0")
    if _is_worker:
        try:  # only the first worker waits: its launcher starts nothing else until it is listening
            os.close(os.open(_gate + ".taken", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            with open(_gate, "rb") as _fifo:
                _fifo.read()
