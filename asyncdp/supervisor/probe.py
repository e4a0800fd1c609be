"""Probing the supervised children's ``/health`` (spec §11.3 "Probing").

One probe of one child is ``GET {scheme}://{host}:{port}/health``: a tiny HTTP/1.1 request over
``anyio.connect_tcp`` (TLS with certificate checks off when the children serve https), bounded by
``--dp-supervisor-probe-timeout-s`` per attempt, reading only the status line. Any HTTP answer counts at once
(200 healthy, anything else unhealthy, no retry); a connection error, a timeout or a reply that is no HTTP status
line is retried, up to ``attempts`` attempts in all, sleeping ``--dp-supervisor-probe-interval-s`` between them.
The number of attempts is 1 before the node is ready and ``--dp-supervisor-probe-failure-threshold`` after.

The pure parts are plain functions: :func:`probe_host` (the host mapping), :func:`parse_status_line`,
:func:`attempts_per_probe` and :func:`judge_round` (the verdict of one round over every child).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import anyio
import anyio.abc

HEALTH_PATH = "/health"
_MAX_STATUS_LINE = 8192
_HOST_MAPPING = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
# What a probe attempt may fail with short of an HTTP answer: refused, reset, TLS failure (ssl.SSLError is an
# OSError), the per-attempt deadline, a peer that closed before answering, a reply that is not HTTP.
_CONNECTION_ERRORS = (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, anyio.IncompleteRead,
                      ValueError)


def probe_host(host: str | None) -> str:
    """Where to reach a child bound on ``host``: ``0.0.0.0`` -> ``127.0.0.1``, ``::`` -> ``::1``, unset (all
    interfaces) -> ``127.0.0.1``; any other host as it is."""
    return _HOST_MAPPING.get(host or "", host or "127.0.0.1")


def parse_status_line(line: bytes) -> int:
    """``b"HTTP/1.1 503 Service Unavailable"`` -> 503. ValueError for anything that is no HTTP status line."""
    parts = line.rstrip(b"\r\n").split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP status line: {line[:80]!r}")
    return int(parts[1])


def attempts_per_probe(*, ready: bool, failure_threshold: int) -> int:
    """Connection attempts one probe makes: 1 before the node is ready, the failure threshold after."""
    return failure_threshold if ready else 1


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The outcome of one probe of one child: the HTTP status it answered, or why no answer came."""

    dp_rank: int
    port: int
    status: int | None  # None: no HTTP answer within the attempts
    error: str | None = None  # why not, when status is None

    @property
    def healthy(self) -> bool:
        return self.status == 200

    def describe(self) -> str:
        """``"answered HTTP 503"`` or ``"unreachable (ConnectionRefusedError: ... after 3 attempts)"``."""
        if self.status is not None:
            return f"answered HTTP {self.status}"
        return f"unreachable ({self.error})"


@dataclass(frozen=True, slots=True)
class RoundVerdict:
    """What one probe round means. ``ready``: every child healthy. ``polling``: not ready yet, keep probing.
    ``unhealthy``: the node was ready and ``unhealthy`` lists the children that failed: shut down."""

    kind: Literal["ready", "polling", "unhealthy"]
    unhealthy: tuple[ProbeResult, ...] = ()


def judge_round(results: Sequence[ProbeResult], *, ready: bool) -> RoundVerdict:
    """The verdict of a round: all healthy -> ready; any unhealthy after ready -> unhealthy; before -> polling."""
    bad = tuple(r for r in results if not r.healthy)
    if not bad:
        return RoundVerdict("ready")
    return RoundVerdict("unhealthy" if ready else "polling", bad)


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """Where one probe goes."""

    dp_rank: int
    host: str  # already mapped (probe_host)
    port: int
    tls: bool = False


def _client_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False  # the children's own certificate, often self-signed: not checked (§11.3)
    context.verify_mode = ssl.CERT_NONE
    return context


async def get_status(target: ProbeTarget, *, timeout_s: float, path: str = HEALTH_PATH) -> int:
    """One ``GET path`` to ``target``; the status code of the answer. Raises one of the connection errors."""
    authority = f"[{target.host}]" if ":" in target.host else target.host
    request = (f"GET {path} HTTP/1.1\r\nHost: {authority}:{target.port}\r\nUser-Agent: asyncdp-supervisor\r\n"
               "Accept: */*\r\nConnection: close\r\n\r\n").encode("ascii")
    with anyio.fail_after(timeout_s):
        stream: anyio.abc.ByteStream
        if target.tls:
            stream = await anyio.connect_tcp(target.host, target.port, tls=True, ssl_context=_client_context(),
                                             tls_standard_compatible=False)
        else:
            stream = await anyio.connect_tcp(target.host, target.port)
        async with stream:
            await stream.send(request)
            buffer = b""
            while b"\n" not in buffer:
                if len(buffer) > _MAX_STATUS_LINE:
                    raise ValueError("the status line is longer than 8 KiB")
                buffer += await stream.receive()
    return parse_status_line(buffer.partition(b"\n")[0])


def _reason(exc: BaseException) -> str:
    while isinstance(exc, OSError) and isinstance(exc.__cause__, OSError):
        exc = exc.__cause__  # anyio's "All connection attempts failed" wraps the one that says why
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, anyio.EndOfStream | anyio.IncompleteRead):
        return "connection closed before an answer"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def probe_child(target: ProbeTarget, *, attempts: int, timeout_s: float, interval_s: float) -> ProbeResult:
    """Probe one child: up to ``attempts`` attempts ``interval_s`` apart until one gets an HTTP answer."""
    reason = "no attempt made"
    for attempt in range(attempts):
        if attempt:
            await anyio.sleep(interval_s)
        try:
            status = await get_status(target, timeout_s=timeout_s)
        except _CONNECTION_ERRORS as exc:
            reason = _reason(exc)
            continue
        return ProbeResult(target.dp_rank, target.port, status)
    suffix = f" after {attempts} attempts" if attempts > 1 else ""
    return ProbeResult(target.dp_rank, target.port, None, reason + suffix)


async def probe_round(targets: Sequence[ProbeTarget], *, attempts: int, timeout_s: float,
                      interval_s: float) -> list[ProbeResult]:
    """Probe every child concurrently; results in the order of ``targets``."""
    results: list[ProbeResult | None] = [None] * len(targets)

    async def one(i: int) -> None:
        results[i] = await probe_child(targets[i], attempts=attempts, timeout_s=timeout_s, interval_s=interval_s)

    async with anyio.create_task_group() as tg:
        for i in range(len(targets)):
            tg.start_soon(one, i)
    return [r for r in results if r is not None]
