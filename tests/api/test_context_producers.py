"""``AppState.producers()`` refuses new work in the same states as the gate and ``/health`` (``refusing``):
HTTP draining, and the client's own shutdown (``--shutdown-timeout``'s drain) before HTTP stops."""

from __future__ import annotations

from typing import Any

import pytest

from asyncdp.api.context import AppState
from asyncdp.errors import ShuttingDownError, UnavailableError
from asyncdp.testing import FakeEngineClient

TASK_GROUP: Any = object()  # producers() only hands it out


def state() -> AppState:
    fake = FakeEngineClient()
    return AppState(client=fake, metrics=fake.metrics, api_key=None, served_model_names=("m",),
                    task_group=TASK_GROUP)


def test_serving_hands_out_the_task_group() -> None:
    assert state().producers() is TASK_GROUP


def test_not_serving_yet_is_unavailable() -> None:
    s = state()
    s.task_group = None
    with pytest.raises(UnavailableError) as caught:
        s.producers()
    assert not isinstance(caught.value, ShuttingDownError)


def test_http_draining_refuses() -> None:
    s = state()
    s.draining = True
    with pytest.raises(ShuttingDownError):
        s.producers()


def test_the_clients_shutdown_refuses_before_http_drains() -> None:
    s = state()
    s.client.shutting_down = True  # type: ignore[misc]
    assert s.refusing and not s.draining
    with pytest.raises(ShuttingDownError):
        s.producers()
