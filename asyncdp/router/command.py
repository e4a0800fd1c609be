"""``asyncdp route``: the sub-command's flags (:func:`add_route_parser`) and its run (:func:`run`).

The flags are checked by :meth:`~asyncdp.router.settings.RouterSettings.build` before anything starts; a bad one
is a ConfigError, which the CLI prints as one ``asyncdp: error: ...`` line with exit status 2. The process itself
(:mod:`asyncdp.router.process`) is imported only to run, so ``asyncdp --help`` stays cheap.
"""

from __future__ import annotations

import argparse
from typing import Any

from asyncdp.router.settings import (
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    DEFAULT_STALE_AFTER_S,
    RouterSettings,
)

LOG_LEVELS = ("debug", "info", "warning", "error")


def add_route_parser(sub: Any) -> None:
    """Register ``route`` on the top-level subparsers ``sub``."""
    p = sub.add_parser("route", allow_abbrev=False,
                       help="one address in front of several asyncdp endpoints: an HTTP proxy that routes each "
                            "request by the endpoints' GET /load")
    p.add_argument("--endpoint", action="append", default=[], metavar="URL",
                   help="an endpoint's base URL, http(s)://HOST:PORT (repeat for each endpoint)")
    p.add_argument("--host", default="0.0.0.0", help="the address to listen on (default: 0.0.0.0)")
    p.add_argument("--port", type=int, default=8000, help="the port to listen on; 0: any free port (default: 8000)")
    p.add_argument("--poll-interval-s", type=float, default=DEFAULT_POLL_INTERVAL_S, metavar="S",
                   help=f"seconds between two GET /load of an endpoint (default: {DEFAULT_POLL_INTERVAL_S})")
    p.add_argument("--stale-after-s", type=float, default=DEFAULT_STALE_AFTER_S, metavar="S",
                   help="an endpoint whose last /load answer is older than this is not used "
                        f"(default: {DEFAULT_STALE_AFTER_S})")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S, metavar="S",
                   help="on SIGTERM/SIGINT, seconds the requests in flight get to finish before they are "
                        f"cancelled (default: {DEFAULT_SHUTDOWN_TIMEOUT_S:g})")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="log level (default: info)")


def settings_from(ns: argparse.Namespace) -> RouterSettings:
    """The checked settings of parsed ``route`` arguments (ConfigError for a bad value)."""
    return RouterSettings.build(ns.endpoint, host=ns.host, port=ns.port, poll_interval_s=ns.poll_interval_s,
                                stale_after_s=ns.stale_after_s, shutdown_timeout_s=ns.shutdown_timeout,
                                log_level=ns.log_level)


def run(ns: argparse.Namespace) -> int:
    """Run ``asyncdp route`` for parsed arguments ``ns``; returns the exit code."""
    settings = settings_from(ns)
    from asyncdp.router.process import run_router

    return run_router(settings)
