"""Launcher decisions without child processes: startup control flow over memory links in virtual time, the MoE
configuration agreement check (E6) and the HTTP bind (E11)."""

from __future__ import annotations

import socket

import anyio
import pytest
import trio

from asyncdp import messages as m
from asyncdp.config.deployment import resolve
from asyncdp.config.flags import EngineConfig, ServeConfig
from asyncdp.config.roles import LaunchPlan, coordinator_role
from asyncdp.config.summary import parallel_config_summary
from asyncdp.errors import StartupError
from asyncdp.launcher.handshake import handshake as _handshake
from asyncdp.launcher.launch_plan import bind_http_socket
from asyncdp.launcher.node import RunningNode
from asyncdp.launcher.node_book import check_config_agreement
from asyncdp.launcher.startup import run_startup as _run_startup
from asyncdp.transport import memory_link_pair


def launch_plan(tmp_path, *, dp_size: int = 2, is_moe: bool = False, **fields) -> LaunchPlan:
    deployment = resolve(ServeConfig(data_parallel_size=dp_size), is_moe=is_moe, num_experts=8 if is_moe else 0,
                         env={})
    return LaunchPlan(engine=EngineConfig(), served_model_name="m", model_path=str(tmp_path), deployment=deployment,
                      **fields)


@pytest.fixture
def deployment(tmp_path):
    sock = socket.socket()
    node = RunningNode(launch_plan(tmp_path), sock, str(tmp_path))
    node.init_ready.set()  # the addresses HandshakeInit carries are known (none in these tests)
    yield node
    sock.close()


def _hello(dp_rank: int) -> m.Hello:
    return m.Hello(protocol_version=m.PROTOCOL_VERSION, dp_rank=dp_rank, local=True, headless=False,
                   host="h", pid=1)


@pytest.mark.trio
async def test_engine_closing_link_before_ready_fails_startup_instead_of_raising(deployment):
    launcher_end, engine_end = memory_link_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_handshake, deployment, launcher_end)
        await engine_end.send(_hello(0))
        assert isinstance(await engine_end.receive(), m.HandshakeInit)
        await engine_end.aclose()  # the engine died loading its model
    await launcher_end.aclose()
    assert deployment.shutdown.is_set()
    assert deployment.failure is not None and "handshake" in deployment.failure
    assert deployment.book is not None and 0 not in deployment.book.ready


@pytest.mark.trio
async def test_a_second_hello_for_a_rank_still_starting_is_refused(deployment):
    first_launcher, first_engine = memory_link_pair()
    second_launcher, second_engine = memory_link_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_handshake, deployment, first_launcher)
        await first_engine.send(_hello(1))
        assert isinstance(await first_engine.receive(), m.HandshakeInit)  # rank 1 is loading its model
        nursery.start_soon(_handshake, deployment, second_launcher)
        await second_engine.send(_hello(1))
        refused = await second_engine.receive()
        nursery.cancel_scope.cancel()
    for link in (first_launcher, first_engine, second_launcher, second_engine):
        await link.aclose()
    assert isinstance(refused, m.HandshakeError) and "connected twice" in refused.reason
    assert deployment.failure is not None


@pytest.mark.trio
async def test_silent_engine_connection_times_out_without_raising(deployment, autojump_clock):
    launcher_end, engine_end = memory_link_pair()
    with trio.fail_after(120):
        await _handshake(deployment, launcher_end)
    await launcher_end.aclose()
    await engine_end.aclose()
    assert deployment.failure is None  # no engine (it would have said Hello): dropped, startup goes on


@pytest.mark.trio
async def test_shutdown_during_startup_ends_the_startup_wait_at_once(deployment, autojump_clock):
    waited = trio.Event()

    async def start_waiting_for_engines() -> None:
        waited.set()
        await anyio.sleep_forever()  # an engine-ready wait with a 600 s deadline

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run_startup, deployment, start_waiting_for_engines)
        await waited.wait()
        start = trio.current_time()
        deployment.shutdown.set()  # SIGTERM while the engines load
    assert trio.current_time() - start < 1.0
    assert deployment.failure is None  # a signal is an orderly end, not a failure


@pytest.mark.trio
async def test_startup_failure_is_recorded_as_the_deployment_failure(deployment):
    async def start_that_times_out() -> None:
        raise TimeoutError

    await _run_startup(deployment, start_that_times_out)
    assert deployment.shutdown.is_set() and deployment.failure is not None
    assert deployment.failure.startswith("startup failed")


def test_coordinator_waits_for_subscriptions_as_long_as_engines_may_take_to_get_ready(tmp_path):
    from asyncdp.coordinator.process import coordinator_config

    plan = launch_plan(tmp_path, is_moe=True, engine_ready_timeout_s=1800.0)
    config = coordinator_config(coordinator_role(plan, socket_dir=str(tmp_path)))
    assert config.subscribe_timeout_s == 1800.0  # a model that loads for 15 min must not fail at 10
    assert config.wave_mode and config.dp_size == 2


