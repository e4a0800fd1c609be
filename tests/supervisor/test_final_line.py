"""The supervisor's last line names why it exits 1 even when every child exited 0 (spec §11.3 "Exit status").

A child that exited 0 on its own (an operator's SIGTERM to that child alone), or one unhealthy after ready that
then stopped cleanly, fails the node: exit 1. The last line used to list only the children that exited non-zero,
so it read ``supervisor stopped with exit status 1`` with no cause at all; it now names the failure.
"""

from __future__ import annotations

import pytest

from tests.supervisor.fleet import ChildSpec, start_fleet

pytestmark = pytest.mark.e2e


def test_the_last_line_names_the_failure_when_every_child_exited_0(make_fleet):
    fleet = start_fleet(make_fleet([ChildSpec("a"), ChildSpec("b")]))
    fleet.wait_for("supervisor ready", lambda: fleet.get() == 200, 15.0)
    fleet.set_health("b", 503)
    assert fleet.wait_exit(5.0) == 1
    fleet.wait_all_gone(1.0)
    last = [line for line in fleet.log().splitlines() if "supervisor stopped with exit status" in line][-1]
    assert last.endswith(f"supervisor stopped with exit status 1 (child rank 1 (port {fleet.ports[1]}, pid "
                         f"{fleet.pid('b')}) is unhealthy: answered HTTP 503)"), fleet.log()[-3000:]
