"""The OpenAI-compatible Quart app: ``create_app(client)``.

Theory of operation. The app is a thin shell over an ``EngineClient``: it decodes and validates bodies
(``schemas``), renders prompts, checks lengths against ``client.max_model_len``, and turns output deltas into
OpenAI JSON or Server-Sent Events (``generate``, ``openai_format``). Every error leaves through
``asyncdp.api.errors``. The app owns one task group for the lifetime of serving (Quart's ``while_serving``),
in which the producers of generation requests run (see ``fanout``); on shutdown it is cancelled, which aborts
whatever is still generating. ``set_draining()`` makes every new request a 503 while in-flight ones finish.

Bodies larger than ``max_request_body_bytes`` are counted while they arrive (Quart's ``MAX_CONTENT_LENGTH``, which
counts a chunked body's bytes too), discarded past the limit and answered 413 in OpenAI's error shape once the
client has sent them (``asyncdp.api.body``), so the answer is not lost to a connection reset. CPU-heavy preparation runs through
``state.offload`` (worker threads, one bounded limiter per app).

The same handlers run under asyncio (``Quart``) and trio (``QuartTrio``); only the app class differs.
"""

from __future__ import annotations

import hmac
from typing import Any, TypeVar

import anyio
from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException

from asyncdp.api import chat, completions, dev_routes, utility_routes
from asyncdp.api.body import draining_request_class, read_rest_of_body
from asyncdp.api.content_format import read_template, resolve_content_format
from asyncdp.api.context import (
    DRAINING_MESSAGE,
    PAUSE_MODES,
    AppState,
    health_response,
    json_response,
    set_draining,
    state_of,
)
from asyncdp.api.cors import ALLOW_ALL, Cors, install_cors
from asyncdp.api.engine_client import EngineClient
from asyncdp.api.errors import error_body, status_and_body
from asyncdp.api.last_send import with_last_send_shielded
from asyncdp.api.metrics import CONTENT_TYPE, Metrics
from asyncdp.api.reasoning_parsers import PARSERS as REASONING_PARSERS
from asyncdp.api.reasoning_parsers import end_markers, end_token_ids, token_counter
from asyncdp.api.request_close import with_close_callbacks
from asyncdp.api.request_templates import RequestTemplates
from asyncdp.api.template_roles import resolve_template_roles
from asyncdp.api.tokenizer_info import tokenizer_info
from asyncdp.api.tool_parsers import PARSERS, tags_are_special
from asyncdp.config.flags import DEFAULT_MAX_SEQS_PER_REQUEST, default_max_request_body_bytes
from asyncdp.config.generation_config import GenerationDefaults
from asyncdp.config.vllm_flags import DEFAULT_MAX_LOGPROBS
from asyncdp.errors import HTTPError

_ALWAYS_OPEN = ("/health", "/metrics", "/server_info")
# Routes that answer without the API key: the probes of load balancers, orchestrators, scrapers and routers, and
# the schema. Everything else (generation, /v1/models, tokenizing, /server_info, /pause and /resume,
# /reset_prefix_cache) wants it.
_OPEN_WITHOUT_KEY = frozenset({"/health", "/ping", "/version", "/metrics", "/load", "/openapi.json"})

__all__ = ["AppState", "create_app", "json_response", "set_draining", "state_of"]

T = TypeVar("T")


def _registered(registry: dict[str, T], name: str | None, what: str) -> T | None:
    """The parser ``name`` of ``registry`` (None: none asked for); ValueError naming the choices otherwise."""
    if name is None:
        return None
    if name not in registry:
        raise ValueError(f"{what} must be one of {', '.join(registry)}, got {name!r}")
    return registry[name]


