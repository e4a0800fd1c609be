"""``asyncdp bench calibrate`` loads torch as a server does, so it ends as a server does: ``os._exit`` after its
output is flushed, with no interpreter teardown (collecting torch's objects: 0.5-2.6 s after a Ctrl-C's "stopped
the sweep" line on a loaded machine), and with the 130 or 143 that a stop signal's ``SystemExit`` carries."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import NoReturn

import pytest

import asyncdp.__main__ as entry_module


class Exited(Exception):
    def __init__(self, how: str, code: object) -> None:
        super().__init__(how, code)
        self.how, self.code = how, code


def _exit_as(how: str) -> Callable[..., NoReturn]:
    def exit_(code: object = 0) -> NoReturn:
        raise Exited(how, code)
    return exit_


@pytest.fixture
def flushed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(logging, "shutdown", lambda: calls.append("logging.shutdown"))
    monkeypatch.setattr(entry_module.os, "_exit", _exit_as("os._exit"))
    monkeypatch.setattr(entry_module.sys, "exit", _exit_as("sys.exit"))
    return calls


@pytest.mark.parametrize("status", [0, 1, 2])
def test_bench_calibrate_skips_the_interpreter_teardown(monkeypatch: pytest.MonkeyPatch, flushed: list[str],
                                                        status: int) -> None:
    monkeypatch.setattr(sys, "argv", ["asyncdp", "bench", "calibrate", "--quick"])
    monkeypatch.setattr(entry_module, "main", lambda: status)
    with pytest.raises(Exited) as done:
        entry_module.entry()
    assert (done.value.how, done.value.code) == ("os._exit", status)
    assert flushed == ["logging.shutdown"]


@pytest.mark.parametrize("status", [130, 143])
def test_bench_calibrate_stopped_by_a_signal_keeps_its_status_and_skips_the_teardown(
        monkeypatch: pytest.MonkeyPatch, flushed: list[str], status: int) -> None:
    def stopped() -> int:
        raise SystemExit(status)  # what stop_on_signals raises once it said "stopped the sweep"

    monkeypatch.setattr(sys, "argv", ["asyncdp", "bench", "calibrate"])
    monkeypatch.setattr(entry_module, "main", stopped)
    with pytest.raises(Exited) as done:
        entry_module.entry()
    assert (done.value.how, done.value.code) == ("os._exit", status)


def test_bench_routing_stopped_by_a_signal_still_exits_normally(monkeypatch: pytest.MonkeyPatch,
                                                                flushed: list[str]) -> None:
    def stopped() -> int:
        raise SystemExit(130)

    monkeypatch.setattr(sys, "argv", ["asyncdp", "bench", "routing"])
    monkeypatch.setattr(entry_module, "main", stopped)
    with pytest.raises(SystemExit) as done:
        entry_module.entry()
    assert done.value.code == 130 and flushed == []
