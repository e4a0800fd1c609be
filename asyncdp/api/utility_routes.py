"""The routes vLLM users call besides generation: ``GET /v1/models/{id}``, ``POST /tokenize``,
``POST /detokenize``, ``GET /tokenizer_info`` (with ``--enable-tokenizer-info-endpoint`` only, as in vLLM: see
``asyncdp.api.tokenizer_info``), ``GET /version``, ``GET|POST /ping`` and ``GET /openapi.json``.

Shapes follow vLLM's OpenAI server: ``/tokenize`` takes a ``prompt`` or ``messages`` (rendered by the chat
template as for a chat request, its own ``chat_template`` with ``--trust-request-chat-template``, and chat's
``reasoning_effort`` and ``documents``, which vLLM's ``/tokenize`` ignores, so that the count is the chat
request's ``prompt_tokens``) and answers
``{"count", "max_model_len", "tokens"}``, with ``token_strs`` under ``return_token_strs``; ``/detokenize`` takes
``{"tokens"}`` and answers ``{"prompt"}``; ``/ping`` is ``/health`` under SageMaker's name.
"""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Quart, Response, request

from asyncdp.api.context import AppState, health_response, json_response
from asyncdp.api.errors import error_body
from asyncdp.api.offload import INLINE_BODY_BYTES, INLINE_TOKENS
from asyncdp.api.schemas import DetokenizeRequest, TokenizeChat, TokenizeCompletion, decode_body
from asyncdp.errors import HTTPError
from asyncdp.version import __version__


class _TokenizeAny(msgspec.Struct, kw_only=True):
    prompt: Any = None
    messages: Any = None


def tokenize(state: AppState, body: bytes) -> dict[str, Any]:
    from asyncdp.api.chat_render import render_prompt
    from asyncdp.api.params import refuse_unsupported_tokenize
    from asyncdp.api.tool_calls import template_tools

    which = decode_body(body, _TokenizeAny)
    if which.messages is not None:
        chat: TokenizeChat = decode_body(body, TokenizeChat)
        state.check_model(chat.model)
        refuse_unsupported_tokenize(chat)
        _, tokens = render_prompt(state, chat, template_tools(chat.tools) if chat.tools else None)
        token_strs = chat.return_token_strs
    else:
        req: TokenizeCompletion = decode_body(body, TokenizeCompletion)
        state.check_model(req.model)
        add_special = True if req.add_special_tokens is None else req.add_special_tokens
        tokens = state.client.tokenizer.encode(req.prompt, add_special_tokens=add_special)
        token_strs = req.return_token_strs
    answer = {"count": len(tokens), "max_model_len": state.client.max_model_len, "tokens": tokens}
    if token_strs:
        answer["token_strs"] = state.client.tokenizer.convert_ids_to_tokens(tokens)
    return answer


def detokenize(state: AppState, body: bytes) -> dict[str, Any]:
    req: DetokenizeRequest = decode_body(body, DetokenizeRequest)
    state.check_model(req.model)
    vocab = len(state.client.tokenizer)
    if any(t >= vocab for t in req.tokens):
        raise HTTPError(400, f"tokens must be in [0, {vocab}) for this model's vocabulary.", param="tokens")
    return {"prompt": state.client.tokenizer.decode(req.tokens)}


def model_card(state: AppState, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "asyncdp", "root": name, "parent": None,
            "max_model_len": state.client.max_model_len}


def register(app: Quart, state: AppState) -> None:
    @app.get("/v1/models/<path:model_id>")
    async def model(model_id: str) -> Response:
        if model_id not in state.served_model_names:
            return json_response(error_body(404, f"The model `{model_id}` does not exist.", "model"), 404)
        return json_response(model_card(state, model_id))

    @app.post("/tokenize")
    async def tokenize_route() -> Response:
        body = await request.get_data(as_text=False)
        return json_response(await state.offload.run(len(body) > INLINE_BODY_BYTES, tokenize, state, body))

    @app.post("/detokenize")
    async def detokenize_route() -> Response:
        body = await request.get_data(as_text=False)
        heavy = len(body) > INLINE_TOKENS * 4
        return json_response(await state.offload.run(heavy, detokenize, state, body))

    if state.tokenizer_info is not None:
        info = state.tokenizer_info

        @app.get("/tokenizer_info")
        async def tokenizer_info_route() -> Response:
            return json_response(info)

    @app.get("/version")
    async def version() -> Response:
        return json_response({"version": __version__})

    @app.route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        return health_response(state)

    @app.get("/openapi.json")
    async def openapi() -> Response:
        from asyncdp.api.openapi import openapi_document

        return json_response(openapi_document(app))
