"""Logging set-up shared by every asyncdp process, and the text of the lines that report startup and shutdown.

One line per record, prefixed by the process's role. The startup lines (model resolved, weights loaded, KV
cache, rank ready, serving) and the final "stopped" line are composed by the pure functions below, so their
content is unit-tested without starting a process.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

# Hypercorn's own log goes through this logger (see asyncdp.api.serve), never under the name hypercorn.error.
HTTP_LOGGER = "asyncdp.http"


def setup_logging(*, prefix: str, level: str | int = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(
            f"%(levelname)s %(asctime)s.%(msecs)03d ({prefix} pid={os.getpid()}) %(name)s: %(message)s",
            datefmt="%H:%M:%S",
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Hypercorn's access log is noise under load tests; its error log stays.
    logging.getLogger("hypercorn.access").setLevel(logging.WARNING)


def human_count(n: int) -> str:
    """``1234567`` -> ``"1.23M"``: parameter and token counts, readable at a glance."""
    for scale, suffix in ((10**9, "B"), (10**6, "M"), (10**3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return str(n)


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def weights_line(dp_rank: int, *, num_parameters: int | None, dtype: str | None, device: str | None,
                 took_s: float) -> str:
    """The "weights loaded" stage of one rank; ``num_parameters is None``: a simulated executor (no weights)."""
    if num_parameters is None:
        return f"rank {dp_rank}: simulated executor ready in {took_s:.2f} s (no weights)"
    return (f"rank {dp_rank}: weights loaded in {took_s:.2f} s: {human_count(num_parameters)} parameters, "
            f"{dtype} on {device}")


def kv_cache_line(dp_rank: int, *, num_blocks: int, block_size: int, num_bytes: int | None) -> str:
    """The KV cache of one rank. Block 0 is the executor's scratch block: it holds no request's tokens."""
    usable = max(0, num_blocks - 1)
    size = f" ({human_bytes(num_bytes)})" if num_bytes is not None else ""
    return (f"rank {dp_rank}: KV cache of {usable} blocks x {block_size} tokens = {usable * block_size} tokens"
            f"{size}")


def serving_line(*, model: str, model_path: str | None, scheme: str, host: str, port: int, dp_size: int,
                 api_server_count: int, took_s: float, managed: str | None = None) -> str:
    """The last startup line: what is served, at the address actually bound, by how many processes.

    ``managed`` names the ranks this endpoint serves when they are not all of the deployment's (a hybrid node,
    an external rank server): ``"ranks 2..3"``."""
    shown_host = f"[{host}]" if ":" in host else host
    what = model if not model_path or model_path == model else f"{model} ({model_path})"
    ranks = f"{dp_size} rank{'s' if dp_size != 1 else ''}"
    if managed:
        ranks = f"{managed} of {ranks}"
    apis = f"{api_server_count} API server{'s' if api_server_count != 1 else ''}"
    return f"serving {what} on {scheme}://{shown_host}:{port} with {ranks} ({apis}); startup took {took_s:.1f} s"


@dataclass(slots=True)
class DrainCounts:
    """What one API server's shutdown did with its in-flight requests."""

    drained: int = 0  # in flight when the shutdown began and completed normally before the drain deadline
    # every other request in flight then: failed during the drain (its rank died, a second signal killed it),
    # aborted (by its caller, an operator, its rank's own deadline), or abandoned at the deadline (or at once, with
    # --shutdown-timeout 0)
    aborted: int = 0


def stopped_line(counts: list[DrainCounts], *, exit_status: int, unreported: int = 0) -> str:
    """The deployment's last line: requests drained and aborted over every API server, and the exit status.

    ``unreported``: API servers that exited without reporting their counts (killed, crashed); they are named
    rather than silently counted as zero. A failure was logged where it happened; the status says it again."""
    drained = sum(c.drained for c in counts)
    aborted = sum(c.aborted for c in counts)

    def requests(n: int) -> str:
        return f"{n} request{'s' if n != 1 else ''}"

    text = "stopped" if exit_status == 0 else "stopped after a failure"
    text += f": {requests(drained)} drained, {aborted} aborted"
    if unreported:
        text += f" ({unreported} API server{'s' if unreported != 1 else ''} did not report)"
    return f"{text}; exit status {exit_status}"
