"""No variable that holds a secret reaches a launcher's children: they get the API key and the deployment secret
in their role configs, and a child's environment is readable in /proc (and dumped by some libraries)."""

from __future__ import annotations

import pytest

from asyncdp.transport.control import _child_env


@pytest.mark.parametrize("name", ["ASYNCDP_API_KEY", "VLLM_API_KEY", "ASYNCDP_DP_SECRET"])
def test_a_childs_environment_holds_no_secret_variable(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "not for children")
    monkeypatch.setenv("ASYNCDP_LOG_LEVEL", "INFO")
    env = _child_env({"EXTRA": "1"})
    assert name not in env
    assert env["ASYNCDP_LOG_LEVEL"] == "INFO" and env["EXTRA"] == "1"  # everything else passes