def create_app(
    client: EngineClient,
    *,
    backend: str = "asyncio",
    api_key: str | None = None,
    metrics: Metrics | None = None,
    served_model_names: list[str] | None = None,
    max_seqs_per_request: int = DEFAULT_MAX_SEQS_PER_REQUEST,
    max_request_body_bytes: int | None = None,
    cors: Cors | None = ALLOW_ALL,
    enable_prompt_tokens_details: bool = False,
    chat_template: str | None = None,
    chat_template_content_format: str = "auto",
    trust_request_chat_template: bool = False,
    enable_tokenizer_info_endpoint: bool = False,
    server_dev_mode: bool = False,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
    scheduling_policy: str = "fcfs",
    max_logprobs: int = DEFAULT_MAX_LOGPROBS,
    enable_log_requests: bool = False,
    enable_log_outputs: bool = False,
    max_log_len: int | None = None,
    generation_defaults: GenerationDefaults | None = None,
) -> Quart:
    """Build the app for ``backend`` ("asyncio" -> ``Quart``, "trio" -> ``QuartTrio``).

    ``max_seqs_per_request`` bounds prompts x max(n, best_of) of one request (``--max-seqs-per-request``);
    ``max_request_body_bytes`` the body (``--max-request-body-bytes``; None: derived from ``max_model_len``);
    ``cors`` what cross-origin requests may do (``--allowed-origins`` and friends; None: no CORS headers);
    ``enable_prompt_tokens_details`` adds ``usage.prompt_tokens_details.cached_tokens`` (the flag of that name);
    ``chat_template`` is ``--chat-template``'s text: set as ``client.tokenizer``'s template here, so prompts render
    with it (None: the tokenizer's own);
    ``chat_template_content_format`` is ``--chat-template-content-format`` ("auto" reads the tokenizer's template);
    ``trust_request_chat_template`` lets chat and ``/tokenize`` requests bring their own ``chat_template``
    (``--trust-request-chat-template``; False: a 400);
    ``enable_tokenizer_info_endpoint`` serves ``GET /tokenizer_info`` (the flag of that name; False: no such route,
    a 404, as in vLLM);
    ``server_dev_mode`` serves vLLM's development routes, ``POST /reset_prefix_cache`` (``ASYNCDP_SERVER_DEV_MODE=1``
    or ``VLLM_SERVER_DEV_MODE=1``; False: no such route, a 404, as in vLLM; see ``asyncdp.api.dev_routes``);
    ``tool_call_parser`` serves ``tool_choice: "auto"`` with that parser of ``asyncdp.api.tool_parsers.PARSERS``
    (``--enable-auto-tool-choice --tool-call-parser NAME``; None: "auto" with tools is a 400);
    ``reasoning_parser`` returns chat answers' thinking apart from their content with that parser of
    ``asyncdp.api.reasoning_parsers.PARSERS`` (``--reasoning-parser NAME``; None: the thinking stays in content);
    ``scheduling_policy`` is the engines' ``--scheduling-policy`` ("fcfs": a request's priority other than 0 is a
    400, as vLLM's);
    ``max_logprobs`` is ``--max-logprobs`` (a request asking more sample or prompt logprobs is a 400; -1: more
    than the vocabulary);
    ``generation_defaults`` are the sampling defaults of ``--generation-config`` for the fields a request leaves
    unset (None: none);
    ``enable_log_requests`` logs one INFO line per prompt accepted, showing at most ``max_log_len`` of its token
    ids (``--enable-log-requests``, ``--max-log-len``), and with ``enable_log_outputs`` one per choice generated
    (``--enable-log-outputs``; alone it logs nothing, as vLLM's)."""
    if backend == "asyncio":
        app_class: type[Quart] = Quart
    elif backend == "trio":
        from quart_trio import QuartTrio

        app_class = QuartTrio
    else:
        raise ValueError(f"backend must be 'asyncio' or 'trio', got {backend!r}")
    parser = _registered(PARSERS, tool_call_parser, "tool_call_parser")
    thinker = _registered(REASONING_PARSERS, reasoning_parser, "reasoning_parser")
    app = app_class("asyncdp.api")
    # Streams last as long as generation does; the engine client and the drain deadline bound them instead.
    app.config["RESPONSE_TIMEOUT"] = None
    if max_request_body_bytes is None:
        max_request_body_bytes = default_max_request_body_bytes(client.max_model_len)
    app.config["MAX_CONTENT_LENGTH"] = max_request_body_bytes
    app.request_class = draining_request_class(app.request_class)
    app.asgi_app = with_close_callbacks(app.asgi_app)  # type: ignore[method-assign]
    if backend == "trio":  # keep-alive connections must get their idle timer: see asyncdp.api.last_send
        app.asgi_app = with_last_send_shielded(app.asgi_app)  # type: ignore[method-assign]
    if chat_template is not None:  # --chat-template: the content format is detected from it, prompts use it
        client.tokenizer.chat_template = chat_template
    template = read_template(client.tokenizer)  # once: both detectors take its source and parsed tree
    content_format = resolve_content_format(client.tokenizer, chat_template_content_format, template)
    state = AppState(
        client=client,
        metrics=metrics if metrics is not None else Metrics(model_name=client.model_name),
        api_key=api_key,
        served_model_names=tuple(served_model_names or [client.model_name]),
        max_seqs_per_request=max_seqs_per_request,
        max_request_body_bytes=max_request_body_bytes,
        enable_prompt_tokens_details=enable_prompt_tokens_details,
        scheduling_policy=scheduling_policy,
        logprobs_limit=len(client.tokenizer) if max_logprobs == -1 else max_logprobs,  # (-1: the vocabulary)
        generation_defaults=generation_defaults or GenerationDefaults(),
        log_requests=enable_log_requests,
        log_outputs=enable_log_requests and enable_log_outputs,
        max_log_len=max_log_len,
        content_format=content_format,
        template_roles=resolve_template_roles(client.tokenizer, content_format, template),
        request_templates=(RequestTemplates(client.tokenizer, chat_template_content_format)
                           if trust_request_chat_template else None),
        tokenizer_info=(tokenizer_info(client.tokenizer, chat_template) if enable_tokenizer_info_endpoint else None),
        tool_parser=parser,
        tool_tags_special=parser is not None and tags_are_special(parser, client.tokenizer),
        reasoning_parser=thinker,
        reasoning_tags_special=thinker is not None and tags_are_special(thinker, client.tokenizer),
        reasoning_end_ids=() if thinker is None else end_token_ids(client.tokenizer, thinker),
        reasoning_end_markers=() if thinker is None else end_markers(client.tokenizer, thinker),
        reasoning_counter=None if thinker is None else token_counter(client.tokenizer, thinker),
    )
    app.extensions["asyncdp"] = state
    app.set_draining = lambda: set_draining(app)  # type: ignore[attr-defined]

    if cors is not None:
        install_cors(app, cors)  # first: a preflight is answered before the API-key and drain checks
    _install_hooks(app, state)
    _register_control_routes(app, state)
    completions.register(app, state)
    chat.register(app, state)
    utility_routes.register(app, state)
    if server_dev_mode:
        dev_routes.register(app, state)
    return app


