"""The supervisor's lifecycle over mock children, as real processes on 127.0.0.1 (spec §11.3 acceptance a-e,
§12.5 no orphans). Probe interval 1 s, timeout 1 s, threshold 3. Bounds are the contract's, measured with
``time.monotonic()`` around the waits."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from tests.supervisor.fleet import ChildSpec, is_alive, start_fleet

pytestmark = pytest.mark.e2e


def test_supervisor_port_is_closed_until_every_child_is_healthy_then_answers_200(make_fleet):
    fleet = start_fleet(make_fleet([ChildSpec("a", status=503), ChildSpec("b", status=503)]))
    fleet.wait_probed("b", 2)
    assert fleet.get() is None  # no child healthy: connection refused, not 503
    fleet.set_health("a", 200)
    fleet.wait_probed("b", 2)
    assert fleet.get() is None  # one of two healthy: still closed
    fleet.set_health("b", 200)
    t0 = time.monotonic()
    ready_at = fleet.wait_for("supervisor /health 200", lambda: fleet.get() == 200, 15.0)
    assert ready_at - t0 < 10.0
    fleet.wait_probed("a", 2)  # two more rounds: it stays 200
    assert [fleet.get(p) for p in ("/health", "/ready", "/readyz")] == [200, 200, 200]
    assert fleet.get("/v1/models") == 404 and fleet.get("/server_info") == 404
    log = fleet.log()
    assert "mock child a listening on port" in log  # the children's output is the supervisor's
    assert [fleet.child_info(n)["supervised_rank"] for n in ("a", "b")] == ["0", "1"]
    fleet.signal(signal.SIGTERM)
    assert fleet.wait_exit(5.0) == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sigterm_answers_503_within_1s_never_200_again_and_exits_0_within_5s(make_fleet, backend):
    fleet = start_fleet(make_fleet([ChildSpec("a", drain_s=2.0), ChildSpec("b", drain_s=2.0)], backend=backend))
    fleet.wait_for("supervisor ready", lambda: fleet.get() == 200, 15.0)
    t0 = fleet.signal(signal.SIGTERM)
    first_503 = fleet.wait_for("503 after SIGTERM", lambda: fleet.get() == 503, 5.0)
    assert first_503 - t0 < 1.0
    answers = []
    while fleet.proc.poll() is None and time.monotonic() - t0 < 10.0:
        answers.append(fleet.get())
    code = fleet.wait_exit(5.0)
    assert time.monotonic() - t0 < 5.0
    assert 200 not in answers and 503 in answers  # the port stayed open, answering 503, while the children drained
    assert code == 0, fleet.log()[-4000:]
    assert [fleet.marker(n, "signal") for n in ("a", "b")] == ["SIGTERM", "SIGTERM"]
    fleet.wait_all_gone(1.0)


def test_child_killed_before_ready_ends_the_supervisor_with_1_and_the_port_never_opens(make_fleet):
    fleet = start_fleet(make_fleet([ChildSpec("a"), ChildSpec("b", status=503)]))
    fleet.wait_probed("b", 1)
    victim = fleet.pid("b")
    fleet.seen.add(victim)
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    assert fleet.wait_exit(5.0) == 1
    assert time.monotonic() - t0 < 5.0
    fleet.wait_all_gone(1.0)
    log = fleet.log()
    assert f"child rank 1 (port {fleet.ports[1]}, pid {victim}) exited with signal SIGKILL" in log
    assert "serving /health" not in log


def test_child_answering_503_after_ready_ends_the_supervisor_with_1_within_5s(make_fleet):
    fleet = start_fleet(make_fleet([ChildSpec("a"), ChildSpec("b")]))
    fleet.wait_for("supervisor ready", lambda: fleet.get() == 200, 15.0)
    t0 = time.monotonic()
    fleet.set_health("b", 503)
    assert fleet.wait_exit(5.0) == 1
    assert time.monotonic() - t0 < 5.0
    fleet.wait_all_gone(1.0)
    assert f"child rank 1 (port {fleet.ports[1]}, pid {fleet.pid('b')}) is unhealthy: answered HTTP 503" in fleet.log()
    assert fleet.marker("a", "signal") == "SIGTERM"  # the healthy one was stopped, not left running


def test_child_sigkilled_after_ready_ends_the_supervisor_with_1_naming_it(make_fleet):
    fleet = start_fleet(make_fleet([ChildSpec("a"), ChildSpec("b")]))
    fleet.wait_for("supervisor ready", lambda: fleet.get() == 200, 15.0)
    victim = fleet.pid("a")
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    assert fleet.wait_exit(5.0) == 1
    assert time.monotonic() - t0 < 5.0
    fleet.wait_all_gone(1.0)
    assert f"child rank 0 (port {fleet.ports[0]}, pid {victim}) exited with signal SIGKILL" in fleet.log()


def test_children_draining_10s_under_shutdown_timeout_10_are_not_killed(make_fleet):
    fleet = start_fleet(make_fleet([ChildSpec("a", drain_s=10.0), ChildSpec("b", drain_s=10.0)],
                                   shutdown_timeout_s=10.0))
    fleet.wait_for("supervisor ready", lambda: fleet.get() == 200, 15.0)
    fleet.signal(signal.SIGTERM)
    assert fleet.wait_exit(20.0) == 0, fleet.log()[-4000:]
    assert [fleet.marker(n, "exit") for n in ("a", "b")] == ["drained", "drained"]  # they finished, unkilled
    assert "killing" not in fleet.log()


def test_child_that_outlives_the_grace_has_its_tree_killed_and_the_supervisor_exits_1(make_fleet):
    fleet = start_fleet(make_fleet([ChildSpec("a", drain_s=60.0, grandchild=True), ChildSpec("b")],
                                   shutdown_timeout_s=0.0))
    fleet.wait_for("supervisor ready", lambda: fleet.get() == 200, 15.0)
    grandchild = fleet.child_info("a")["grandchild"]
    assert is_alive(grandchild)
    t0 = fleet.signal(signal.SIGTERM)
    assert fleet.wait_exit(10.0) == 1
    assert 5.0 <= time.monotonic() - t0 < 10.0  # killed at --shutdown-timeout + 5 s, not before
    fleet.wait_all_gone(2.0)
    assert "child rank 0 did not exit within 5s; killing" in fleet.log()
    assert fleet.marker("a", "exit") is None and fleet.marker("b", "exit") == "drained"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_tls_children_are_probed_over_https_and_the_supervisor_serves_https(make_fleet, certs, backend):
    fleet = start_fleet(make_fleet([ChildSpec("a"), ChildSpec("b")], certs=certs, backend=backend))
    fleet.wait_for("supervisor ready over https", lambda: fleet.get() == 200, 15.0)
    assert fleet.probes("a") >= 1
    fleet.signal(signal.SIGTERM)
    assert fleet.wait_exit(5.0) == 0, fleet.log()[-4000:]
    fleet.wait_all_gone(1.0)


def test_busy_supervisor_port_fails_naming_the_port_before_any_child_starts(make_fleet):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        fleet = make_fleet([ChildSpec("a"), ChildSpec("b")], supervisor_port=port)
        fleet.launch()
        assert fleet.wait_exit(10.0) == 1
    log = fleet.log()
    assert f"cannot listen on the supervisor port (--data-parallel-supervisor-port) 127.0.0.1:{port}" in log
    assert "no child was started" in log
    assert fleet.child_info("a") is None and fleet.child_info("b") is None


def test_supervisor_port_taken_while_children_start_fails_naming_it_and_stops_every_child(make_fleet):
    fleet = start_fleet(make_fleet([ChildSpec("a"), ChildSpec("b", status=503)]))
    with socket.socket() as thief:
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        thief.bind(("127.0.0.1", fleet.supervisor_port))
        thief.listen()
        fleet.set_health("b", 200)
        assert fleet.wait_exit(10.0) == 1
    fleet.wait_all_gone(1.0)
    assert f"127.0.0.1:{fleet.supervisor_port}" in fleet.log()
    assert [fleet.marker(n, "signal") for n in ("a", "b")] == ["SIGTERM", "SIGTERM"]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sigkill_of_the_supervisor_takes_every_child_down_within_5s(make_fleet, backend):
    fleet = start_fleet(make_fleet([ChildSpec("a", drain_s=30.0), ChildSpec("b", drain_s=30.0)], backend=backend))
    fleet.wait_for("supervisor ready", lambda: fleet.get() == 200, 15.0)
    t0 = fleet.signal(signal.SIGKILL)
    fleet.wait_exit(5.0)
    fleet.wait_all_gone(5.0)
    assert time.monotonic() - t0 < 5.0


def test_a_second_signal_kills_draining_children_at_once_and_exits_1(make_fleet):
    fleet = start_fleet(make_fleet([ChildSpec("a", drain_s=60.0), ChildSpec("b", drain_s=60.0)],
                                   shutdown_timeout_s=60.0))
    fleet.wait_for("supervisor ready", lambda: fleet.get() == 200, 15.0)
    fleet.signal(signal.SIGTERM)
    fleet.wait_for("both children draining", lambda: all(fleet.marker(n, "signal") for n in ("a", "b")), 5.0)
    t0 = fleet.signal(signal.SIGINT)
    assert fleet.wait_exit(5.0) == 1
    assert time.monotonic() - t0 < 5.0
    fleet.wait_all_gone(1.0)
    assert "second signal (SIGINT): killing every child now" in fleet.log()
