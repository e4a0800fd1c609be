"""The DP coordinator's startup, in trio's virtual time: CoordinatorReady once every engine rank has
subscribed, the StartupErrors of a bad or missing subscription, and the config check on the heartbeat
interval."""

from __future__ import annotations

import pytest
import trio

from asyncdp.coordinator.core import CoordinatorConfig
from asyncdp.errors import ConfigError, StartupError
from asyncdp.messages import CoordinatorReady
from tests.coordinator.harness import MOE2, coordinator

# ---------------------------------------------------------------- startup


@pytest.mark.trio
async def test_coordinator_ready_only_after_all_engines_subscribe(autojump_clock):
    async with coordinator(MOE2) as h:
        e0 = await h.engine(0)
        await trio.sleep(3)
        assert [m for _, m in e0.drain()] == []
        e1 = await h.engine(1)
        (t0, _), (t1, _) = await e0.expect(CoordinatorReady), await e1.expect(CoordinatorReady)
        assert t0 == t1 == pytest.approx(3.0)


@pytest.mark.trio
async def test_duplicate_engine_subscribe_is_startup_error(autojump_clock):
    async with coordinator(MOE2) as h:
        await h.engine(1)
        await h.engine(1)
        await h.done.wait()
    assert isinstance(h.error, StartupError) and "duplicate" in str(h.error)


@pytest.mark.trio
async def test_unknown_engine_rank_is_startup_error(autojump_clock):
    async with coordinator(MOE2) as h:
        await h.engine(2)
        await h.done.wait()
    assert isinstance(h.error, StartupError) and "unknown engine rank 2" in str(h.error)


@pytest.mark.trio
async def test_missing_engine_after_subscribe_timeout_names_the_rank(autojump_clock):
    config = CoordinatorConfig(dp_size=3, wave_mode=False, subscribe_timeout_s=30)
    async with coordinator(config) as h:
        await h.engine(0)
        await h.engine(2)
        await h.done.wait()
    assert isinstance(h.error, StartupError) and "[1]" in str(h.error)
    assert h.ended_at == pytest.approx(30.0)


def test_config_rejects_heartbeat_interval_above_timeout():
    with pytest.raises(ConfigError, match="--dp-heartbeat-interval-s"):
        CoordinatorConfig(dp_size=2, wave_mode=True, heartbeat_interval_s=6.0)
