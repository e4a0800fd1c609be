"""``asyncdp route``: the sub-command's flags (:func:`add_route_parser`) and its run (:func:`run`).

The flags are checked by :meth:`~asyncdp.router.settings.RouterSettings.build` before anything starts; a bad one
is a ConfigError, which the CLI prints as one ``asyncdp: error: ...`` line with exit status 2. The process itself
(:mod:`asyncdp.router.process`) is imported only to run, so ``asyncdp --help`` stays cheap.
"""

from __future__ import annotations

import argparse
from typing import Any

from asyncdp.config.flags import HTTP_BACKENDS
from asyncdp.router.settings import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_REPLAY_BUFFER_BYTES,
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    DEFAULT_STALE_AFTER_S,
    DEFAULT_UPSTREAM_KEEPALIVE_S,
    DEFAULT_UPSTREAM_MAX_IDLE_CONNECTIONS,
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
    p.add_argument("--ssl-keyfile", default=None, help="TLS key file of the router's listener (requires "
                                                      "--ssl-certfile)")
    p.add_argument("--ssl-certfile", default=None, help="TLS certificate file of the router's listener (requires "
                                                       "--ssl-keyfile)")
    p.add_argument("--upstream-ca-file", default=None, metavar="PATH",
                   help="CA certificates (PEM) that https:// endpoints' certificates must chain to (default: the "
                        "system's trusted CAs)")
    p.add_argument("--poll-interval-s", type=float, default=DEFAULT_POLL_INTERVAL_S, metavar="S",
                   help=f"seconds between two GET /load of an endpoint (default: {DEFAULT_POLL_INTERVAL_S})")
    p.add_argument("--stale-after-s", type=float, default=DEFAULT_STALE_AFTER_S, metavar="S",
                   help="an endpoint whose last /load answer is older than this is not used "
                        f"(default: {DEFAULT_STALE_AFTER_S})")
    p.add_argument("--poll-timeout-s", type=float, default=None, metavar="S",
                   help="seconds one GET /load may take before the endpoint counts as down, and the requests in "
                        "flight there that heard nothing from it since are ended or sent elsewhere (default: "
                        "--stale-after-s)")
    p.add_argument("--connect-timeout-s", type=float, default=DEFAULT_CONNECT_TIMEOUT_S, metavar="S",
                   help="seconds to connect to an endpoint, or to write to it, before the request fails over "
                        f"(default: {DEFAULT_CONNECT_TIMEOUT_S})")
    p.add_argument("--upstream-keepalive-s", type=float, default=DEFAULT_UPSTREAM_KEEPALIVE_S, metavar="S",
                   help="seconds an idle connection to an endpoint is kept for the next request; keep it below the "
                        f"endpoints' keep-alive timeout (default: {DEFAULT_UPSTREAM_KEEPALIVE_S})")
    p.add_argument("--upstream-max-idle-connections", type=int, default=DEFAULT_UPSTREAM_MAX_IDLE_CONNECTIONS,
                   metavar="N", help="idle connections to the endpoints kept in all "
                                     f"(default: {DEFAULT_UPSTREAM_MAX_IDLE_CONNECTIONS})")
    p.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES, metavar="BYTES",
                   help=f"largest request body; above it HTTP 413 (default: {DEFAULT_MAX_REQUEST_BODY_BYTES})")
    p.add_argument("--replay-buffer-bytes", type=int, default=DEFAULT_REPLAY_BUFFER_BYTES, metavar="BYTES",
                   help="a body up to this size is held whole and can fail over to another endpoint; a larger one "
                        f"is streamed (default: {DEFAULT_REPLAY_BUFFER_BYTES})")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S, metavar="S",
                   help="on SIGTERM/SIGINT, seconds the requests in flight get to finish before they are "
                        f"cancelled (default: {DEFAULT_SHUTDOWN_TIMEOUT_S:g})")
    p.add_argument("--backend", default="asyncio", metavar="{" + ",".join(HTTP_BACKENDS) + "}",
                   help="anyio backend the router runs on (default: asyncio)")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="log level (default: info)")


def settings_from(ns: argparse.Namespace) -> RouterSettings:
    """The checked settings of parsed ``route`` arguments (ConfigError for a bad value)."""
    return RouterSettings.build(
        ns.endpoint, host=ns.host, port=ns.port, poll_interval_s=ns.poll_interval_s,
        stale_after_s=ns.stale_after_s, poll_timeout_s=ns.poll_timeout_s, shutdown_timeout_s=ns.shutdown_timeout,
        connect_timeout_s=ns.connect_timeout_s, upstream_keepalive_s=ns.upstream_keepalive_s,
        upstream_max_idle_connections=ns.upstream_max_idle_connections,
        max_request_body_bytes=ns.max_request_body_bytes, replay_buffer_bytes=ns.replay_buffer_bytes,
        ssl_keyfile=ns.ssl_keyfile, ssl_certfile=ns.ssl_certfile, upstream_ca_file=ns.upstream_ca_file,
        backend=ns.backend, log_level=ns.log_level)


def run(ns: argparse.Namespace) -> int:
    """Run ``asyncdp route`` for parsed arguments ``ns``; returns the exit code."""
    settings = settings_from(ns)
    from asyncdp.router.process import run_router

    return run_router(settings)
