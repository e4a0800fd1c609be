"""Stand-ins for heavy imports that tests put first on a deployment's ``PYTHONPATH`` (``torch/``, ``transformers/``).

``ASYNCDP_TEST_STALLED_IMPORT=MODULE:TITLE`` names the one that stalls, and the processes it stalls in: those whose
``--name`` starts with ``TITLE`` (``torch:asyncdp-engine``, ``transformers:asyncdp-api``). There the import of
``MODULE`` announces itself, with a file named after the process id in ``$ASYNCDP_TEST_STALLED_DIR``, and never
returns: an import of seconds on a loaded machine made endless, so a test knows for certain that a process is
inside it. Anywhere else (another module, another process) the stand-in steps aside and the real module is imported
in its place.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from importlib.machinery import PathFinder
from pathlib import Path

_OURS = os.path.dirname(os.path.abspath(__file__))


def stand_in(name: str) -> None:
    """Run by the stand-in of ``name`` as it is imported: stall, or import the real ``name`` in its place."""
    module, _, title = os.environ.get("ASYNCDP_TEST_STALLED_IMPORT", "").partition(":")
    argv = sys.argv[1:]
    if module == name and "--name" in argv and argv.index("--name") + 1 < len(argv) and \
            argv[argv.index("--name") + 1].startswith(title):
        (Path(os.environ["ASYNCDP_TEST_STALLED_DIR"]) / str(os.getpid())).touch()
        threading.Event().wait()
    # The real module, found on the path without this folder and loaded as the import system would, in place of
    # the stand-in (the import that ran the stand-in returns what sys.modules holds). sys.path is left alone:
    # another thread may be walking it in an import of its own, and a list shortened under its walk skipped the
    # entry after the one removed (site-packages: "No module named 'transformers'").
    spec = PathFinder.find_spec(name, [p for p in sys.path if os.path.abspath(p or ".") != _OURS])
    assert spec is not None and spec.loader is not None, f"no real {name} beside the stand-in"
    real = importlib.util.module_from_spec(spec)
    sys.modules[name] = real
    spec.loader.exec_module(real)
