"""The router's frozen configuration, checked when it is built: every bad value is a ConfigError that names the
flag and says what to give instead (``asyncdp route`` prints it as one ``asyncdp: error: ...`` line, exit 2)."""

from __future__ import annotations

import math
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from asyncdp.config.files import check_tls_files
from asyncdp.config.flags import HTTP_BACKENDS
from asyncdp.errors import ConfigError

DEFAULT_POLL_INTERVAL_S = 0.05
DEFAULT_STALE_AFTER_S = 1.0
DEFAULT_SHUTDOWN_TIMEOUT_S = 0.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
# An idle upstream connection is dropped here before the endpoint's Hypercorn drops it (its keep-alive timeout is
# 5 s): reusing one the endpoint is closing at that moment would fail a request after it was sent (a 502).
DEFAULT_UPSTREAM_KEEPALIVE_S = 2.0
DEFAULT_UPSTREAM_MAX_IDLE_CONNECTIONS = 256
# The largest request body: asyncdp serve's default --max-request-body-bytes for a --max-model-len of up to
# 1 Mi tokens (64 bytes a token); an endpoint with a lower limit answers its own 413, which comes back as it is.
DEFAULT_MAX_REQUEST_BODY_BYTES = 64 * 1024 * 1024
MIN_REQUEST_BODY_BYTES = 1024  # as asyncdp serve's --max-request-body-bytes
# A body up to this size is held whole, so a request can fail over to another endpoint; a larger one is streamed.
DEFAULT_REPLAY_BUFFER_BYTES = 1024 * 1024


def endpoint_url(text: str) -> str:
    """``text`` as ``scheme://host:port`` (scheme and host lower-case, no trailing slash), or a ConfigError."""
    hint = f"--endpoint must be a base URL such as http://127.0.0.1:8000 (scheme, host and port only), got {text!r}"
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        raise ConfigError(hint) from None
    if (parts.scheme not in ("http", "https") or not parts.hostname or port is None or port == 0
            or parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password):
        raise ConfigError(hint)
    host = parts.hostname.lower()
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}:{port}"


def _positive(flag: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} must be a number of seconds > 0, got {value:g}")
    return value


def check_ca_file(path: str) -> None:
    """``--upstream-ca-file`` is a readable PEM file of CA certificates, or a ConfigError."""
    if not os.access(path, os.R_OK) or not os.path.isfile(path):
        raise ConfigError(f"--upstream-ca-file {path!r} is not a readable file")
    try:
        ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--upstream-ca-file {path!r} does not load as PEM CA certificates ({exc})") from None


@dataclass(frozen=True, slots=True)
class RouterSettings:
    endpoints: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = 8000
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    poll_timeout_s: float | None = None  # None: stale_after_s (see poll_deadline_s)
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    upstream_keepalive_s: float = DEFAULT_UPSTREAM_KEEPALIVE_S
    upstream_max_idle_connections: int = DEFAULT_UPSTREAM_MAX_IDLE_CONNECTIONS
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    replay_buffer_bytes: int = DEFAULT_REPLAY_BUFFER_BYTES
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    upstream_ca_file: str | None = None
    backend: str = "asyncio"  # the anyio backend the process runs on (as asyncdp serve's --backend)
    log_level: str = "info"

    @property
    def poll_deadline_s(self) -> float:
        """The bound on one ``GET /load`` poll: ``--poll-timeout-s``, by default ``--stale-after-s``."""
        return self.stale_after_s if self.poll_timeout_s is None else self.poll_timeout_s

    @property
    def scheme(self) -> str:
        """How clients reach the router: ``https`` with ``--ssl-certfile``."""
        return "https" if self.ssl_certfile else "http"

    @classmethod
    def build(cls, endpoints: Sequence[str] | None, **values: Any) -> RouterSettings:
        """Checked settings, or the ConfigError of the first bad value. ``values``: the other fields, by name
        (a missing one takes its default)."""
        if not endpoints:
            raise ConfigError("give at least one --endpoint URL, e.g. --endpoint http://127.0.0.1:8000")
        urls = [endpoint_url(e) for e in endpoints]
        seen: set[str] = set()
        for given, url in zip(endpoints, urls, strict=True):
            if url in seen:
                raise ConfigError(f"--endpoint {given} is given twice (as {url}); give each endpoint once")
            seen.add(url)
        s = cls(tuple(urls), **values)
        s._check()
        return s

    def _check(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in 0..65535 (0: any free port), got {self.port}")
        if not self.host:
            raise ConfigError("--host must not be empty")
        if self.backend not in HTTP_BACKENDS:
            raise ConfigError(f"--backend must be one of {', '.join(HTTP_BACKENDS)}, got {self.backend!r}")
        for flag, value in (("--poll-interval-s", self.poll_interval_s), ("--stale-after-s", self.stale_after_s),
                            ("--poll-timeout-s", self.poll_deadline_s),
                            ("--connect-timeout-s", self.connect_timeout_s),
                            ("--upstream-keepalive-s", self.upstream_keepalive_s)):
            _positive(flag, value)
        if not (math.isfinite(self.shutdown_timeout_s) and self.shutdown_timeout_s >= 0):
            raise ConfigError(f"--shutdown-timeout must be a number of seconds >= 0, got {self.shutdown_timeout_s:g}")
        if self.stale_after_s < self.poll_interval_s:
            raise ConfigError(f"--stale-after-s ({self.stale_after_s:g}) must be at least --poll-interval-s "
                              f"({self.poll_interval_s:g}): every answer would be stale before the next poll")
        if self.poll_deadline_s > self.stale_after_s:
            raise ConfigError(f"--poll-timeout-s ({self.poll_deadline_s:g}) must be at most --stale-after-s "
                              f"({self.stale_after_s:g}): a slower answer would be stale on arrival")
        if self.upstream_max_idle_connections < 0:
            raise ConfigError(f"--upstream-max-idle-connections must be >= 0, got {self.upstream_max_idle_connections}")
        if self.max_request_body_bytes < MIN_REQUEST_BODY_BYTES:
            raise ConfigError(f"--max-request-body-bytes must be >= {MIN_REQUEST_BODY_BYTES}, "
                              f"got {self.max_request_body_bytes}")
        if not 0 <= self.replay_buffer_bytes <= self.max_request_body_bytes:
            raise ConfigError(f"--replay-buffer-bytes must be in 0..--max-request-body-bytes "
                              f"({self.max_request_body_bytes}), got {self.replay_buffer_bytes}")
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ConfigError("--ssl-keyfile and --ssl-certfile must be provided together")
        if self.ssl_certfile is not None and self.ssl_keyfile is not None:
            check_tls_files(self.ssl_certfile, self.ssl_keyfile)
        if self.upstream_ca_file is not None:
            if not any(url.startswith("https://") for url in self.endpoints):
                raise ConfigError("--upstream-ca-file is given but no --endpoint is an https:// URL")
            check_ca_file(self.upstream_ca_file)
