"""From a decoded request body to what the engine client takes: prompts, chat messages, ``SamplingParams``.

Pure functions over the structs of ``asyncdp.api.schemas``. ``sampling_params`` gives a request's unset sampling
fields the server's defaults (``--generation-config``: ``asyncdp.config.generation_config``) and bounds its logprobs
by ``--max-logprobs``, as vLLM's serving layer and input processor do. ``refuse_unsupported`` is the one place that says
which OpenAI/vLLM parameters asyncdp does not implement: each is a 400 naming it unless it is absent, null or a
value that asks for nothing (``REFUSED``), so no parameter is ever accepted and ignored.
"""

from __future__ import annotations

from typing import Any

from asyncdp.api.schemas import ChatRequest, CompletionRequest, TokenizeChat, _Common
from asyncdp.config.generation_config import GenerationDefaults
from asyncdp.errors import HTTPError
from asyncdp.sampling_params import (
    SamplingParams,
    StructuredOutputs,
    check_logprobs,
    check_priority,
    with_token_filters,
)

NO_DEFAULTS = GenerationDefaults()


def _bad(field: str, message: str) -> HTTPError:
    return HTTPError(400, message, param=field)


# Parameter -> the non-null values that ask for nothing asyncdp lacks (null is always fine). Any other value is a
# 400 naming the parameter. ``asyncdp.api.openapi`` publishes exactly these values as the parameter's schema.
REFUSED: dict[str, tuple[Any, ...]] = {
    # No tool-call parser: the model's text never comes back as tool_calls, so completions refuse tools; "auto"
    # without tools asks for nothing. Chat serves the tool choices that need no parser (CHAT_TOOLS).
    "tools": ([],),
    "tool_choice": ("none", "auto"),
    "functions": ([],),
    "function_call": ("none", "auto"),
    "suffix": ("",),
    "prompt_embeds": (),
    "logits_processors": ([],),
    "guided_decoding_backend": ("auto", "guidance", "llguidance"),  # the one backend asyncdp has
    "kv_transfer_params": (),
    "vllm_xargs": (),
    "store": (False,),
    "service_tier": ("auto", "default"),
    "mm_processor_kwargs": (),
    "modalities": (["text"],),
    "audio": (),
    "web_search_options": (),
    "verbosity": ("medium",),  # OpenAI's default; another would ask for shorter or longer answers
    "include_reasoning": (True, False),  # served by asyncdp.api.chat: false drops the reasoning parser's output
}


# Checked by asyncdp.api.tool_calls for chat requests instead.
CHAT_TOOLS = frozenset({"tools", "tool_choice"})


def harmless(name: str, value: Any) -> bool:
    """Whether ``value`` of the unimplemented parameter ``name`` asks for nothing (null or a no-op value)."""
    return value is None or any(value == a and type(value) is type(a) for a in REFUSED[name])


# Why, for the refusals a client library meets in normal use (tools bound to a model).
_WHY = {
    "tools": "it has no tool-call parser, so the model's answer would never come back as tool_calls (send no "
             "tools, or [])",
    "tool_choice": 'it has no tool-call parser (only "none" and "auto" without tools are accepted)',
    "functions": "it has no tool-call parser, so the model's answer would never come back as a function_call",
    "function_call": 'it has no tool-call parser (only "none" and "auto" without functions are accepted)',
}


def refuse_unsupported(req: _Common) -> None:
    """400 for the first parameter asyncdp does not implement that the request sets to a value that matters."""
    chat = isinstance(req, ChatRequest)
    for name in REFUSED:
        if chat and name in CHAT_TOOLS:
            continue
        value = getattr(req, name, None)
        if value is not None and not harmless(name, value):
            why = _WHY.get(name)
            raise _bad(name, f"{name} is not supported by this server" + (f": {why}." if why else "."))
    opts = req.stream_options
    if opts is not None:
        if not req.stream:
            raise _bad("stream_options", "stream_options is only allowed when stream is true.")
        if opts.continuous_usage_stats and not opts.include_usage:
            raise _bad("stream_options", "stream_options.continuous_usage_stats needs include_usage: true.")


def refuse_unsupported_tokenize(req: TokenizeChat) -> None:
    """400 for a ``/tokenize`` field that would render another prompt than asked: as for chat,
    ``mm_processor_kwargs``."""
    if not harmless("mm_processor_kwargs", req.mm_processor_kwargs):
        raise _bad("mm_processor_kwargs", "mm_processor_kwargs is not supported by this server.")


def prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The completion prompts: one string, a list of strings, token ids, or a list of token-id lists."""
    p = _integral_ids(req.prompt)
    if isinstance(p, str):
        return [p]
    if isinstance(p, list) and p:
        if all(isinstance(x, str) for x in p):
            return list(p)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return [list(p)]
        if all(isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
               for x in p):
            return [list(x) for x in p]
    raise _bad("prompt", "prompt must be a string, a list of strings, a list of token ids, "
                         "or a list of token-id lists (non-empty).")


def _integral_ids(p: Any) -> Any:
    """Token ids written as integral floats (``2.0``) are the integers they are, as JSON Schema reads them.
    Two levels at most: a prompt is a list of ids or a list of id lists."""
    def one(x: Any) -> Any:
        return int(x) if isinstance(x, float) and x.is_integer() else x

    if isinstance(p, list):
        return [[one(t) for t in x] if isinstance(x, list) else one(x) for x in p]
    return p


def logit_bias(req: _Common, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """``{"token id": bias}`` as sorted ``(id, bias)`` pairs; ids outside the vocabulary are a 400."""
    if not req.logit_bias:
        return ()
    pairs = sorted((int(k), float(v)) for k, v in req.logit_bias.items())
    outside = [t for t, _ in pairs if t >= vocab_size]
    if outside:
        raise _bad("logit_bias", f"logit_bias token ids must be in [0, {vocab_size}), got {outside[:5]}.")
    for (a, _), (b, _) in zip(pairs, pairs[1:], strict=False):
        if a == b:  # "01" and "1" name the same token
            raise _bad("logit_bias", f"logit_bias names token id {a} twice.")
    return tuple(pairs)


def sampling_params(
    req: CompletionRequest | ChatRequest, *, max_tokens: int | None, logprobs: int | None,
    prompt_logprobs: int | None = None, bias: tuple[tuple[int, float], ...] = (),
    structured: StructuredOutputs | None = None, tokenizer: Any = None, scheduling_policy: str = "fcfs",
    defaults: GenerationDefaults = NO_DEFAULTS, logprobs_limit: int | None = None,
) -> SamplingParams:
    """The per-sequence sampling parameters (n is fanned out by the caller), range-checked. With ``tokenizer``,
    ``bad_words`` are tokenized and the token filters' ids checked against its vocabulary (a 400 naming them).
    A ``priority`` other than 0 needs ``scheduling_policy`` "priority" (``--scheduling-policy``): vLLM's 400.
    Where the request leaves temperature, top_p, top_k, min_p or repetition_penalty unset (None), the server's
    ``defaults`` apply, and to ``max_tokens`` (the caller's: the request's own, or the route's default) their
    default and cap; a beam search takes the temperature and max_tokens only, as vLLM's. More logprobs or prompt
    logprobs than ``logprobs_limit`` (``--max-logprobs``; None: no limit) is vLLM's 400."""
    stop: tuple[str, ...] = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if req.cache_salt is not None and not req.cache_salt:  # vLLM's check and message
        raise _bad("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.")
    check_priority(scheduling_policy, req.priority or 0)  # (a 400 naming priority under fcfs, as vLLM)
    d = defaults.for_beam_search() if req.use_beam_search else defaults
    params = SamplingParams(
        n=1 if req.n is None else req.n,
        temperature=d.pick("temperature", req.temperature, 1.0),
        top_p=d.pick("top_p", req.top_p, 1.0),
        top_k=d.pick("top_k", req.top_k, 0),
        min_p=d.pick("min_p", req.min_p, 0.0),
        seed=req.seed,
        max_tokens=d.max_tokens_for(max_tokens),
        min_tokens=req.min_tokens or 0,
        ignore_eos=bool(req.ignore_eos),
        stop=stop,
        stop_token_ids=tuple(req.stop_token_ids or ()),
        include_stop_str_in_output=bool(req.include_stop_str_in_output),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        skip_special_tokens=True if req.skip_special_tokens is None else req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens is not False,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=d.pick("repetition_penalty", req.repetition_penalty, 1.0),
        logit_bias=bias,
        structured=structured,
        cache_salt=req.cache_salt,
        allowed_token_ids=None if req.allowed_token_ids is None else tuple(req.allowed_token_ids),
        bad_words=tuple(dict.fromkeys(req.bad_words or ())),  # duplicates dropped, as vLLM
        priority=req.priority or 0,
    )
    params = params.validate()
    check_logprobs(params, logprobs_limit)
    return params if tokenizer is None else with_token_filters(params, tokenizer, len(tokenizer))
