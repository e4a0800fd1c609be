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
     │    └── ShuttingDownError      the deployment is draining or stopping
     ├── ProtocolError               a malformed or unknown inter-process message
     ├── StartupError                a handshake check, deadline or child process failed at startup (exit 1)
     └── PauseError                  pause/resume misuse (resume while a pause is still in progress)

The mapping from these to HTTP status codes and OpenAI error JSON lives in one place: ``asyncdp.api.errors``.
"""

from __future__ import annotations


class AsyncDPError(Exception):
    """Base class of every error asyncdp raises on purpose."""


class ConfigError(AsyncDPError):
    """Invalid command line or configuration. The message says what to change."""


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


class ShuttingDownError(UnavailableError):
    """The deployment is shutting down and takes no new work."""


class ProtocolError(AsyncDPError):
    """A malformed, unknown or out-of-order inter-process message."""


class StartupError(AsyncDPError):
    """Startup failed: a handshake check, a deadline or a child process."""


class PauseError(AsyncDPError):
    """Pause/resume misuse, e.g. resume while a pause is still in progress."""
