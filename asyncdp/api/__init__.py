"""The OpenAI-compatible HTTP layer: ``create_app`` builds the Quart app, ``serve_http`` serves it.

Both are imported on first use (PEP 562): importing a light module of the package (``engine_client``,
``metrics``, ``metric_values``: what the DP client, the simulator and the bench workers need) must not import the
Quart app and its routes, half a second or more of every such process's start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncdp.api.app import create_app, set_draining
    from asyncdp.api.serve import serve_http

__all__ = ["create_app", "serve_http", "set_draining"]

_HOMES = {"create_app": "asyncdp.api.app", "set_draining": "asyncdp.api.app", "serve_http": "asyncdp.api.serve"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)
