"""The router's frozen configuration, checked when it is built: every bad value is a ConfigError that names the
flag and says what to give instead (``asyncdp route`` prints it as one ``asyncdp: error: ...`` line, exit 2)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from asyncdp.errors import ConfigError

DEFAULT_POLL_INTERVAL_S = 0.05
DEFAULT_STALE_AFTER_S = 1.0
DEFAULT_SHUTDOWN_TIMEOUT_S = 0.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0


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


@dataclass(frozen=True, slots=True)
class RouterSettings:
    endpoints: tuple[str, ...]
    host: str = "0.0.0.0"
    port: int = 8000
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    log_level: str = "info"

    @classmethod
    def build(cls, endpoints: Sequence[str] | None, *, host: str = "0.0.0.0", port: int = 8000,
              poll_interval_s: float = DEFAULT_POLL_INTERVAL_S, stale_after_s: float = DEFAULT_STALE_AFTER_S,
              shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S, log_level: str = "info") -> RouterSettings:
        """Checked settings, or the ConfigError of the first bad value."""
        if not endpoints:
            raise ConfigError("give at least one --endpoint URL, e.g. --endpoint http://127.0.0.1:8000")
        urls = [endpoint_url(e) for e in endpoints]
        seen: set[str] = set()
        for given, url in zip(endpoints, urls, strict=True):
            if url in seen:
                raise ConfigError(f"--endpoint {given} is given twice (as {url}); give each endpoint once")
            seen.add(url)
        if not 0 <= port <= 65535:
            raise ConfigError(f"--port must be in 0..65535 (0: any free port), got {port}")
        if not host:
            raise ConfigError("--host must not be empty")
        _positive("--poll-interval-s", poll_interval_s)
        _positive("--stale-after-s", stale_after_s)
        if not (math.isfinite(shutdown_timeout_s) and shutdown_timeout_s >= 0):
            raise ConfigError(f"--shutdown-timeout must be a number of seconds >= 0, got {shutdown_timeout_s:g}")
        if stale_after_s < poll_interval_s:
            raise ConfigError(f"--stale-after-s ({stale_after_s:g}) must be at least --poll-interval-s "
                              f"({poll_interval_s:g}): every answer would be stale before the next poll")
        return cls(tuple(urls), host, port, poll_interval_s, stale_after_s, shutdown_timeout_s,
                   log_level=log_level)
