"""A stand-in for torch that tests put first on a deployment's ``PYTHONPATH``.

In an engine process (``--name asyncdp-engine-...``) ``import torch`` announces itself, with a file named after the
process id in the directory ``$ASYNCDP_TEST_STALLED_TORCH_DIR``, and never returns: the import of torch, seconds on a
loaded machine, made endless, so a test knows for certain that an engine is inside it. Anywhere else (the launcher,
the API servers' tokenizers) this module steps aside and the real torch is imported in its place.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from pathlib import Path

_ours = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_argv = sys.argv[1:]
if "--name" in _argv and _argv.index("--name") + 1 < len(_argv) and \
        _argv[_argv.index("--name") + 1].startswith("asyncdp-engine"):
    (Path(os.environ["ASYNCDP_TEST_STALLED_TORCH_DIR"]) / str(os.getpid())).touch()
    threading.Event().wait()

# A new list, never a change in place: another thread of this process (the launcher's tokenizer load, say) may be
# walking the old list in an import of its own, and a list shortened under its walk skips the entry after the one
# removed (site-packages: "No module named 'transformers'").
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _ours]
del sys.modules[__name__]
sys.modules[__name__] = importlib.import_module(__name__)  # the real torch; the import that ran this returns it
