"""``python mock_supervisor.py SPEC.json``: the real supervisor process (:func:`run_children`) over the child
commands and settings in SPEC.json (``{"children": [{dp_rank, port, argv, env}], "settings": {...}}``)."""

from __future__ import annotations

import json
import sys

from asyncdp.supervisor.derive import ChildCommand
from asyncdp.supervisor.process import run_children
from asyncdp.supervisor.settings import SupervisorSettings


def main(path: str) -> int:
    with open(path) as f:
        spec = json.load(f)
    commands = [ChildCommand(dp_rank=c["dp_rank"], port=c["port"], argv=tuple(c["argv"]), env=c.get("env", {}))
                for c in spec["children"]]
    return run_children(commands, SupervisorSettings(**spec["settings"]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
