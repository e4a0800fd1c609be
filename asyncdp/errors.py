"""The one exception tree of asyncdp.

::

    AsyncDPError
     ├── ConfigError                 bad command line or configuration (exit code 2 before any child starts)
     │    └── ModelNotFoundError     unknown built-in name, or a directory that is not a checkpoint
     ├── InvalidRequestError         a request the engine cannot accept (HTTP 400); names the field
     │    ├── InvalidSamplingParams  a sampling parameter outside its allowed range
     │    └── PromptTooLongError     prompt longer than max_model_len
     ├── ModelNotServedError         the request names a model this server does not serve (HTTP 404)
     ├── QueueFullError              the admission limit is reached (HTTP 429)
     ├── UnavailableError            no rank can serve, or the server is shutting down (HTTP 503)
     │    ├── EngineDeadError        the engine that owned a request died
     │    ├── EngineTimeoutError     an engine did not take or answer a message within its deadline
     │    └── ShuttingDownError      the deployment is draining or stopping
     ├── ProtocolError               a malformed or unknown inter-process message
     │    ├── ForeignPeerError       a link's first frame is not this build's: another service, or another version
     │    └── LinkAuthError          a link's peer failed the deployment-secret handshake (another secret, or none)
     ├── StartupError                a handshake check, deadline or child process failed at startup (exit 1)
     │    └── ChildExited            a child process exited before it reported what startup waits for
     ├── PauseError                  pause/resume misuse (resume while a pause is still in progress)
 ├── PrefixCacheBusyError        a rank refused to reset its prefix cache: a request holds KV blocks
     ├── RankTornDown                the MoE group was torn down (coordinator Teardown, lost coordinator)
     ├── DPGroupError                a collective of the DP control group failed (lockstep violation, lost peer)
     │    └── DPGroupAborted         the group was aborted (teardown); no collective can complete any more
     └── HTTPError                   an error the HTTP layer decides itself (bad body, auth, size), with a status

Helpers: :func:`leaf_exceptions` flattens an exception group (nested groups included) into its leaves, for the
roles that report the one meaningful error of a failed task group; :func:`unwrap_sole_error` re-raises a group
whose one leaf is an ``Exception`` as that leaf (the simulation harnesses' context managers use it).

The mapping from these to HTTP status codes and OpenAI error JSON lives in one place: ``asyncdp.api.errors``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class AsyncDPError(Exception):
    """Base class of every error asyncdp raises on purpose."""


class ConfigError(AsyncDPError):
    """Invalid command line or configuration. The message says what to change."""


class SimulationStalled(AsyncDPError):
    """A simulated run did not finish within its virtual deadline (a bug of the simulator or of a policy)."""


class ModelNotFoundError(ConfigError):
    """The model is neither a built-in name nor a Hugging Face checkpoint directory."""


class InvalidRequestError(AsyncDPError):
    """A request the engine cannot accept. ``field`` names the offending parameter when there is one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidSamplingParams(InvalidRequestError):
    """A sampling parameter is outside its allowed range."""


class PromptTooLongError(InvalidRequestError):
    """The prompt (plus at least one generated token) does not fit in ``max_model_len``."""


class ModelNotServedError(AsyncDPError):
    """The request names a model this server does not serve."""


class QueueFullError(AsyncDPError):
    """The admission queue limit is reached; retry later."""


class UnavailableError(AsyncDPError):
    """No rank can serve the request right now."""


class EngineDeadError(UnavailableError):
    """The engine that owned the request died."""


class EngineTimeoutError(UnavailableError):
    """An engine rank did not accept a message (its link stayed full) or answer a call within the deadline; the
    message names the rank and the wait."""


class ShuttingDownError(UnavailableError):
    """The deployment is shutting down and takes no new work."""


class ProtocolError(AsyncDPError):
    """A malformed, unknown or out-of-order inter-process message."""


