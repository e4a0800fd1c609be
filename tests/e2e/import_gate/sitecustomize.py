"""An import gate for tests/test_main_entry_early_stop.py, on ``PYTHONPATH`` only for the command it holds.

With ``ASYNCDP_TEST_IMPORT_GATE=PATH`` in the environment, the import of ``asyncdp.cli`` (the second or so an
``asyncdp`` command spends importing, before it has any signal handling of its own) creates ``PATH`` and then
never ends: a stop signal sent once ``PATH`` exists reaches the command, for certain, while it imports.
"""

import importlib.abc
import os
import sys
import time

_gate = os.environ.get("ASYNCDP_TEST_IMPORT_GATE")


class _Gate(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name == "asyncdp.cli":
            open(_gate, "w").close()  # noqa: SIM115 - a marker
            while True:
                time.sleep(0.01)  # Python code: a signal's handler runs here
        return None


if _gate:
    sys.meta_path.insert(0, _Gate())