def summary(**changes):
    base = dict(model_identity="tiny-moe@abc", dp_size=2, enable_expert_parallel=True, num_experts=8,
                sync_interval=32, prefill_schedule_interval=1, max_model_len=2048, protocol_version=1)
    base.update(changes)
    return parallel_config_summary(EngineConfig(), **base)


def test_agreeing_ranks_pass_in_any_order():
    seen: dict = {}
    assert check_config_agreement(seen, 1, summary()) is None  # rank 0 not seen yet: nothing to compare
    assert check_config_agreement(seen, 0, summary()) is None
    assert check_config_agreement(seen, 2, summary()) is None


def test_a_rank_that_differs_from_rank_0_is_named_with_the_field():
    seen: dict = {}
    assert check_config_agreement(seen, 0, summary()) is None
    problem = check_config_agreement(seen, 1, summary(sync_interval=8))
    assert problem is not None
    assert "engine rank 1 differs from rank 0" in problem and "dp_sync_interval=8 vs 32" in problem


def test_a_mismatch_recorded_before_rank_0_reports_when_rank_0_arrives():
    seen: dict = {}
    assert check_config_agreement(seen, 1, summary(enable_expert_parallel=False)) is None
    problem = check_config_agreement(seen, 0, summary())
    assert problem is not None and "engine rank 1" in problem and "enable_expert_parallel" in problem


def test_a_busy_http_port_fails_before_anything_starts():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind_http_socket("127.0.0.1", port)


def test_a_port_another_deployment_shares_through_so_reuseport_is_busy_too():
    """Another deployment's API servers listen with SO_REUSEPORT, which would let this launcher bind beside them
    (same user) and split their connections without a word: it must fail as any busy port does."""
    from asyncdp.transport.http_socket import listen_shared_port, reserve_shared_port

    with listen_shared_port("127.0.0.1", 0) as other:
        port = other.getsockname()[1]
        with pytest.raises(StartupError, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            reserve_shared_port("127.0.0.1", port)
    # free again: bound, and shared with our own listeners
    with reserve_shared_port("127.0.0.1", port) as mine, listen_shared_port("127.0.0.1", port):
        assert mine.getsockname()[1] == port


class _SlowChild:
    """A child of the stop order that records the grace it was given and never exits by itself."""

    def __init__(self, role: str, *, must_kill: bool = False) -> None:
        self.role, self.rank, self.returncode = role, 0, None
        self.exited = anyio.Event()
        self.grace_s: float | None = None
        self.must_kill = must_kill  # it ignores the signal: its stop ends with SIGKILL
        self.killed = False

        class _Control:
            async def send(self, msg: object) -> None:  # Stopping, at the start of the stop (engines too)
                pass

            async def aclose(self) -> None:
                pass

        self.control = _Control()

    async def stop(self, *, grace_s: float) -> None:
        self.grace_s = grace_s
        if self.must_kill:
            await anyio.sleep(grace_s)
            self.killed = True
        self.exited.set()

    def describe(self) -> str:
        return f"{self.role} (fake)"


@pytest.mark.trio
@pytest.mark.parametrize(("supervised", "expected"), [(None, 3.0 + 5.0), (1, 3.0 + 5.0 - 1.5)])
async def test_a_supervised_node_gives_its_children_less_than_the_supervisor_gives_it(tmp_path, autojump_clock,
                                                                                      supervised, expected):
    # The supervisor kills a child's tree at --shutdown-timeout + 5 s; a child that used the same deadline for its
    # own stragglers could be SIGKILLed at the moment it killed them, and an orderly stop read as exit 1.
    from asyncdp.launcher.children import stop_all

    node = RunningNode(launch_plan(tmp_path, shutdown_timeout_s=3.0, supervised_rank=supervised), None, str(tmp_path))
    engine = _SlowChild("engine")
    node.children.append(engine)  # type: ignore[arg-type]
    await stop_all(node)
    assert engine.grace_s == pytest.approx(expected)


@pytest.mark.trio
@pytest.mark.parametrize("must_kill", [False, True], ids=["orderly", "straggler"])
async def test_a_stop_that_had_to_kill_a_straggler_is_a_failure(tmp_path, autojump_clock, must_kill):
    # The launcher exited 0 after SIGKILLing an engine that did not stop within its grace; like the multi-port
    # supervisor (spec §11.3) it now reports that stop as a failure (exit status 1), naming the child.
    from asyncdp.launcher.children import stop_all

    node = RunningNode(launch_plan(tmp_path, shutdown_timeout_s=0.0), None, str(tmp_path))
    node.started = True
    node.children += [_SlowChild("api_server"), _SlowChild("engine", must_kill=must_kill)]  # type: ignore[list-item]
    await stop_all(node)
    if must_kill:
        assert node.failure is not None and "engine (fake)" in node.failure and "api_server" not in node.failure
    else:
        assert node.failure is None
