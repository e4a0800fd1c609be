import os
import signal

import pytest
from hypothesis import settings

# Property tests check decisions, not speed: on two cores shared with e2e process trees a 200 ms per-example
# deadline fails pure tests at random (tests/launcher/test_plan.py did), so no per-example deadline.
settings.register_profile("asyncdp", deadline=None)
settings.load_profile("asyncdp")

# Every torch-using test runs single-threaded: two cores are shared by every process of the suite.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"pytest received {signal.Signals(signum).name}")


def pytest_configure(config):
    """A SIGTERM to pytest (a CI job's timeout, ``kill``) ends the run as Ctrl-C does, through the fixtures'
    teardowns: the deployments the e2e tests started lead their own sessions, and would outlive a pytest that the
    signal's default action ended on the spot."""
    signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture(autouse=True, scope="session")
def _timer_ties_in_arming_order():
    """Every trio run of the suite wakes same-instant timers in the order they were armed, not by memory address:
    a virtual-time test then sees the same order of events on every machine and whatever ran before it."""
    from asyncdp.testing.sim import timer_ties_in_arming_order

    with timer_ties_in_arming_order():
        yield


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test (tests that run a real model in process: its results do not depend on the
    thread count, and two cores are shared by everything the suite runs)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
