"""From a chat request's messages to prompt token ids: the chat template rendered (``render_prompt``), for
``/v1/chat/completions`` and ``/tokenize``.

The template gets, as vLLM passes them: the messages (:mod:`asyncdp.api.chat_messages`), ``add_generation_prompt``
and ``continue_final_message``, the ``tools`` it should show, a chat request's ``documents`` (RAG documents,
objects of strings such as ``{"title", "text"}``, Transformers' ``documents=``), and ``chat_template_kwargs``,
less the names asyncdp sets itself, with a chat request's ``reasoning_effort`` over them (``template_kwargs``).
``chat_template_kwargs`` may give ``tools`` and ``documents`` too, merged as vLLM merges them (``_lists``). The
template is the server's (the tokenizer's, or ``--chat-template``), or
the request's ``chat_template`` with ``--trust-request-chat-template`` (:mod:`asyncdp.api.request_templates`).
A template that fails is the client's 400: naming ``chat_template`` when the request brought it, else
``chat_template_kwargs`` when the template renders the same request without them, else ``messages``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from asyncdp.api.chat_messages import chat_messages
from asyncdp.api.context import AppState
from asyncdp.api.request_templates import request_template
from asyncdp.api.schemas import ChatRequest, Json, TokenizeChat, convert_at
from asyncdp.errors import HTTPError

# Template arguments asyncdp passes itself, or that would make the template's answer other than the prompt's text;
# chat_template_kwargs may not set them (vLLM refuses chat_template, counts tokenize unexpected, fails on
# conversation and messages, and puts the request's add_generation_prompt, continue_final_message and return_dict
# over them).
_RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tokenize", "add_generation_prompt", "continue_final_message", "chat_template",
    "return_dict", "return_tensors", "truncation", "padding", "max_length",
    "tokenizer_kwargs", "return_assistant_tokens_mask", "sanitize_control_tokens",
})
# The lists chat_template_kwargs may give the template, in the shapes it takes (documents: as a request's).
_TEMPLATE_LISTS: dict[str, Any] = {"tools": list[Json], "documents": list[dict[str, str]]}


def template_kwargs(req: ChatRequest | TokenizeChat) -> dict[str, Any]:
    """``chat_template_kwargs`` with the request's ``reasoning_effort``, as vLLM merges them: a set effort
    replaces theirs, and sets ``enable_thinking`` (false for ``"none"``) unless they do (templates that default
    to no thinking, as Gemma 4's, need the switch; the reasoning parsers read the same)."""
    kwargs = dict(req.chat_template_kwargs or {})
    effort = req.reasoning_effort
    if effort is not None:
        if "enable_thinking" not in kwargs:
            kwargs["enable_thinking"] = effort != "none"
        kwargs["reasoning_effort"] = effort
    return kwargs


def render_prompt(
    state: AppState, req: ChatRequest | TokenizeChat, tools: list[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[int]]:
    """The messages and the token ids of the rendered chat template (given ``tools``, passed to it as vLLM
    does); template errors are the caller's 400."""
    own = request_template(state.request_templates, req.chat_template)
    if own is None:
        messages = chat_messages(req.messages, state.content_format, state.template_roles)
    else:
        messages = chat_messages(req.messages, own.content_format, own.roles)
    if req.continue_final_message and req.add_generation_prompt:
        raise HTTPError(400, "continue_final_message and add_generation_prompt cannot both be true.",
                        param="continue_final_message")
    continue_final = bool(req.continue_final_message)
    add_generation = (not continue_final) if req.add_generation_prompt is None else req.add_generation_prompt
    extra = template_kwargs(req)
    reserved = sorted(set(extra) & _RESERVED_TEMPLATE_KWARGS)
    if reserved:
        raise HTTPError(400, f"chat_template_kwargs may not set {', '.join(reserved)}.",
                        param="chat_template_kwargs")
    tok = state.client.tokenizer
    render = partial(tok.apply_chat_template, messages, add_generation_prompt=add_generation, tokenize=False,
                     continue_final_message=continue_final)
    if own is not None:
        render = partial(render, chat_template=own.source)
    extra, fixed = _lists(extra, tools, req.documents)
    try:
        text = render(**extra, **fixed)
    except Exception as exc:  # a template that rejects these messages (roles, order) is the caller's error
        if own is not None:
            raise HTTPError(400, f"The request's chat_template failed: {type(exc).__name__}: {exc}",
                            param="chat_template") from None
        named = "chat_template_kwargs" if req.chat_template_kwargs else "reasoning_effort"
        raise _template_error(exc, render, extra, fixed, named) from None
    add_special = bool(req.add_special_tokens)  # the template already holds the special tokens
    return messages, tok.encode(text, add_special_tokens=add_special)


def _lists(extra: dict[str, Any], tools: list[dict[str, Any]] | None,
           documents: list[dict[str, str]] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``chat_template_kwargs`` (``extra``) with its ``tools`` and ``documents`` checked, and the request's own
    (``fixed``) that the template gets besides, as vLLM merges them: ``chat_template_kwargs``' tools win over the
    request's, the request's documents over ``chat_template_kwargs``' (a null counts as not given in either)."""
    extra = {k: v for k, v in extra.items() if not (k in _TEMPLATE_LISTS and v is None)}
    for name, kind in _TEMPLATE_LISTS.items():
        if name in extra:
            extra[name] = convert_at(extra[name], kind, f"chat_template_kwargs.{name}")
    fixed: dict[str, Any] = {}
    if tools is not None and "tools" not in extra:
        fixed["tools"] = tools
    if documents is not None:
        extra.pop("documents", None)
        fixed["documents"] = documents
    return extra, fixed


def _template_error(exc: Exception, render: Any, extra: dict[str, Any], fixed: dict[str, Any],
                    named: str) -> HTTPError:
    """The 400 of the server's template that failed: it names ``chat_template_kwargs`` (or ``reasoning_effort``,
    when that alone was given) when the template renders the same request without them (a variable of the wrong
    type, a function replaced by a value, an effort the template raises on), else ``messages``."""
    if extra:
        try:
            render(**fixed)
        except Exception:
            pass
        else:
            return HTTPError(400, f"The chat template failed with the request's {named}: {exc}", param=named)
    return HTTPError(400, f"The chat template rejected the messages: {exc}", param="messages")
