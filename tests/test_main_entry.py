"""``python -m asyncdp`` / the ``asyncdp`` command: a server's top process ends with ``os._exit`` after flushing its
output (the interpreter's teardown would add up to seconds past the stop bound); other commands exit normally, but
for ``bench calibrate`` (tests/test_main_entry_calibrate.py)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

import asyncdp.__main__ as entry_module


class Exited(Exception):
    def __init__(self, how: str, code: int) -> None:
        super().__init__(how, code)
        self.how, self.code = how, code


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(entry_module, "main", lambda: 3)
    monkeypatch.setattr(logging, "shutdown", lambda: calls.append("logging.shutdown"))

    def os_exit(code: int) -> None:
        raise Exited("os._exit", code)

    def sys_exit(code: int) -> None:
        raise Exited("sys.exit", code)

    monkeypatch.setattr(entry_module.os, "_exit", os_exit)
    monkeypatch.setattr(entry_module.sys, "exit", sys_exit)
    return calls


@pytest.mark.parametrize(("argv", "how"), [(["asyncdp", "serve", "m"], "os._exit"),
                                           (["asyncdp", "model", "list"], "sys.exit"),
                                           (["asyncdp"], "sys.exit")])
def test_only_serve_skips_the_interpreter_teardown_and_flushes_first(monkeypatch: pytest.MonkeyPatch,
                                                                     exits: list[str], argv: list[str],
                                                                     how: str) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(Exited) as done:
        entry_module.entry()
    assert (done.value.how, done.value.code) == (how, 3)
    assert exits == (["logging.shutdown"] if how == "os._exit" else [])


def test_a_served_process_output_is_complete_after_os_exit() -> None:
    """A usage error of ``serve`` exits 2 through the same path, its one line intact on a pipe."""
    out = subprocess.run([sys.executable, "-m", "asyncdp", "serve", "builtin:tiny-dense", "--port", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.startswith("asyncdp: error: ") and out.stderr.endswith("\n")