def _install_hooks(app: Quart, state: AppState) -> None:
    """The producers' task group for the serving lifetime, the auth and drain gate, the one error handler."""

    @app.while_serving
    async def _producers() -> Any:
        async with anyio.create_task_group() as tg:
            state.task_group = tg
            try:
                yield
            finally:
                state.task_group = None
                tg.cancel_scope.cancel()

    @app.before_request
    async def _gate() -> Response | None:
        if state.api_key is not None and request.path not in _OPEN_WITHOUT_KEY:
            auth = request.headers.get("Authorization", "")
            if not hmac.compare_digest(auth.encode(errors="replace"), f"Bearer {state.api_key}".encode()):
                denied = json_response(error_body(401, "Invalid or missing API key."), 401)
                denied.headers["WWW-Authenticate"] = "Bearer"
                return denied
        # From the client's begin_shutdown (the drain of --shutdown-timeout), not only once HTTP stops: a router
        # fails a request over to another endpoint on this exact answer, given before the request is read.
        if state.refusing and request.path not in _ALWAYS_OPEN:
            return json_response(error_body(503, DRAINING_MESSAGE), 503)
        return None

    @app.after_request
    async def _body_read(response: Response) -> Response:  # runs for every answer, refusals and errors too
        await read_rest_of_body(request.body, app.config["BODY_TIMEOUT"])  # else the client may not read it
        return response

    @app.errorhandler(Exception)
    async def _error(exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            status = exc.code or 500
            message = exc.description or exc.name
            if status == 413:
                message = (f"The request body is larger than this server accepts ({state.max_request_body_bytes} "
                           f"bytes, --max-request-body-bytes).")
            response = json_response(error_body(status, message), status)
            if status == 405 and "Allow" in dict(exc.get_headers()):
                response.headers["Allow"] = dict(exc.get_headers())["Allow"]
            return response
        status, body = status_and_body(exc)
        return json_response(body, status)


def _register_control_routes(app: Quart, state: AppState) -> None:
    """``/health``, ``/metrics``, ``/server_info``, ``/load``, ``/v1/models`` and ``/pause`` ``/resume``
    ``/is_paused``."""
    client = state.client

    @app.get("/health")
    async def health() -> Response:
        return health_response(state)

    @app.get("/metrics")
    async def metrics_route() -> Response:
        return Response(state.metrics.render(), content_type=CONTENT_TYPE)

    @app.get("/server_info")
    async def server_info() -> Response:
        fmt = request.args.get("config_format", "json")
        if fmt not in ("json", "text"):
            raise HTTPError(400, f"config_format must be 'json' or 'text', got {fmt!r}.", param="config_format")
        return json_response(client.server_info())

    @app.get("/load")
    async def load() -> Response:
        return json_response(client.load())

    @app.get("/v1/models")
    async def models() -> Response:
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "asyncdp", "root": name,
                 "parent": None, "max_model_len": client.max_model_len} for name in state.served_model_names]
        return json_response({"object": "list", "data": data})

    @app.post("/pause")
    async def pause() -> Response:
        mode = request.args.get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise HTTPError(400, f"mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}.", param="mode")
        await client.call_utility("pause", mode=mode)
        return json_response({"is_paused": True, "mode": mode})

    @app.post("/resume")
    async def resume() -> Response:
        await client.call_utility("resume")
        return json_response({"is_paused": False})

    @app.get("/is_paused")
    async def is_paused() -> Response:
        result = await client.call_utility("is_paused")
        # One answer per managed engine, or one for all: paused means every engine is paused.
        paused = all(result) and len(result) > 0 if isinstance(result, list) else bool(result)
        return json_response({"is_paused": paused})