class ForeignPeerError(ProtocolError):
    """The first frame on a link is not one of this build's messages, so the peer is not what the address was meant
    to name: another service answers there (an HTTP port gives a "frame length" of ASCII ``HTTP``), or an asyncdp of
    another protocol version (a tagged msgpack map this build cannot decode: ``other_version``). ``addr`` is the
    link's address or name, ``seen`` what arrived, quoted. :meth:`handshake_problem` is the one-line startup
    failure for the side that connected to a handshake listener."""

    def __init__(self, addr: str, seen: str, *, other_version: bool, protocol_version: int) -> None:
        what = "an asyncdp peer of another protocol version" if other_version else "not an asyncdp peer"
        super().__init__(f"{addr}: {what} ({seen})")
        self.addr = addr
        self.seen = seen
        self.other_version = other_version
        self.protocol_version = protocol_version

    def handshake_problem(self, addr: str) -> str:
        """Why joining the handshake listener at ``addr`` failed, and what to change."""
        if self.other_version:
            return (f"the peer at {addr} speaks another asyncdp protocol ({self.seen}); this build speaks "
                    f"protocol_version {self.protocol_version}: run the same asyncdp version on every node")
        return (f"the peer at {addr} is not an asyncdp handshake listener (it sent {self.seen}): check "
                "--data-parallel-address/--data-parallel-rpc-port, which name the head's rpc port, not its HTTP "
                "--port")


class LinkAuthError(ProtocolError):
    """The peer a link connected to failed the deployment-secret handshake (:mod:`asyncdp.transport.link_auth`): it
    holds another secret or none, answered something else, or did not answer in time. ``addr`` is the address
    connected to; the message says what went wrong and what to change. Raised by the side that connected (an
    accepting side drops a stranger with one log line instead)."""

    def __init__(self, addr: str, problem: str) -> None:
        super().__init__(f"the peer at {addr} {problem}")
        self.addr = addr
        self.problem = problem


class StartupError(AsyncDPError):
    """Startup failed: a handshake check, a deadline or a child process."""


class PauseError(AsyncDPError):
    """Pause/resume misuse, e.g. resume while a pause is still in progress."""


class PrefixCacheBusyError(AsyncDPError):
    """A rank refused ``POST /reset_prefix_cache``: a request holds KV blocks (vLLM's reset fails then too; the
    route answers ``{"success": false}``)."""


class _Child(Protocol):
    @property
    def returncode(self) -> int | None: ...

    def describe(self) -> str: ...


class ChildExited(StartupError):
    """A child process exited before it reported the event that startup waits for (spec E12)."""

    def __init__(self, child: _Child) -> None:
        super().__init__(f"{child.describe()} exited with code {child.returncode} during startup")
        self.child = child


class RankTornDown(AsyncDPError):
    """The group was torn down (coordinator Teardown, lost coordinator in MoE mode). ``peer_stopped``: by a peer's
    orderly departure while the coordinator's node stopped, which this rank's node (its own launch: an external-LB
    rank server, a hybrid node) may follow a moment later (spec §8.7); ``cause``: the teardown's reason."""

    def __init__(self, message: str, *, peer_stopped: bool = False, cause: str = "") -> None:
        super().__init__(message)
        self.peer_stopped = peer_stopped
        self.cause = cause


class DPGroupError(AsyncDPError):
    """A collective of the DP control group failed (lockstep violation, bad arguments, lost peer)."""


class DPGroupAborted(DPGroupError):
    """The group was aborted (teardown); no collective can complete any more."""


class HTTPError(AsyncDPError):
    """An error the HTTP layer itself decides (bad body, unknown route, auth), with its status."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """Every non-group exception inside ``exc`` (``[exc]`` itself when it is not a group), depth first."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    out: list[BaseException] = []
    for sub in exc.exceptions:
        out.extend(leaf_exceptions(sub))
    return out


@contextmanager
def unwrap_sole_error() -> Iterator[None]:
    """Meanwhile, an exception group with exactly one leaf, an ``Exception``, is re-raised as that leaf (so a
    test's ``pytest.raises`` sees the error its body raised, not a task group's wrapping); any other group
    propagates as it is."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = leaf_exceptions(group)
        if len(leaves) == 1 and isinstance(leaves[0], Exception):
            raise leaves[0] from None
        raise
