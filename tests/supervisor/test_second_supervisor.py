"""A second multi-port supervisor on the ports of one that is still starting fails at once, as on a busy port.

The supervisor binds its port without listening until every child is ready, and so does the second one: with
``SO_REUSEADDR`` on both and neither listening, the kernel lets both bind it. The second supervisor then started
its children as well, and whichever node became ready second failed to listen on its supervisor port (or lost
child ports to the other), minutes into the start, possibly taking the first deployment down. Now the supervisor
holds the lock of each of its ports (:mod:`asyncdp.transport.port_lock`) from its start: the second one exits 1
before starting any child, naming the port and the holder's pid.
"""

from __future__ import annotations

import pytest

from tests.supervisor import fleet as fleet_module
from tests.supervisor.fleet import ChildSpec, start_fleet

SUPERVISOR_PORT = "the supervisor port (--data-parallel-supervisor-port)"


@pytest.mark.parametrize("shared", ["supervisor port", "child port"])
def test_a_second_supervisor_on_the_ports_of_a_starting_one_exits_1_before_any_child(make_fleet, monkeypatch,
                                                                                    shared):
    first = start_fleet(make_fleet([ChildSpec("a", status=503)]))  # its child never ready: still starting
    first.wait_probed("a", 1)
    if shared == "supervisor port":
        second = make_fleet([ChildSpec("b")], supervisor_port=first.supervisor_port)
    else:  # the second's child on the first one's child port; its own supervisor port is free
        second = make_fleet([ChildSpec("b")])
        real_free_ports = fleet_module.free_ports
        monkeypatch.setattr(fleet_module, "free_ports", lambda n: [first.ports[0], *real_free_ports(n - 1)])
    start_fleet(second, expect_listening=False)
    assert second.wait_exit(20.0) == 1
    if shared == "supervisor port":
        what = f"{SUPERVISOR_PORT} 127.0.0.1:{first.supervisor_port}"
    else:
        what = f"the port of child rank 0 (port {first.ports[0]}) 127.0.0.1:{first.ports[0]}"
    assert (f"cannot listen on {what}: Address already in use (held by another asyncdp deployment, "
            f"pid {first.proc.pid}); no child was started") in second.log()
    assert second.child_info("b") is None
    assert first.proc.poll() is None and first.child_info("a") is not None  # the first one goes on
