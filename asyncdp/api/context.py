"""What the HTTP handlers share: :class:`AppState` (``app.extensions["asyncdp"]``) and the JSON response helper.

The route modules (``chat``, ``completions``, ``utility_routes``, ``generate``, ``openapi``) import this module,
never ``asyncdp.api.app``: the app factory imports the routes, not the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from anyio.abc import TaskGroup
from quart import Quart, Response

from asyncdp.api.engine_client import EngineClient
from asyncdp.api.errors import error_body
from asyncdp.api.metrics import Metrics
from asyncdp.api.offload import Offload
from asyncdp.api.reasoning_parsers import ReasoningParser
from asyncdp.api.reasoning_tokens import NewTokenCount
from asyncdp.api.request_templates import RequestTemplates
from asyncdp.api.template_roles import TemplateRoles
from asyncdp.api.tool_parsers import ToolCallParser
from asyncdp.config.flags import DEFAULT_MAX_SEQS_PER_REQUEST
from asyncdp.config.generation_config import GenerationDefaults
from asyncdp.config.vllm_flags import DEFAULT_MAX_LOGPROBS
from asyncdp.errors import ModelNotServedError, ShuttingDownError, UnavailableError
from asyncdp.sampling_params import StartMarker

PAUSE_MODES = ("abort", "wait", "keep")
# The 503 of a server that is stopping, answered before it reads a request (a router may send it elsewhere).
DRAINING_MESSAGE = "The server is shutting down."


@dataclass
class AppState:
    """What the handlers share. Stored as ``app.extensions["asyncdp"]``."""

    client: EngineClient
    metrics: Metrics
    api_key: str | None
    served_model_names: tuple[str, ...]
    max_seqs_per_request: int = DEFAULT_MAX_SEQS_PER_REQUEST
    max_request_body_bytes: int = 0
    enable_prompt_tokens_details: bool = False  # usage.prompt_tokens_details.cached_tokens
    # the most logprobs a request may ask (a 400 beyond): --max-logprobs, its -1 the tokenizer's vocabulary size
    logprobs_limit: int = DEFAULT_MAX_LOGPROBS
    generation_defaults: GenerationDefaults = GenerationDefaults()  # --generation-config: for unset fields
    log_requests: bool = False  # --enable-log-requests: one INFO line per prompt accepted
    # --enable-log-outputs (with --enable-log-requests): one INFO line per choice generated, each delta of a stream
    log_outputs: bool = False
    max_log_len: int | None = None  # --max-log-len: the most prompt token ids that line shows (None: all)
    scheduling_policy: str = "fcfs"  # --scheduling-policy: fcfs refuses a priority other than 0 (a 400)
    content_format: str = "string"  # how message content reaches the chat template (asyncdp.api.content_format)
    template_roles: TemplateRoles = field(default_factory=TemplateRoles)  # developer and system messages
    request_templates: RequestTemplates | None = None  # requests' own chat_template; None: refused (a 400)
    # GET /tokenizer_info's answer (--enable-tokenizer-info-endpoint); None: no such route (a 404)
    tokenizer_info: dict[str, Any] | None = None
    tool_parser: type[ToolCallParser] | None = None  # tool_choice "auto" (--enable-auto-tool-choice); None: a 400
    tool_tags_special: bool = False  # the tokenizer marks the parser's tags special: keep them in the text
    reasoning_parser: type[ReasoningParser] | None = None  # --reasoning-parser; None: thinking stays in content
    reasoning_tags_special: bool = False  # the tokenizer marks <think> or </think> special: keep them in the text
    reasoning_end_ids: tuple[int, ...] = ()  # </think>'s token ids: a constraint starts after them (start_after)
    # or after one of these (start_markers): gpt-oss's final header with a content type, qwen3's <tool_call>
    # (reasoning_parsers.end_markers)
    reasoning_end_markers: tuple[StartMarker, ...] = ()
    # a new choice's count of usage's reasoning_tokens, by the parser's tags' ids (reasoning_parsers.token_counter)
    reasoning_counter: NewTokenCount | None = None
    offload: Offload = field(default_factory=Offload)
    task_group: TaskGroup | None = None
    draining: bool = False
    extras: dict[str, Any] = field(default_factory=dict)

    def check_model(self, model: str | None) -> str:
        """The model name to answer with; 404 when the request names another model."""
        if model is None:
            return self.served_model_names[0]
        if model not in self.served_model_names:
            raise ModelNotServedError(f"The model `{model}` does not exist.")
        return model

    @property
    def refusing(self) -> bool:
        """Whether new work is refused with the drain's 503: HTTP is stopping (``draining``), or the client began
        its shutdown (the drain of ``--shutdown-timeout``), before HTTP stops."""
        return self.draining or self.client.shutting_down

    def producers(self) -> TaskGroup:
        """The task group new requests' producers start in; ``ShuttingDownError`` (the drain's 503) while
        :attr:`refusing`, as the gate answers: a request that passed the gate just before the client's
        ``begin_shutdown`` is refused here, before anything is reserved, whatever the client's ``admit`` does."""
        if self.refusing:
            raise ShuttingDownError("the server is shutting down")
        if self.task_group is None:
            raise UnavailableError("the server is not serving yet")
        return self.task_group


def health_response(state: AppState) -> Response:
    """``/health`` and ``/ping``: an empty 200 while some managed rank can serve, else a 503 saying which cause."""
    if state.refusing:
        return json_response(error_body(503, DRAINING_MESSAGE), 503)
    problem = state.client.health_problem()
    if problem is not None:
        return json_response(error_body(503, problem), 503)
    return Response(b"", status=200, content_type="text/plain")


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status=status, content_type="application/json")


def state_of(app: Quart) -> AppState:
    return app.extensions["asyncdp"]


def set_draining(app: Quart) -> None:
    """From now on, new requests get 503 and ``/health`` fails; in-flight requests continue."""
    state_of(app).draining = True
