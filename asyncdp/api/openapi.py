"""``GET /openapi.json``: an OpenAPI 3.1 document generated from the request structs of ``asyncdp.api.schemas``.

msgspec derives each body's JSON Schema from the same annotations that decoding enforces, so the ranges in the
document are the ranges the server applies. A few fields are typed loosely in the structs because a helper
checks them (``prompt``, message ``content``, rank hints): their schemas are written out here to match those
helpers. Parameters asyncdp refuses are published as the values it accepts (null, or a value asking for nothing,
from ``asyncdp.api.params.REFUSED``), so a generated "positive" example is accepted and any other value is a 400.
Rules across fields (``best_of >= n``, ``stream_options`` only with ``stream``, prompt plus ``max_tokens`` within
``max_model_len``) are stated in the descriptions, not in the schemas.
"""

from __future__ import annotations

from typing import Any

import msgspec

from asyncdp.api.chat_messages import TEXT_PARTS
from asyncdp.api.context import AppState
from asyncdp.api.params import CHAT_TOOLS, REFUSED
from asyncdp.api.response_schemas import chat_response_schemas
from asyncdp.api.schemas import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChat,
    TokenizeCompletion,
)
from asyncdp.sampling_params import MAX_INT32, MAX_LOGIT_BIAS, MAX_NUM_BAD_WORDS
from asyncdp.version import __version__

_REF = "#/components/schemas/{name}"

_ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": "integer"}}}},
}

_TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": MAX_INT32}}
_PROMPT: dict[str, Any] = {"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    _TOKEN_IDS,
    {"type": "array", "minItems": 1, "items": _TOKEN_IDS},
], "description": "A string, a list of strings, token ids, or a list of token-id lists. Token ids must be in "
                  "the model's vocabulary."}
_CONTENT = {"anyOf": [
    {"type": "string"}, {"type": "null"},
    {"type": "array", "items": {"anyOf": [
        {"type": "object", "required": ["type", key], "properties": {"type": {"const": kind}, key: {"type": "string"}}}
        for kind, key in TEXT_PARTS.items()]}},
]}

# (method, path) -> (summary, request body structs, 200 content types)
_ROUTES: dict[tuple[str, str], tuple[str, tuple[type[msgspec.Struct], ...], tuple[str, ...]]] = {
    ("post", "/v1/completions"): ("Create a completion", (CompletionRequest,),
                                  ("application/json", "text/event-stream")),
    ("post", "/v1/chat/completions"): ("Create a chat completion", (ChatRequest,),
                                       ("application/json", "text/event-stream")),
    ("post", "/tokenize"): ("Tokenize a prompt or chat messages", (TokenizeCompletion, TokenizeChat),
                            ("application/json",)),
    ("post", "/detokenize"): ("Turn token ids into text", (DetokenizeRequest,), ("application/json",)),
    ("get", "/tokenizer_info"): ("The tokenizer's configuration", (), ("application/json",)),
    ("post", "/reset_prefix_cache"): ("Drop every managed rank's prefix cache", (), ("application/json",)),
}
# (path, 200 content type) -> the component describing that answer (the others' answers have no schema yet)
_ANSWERS = {("/v1/chat/completions", "application/json"): "ChatCompletion",
            ("/v1/chat/completions", "text/event-stream"): "ChatCompletionEvent"}
_CONTENT_TYPES = {"/health": ("text/plain",), "/ping": ("text/plain",), "/metrics": ("text/plain",)}
_ERRORS = {"400": "Invalid request", "401": "Missing or wrong API key", "404": "Unknown model or route",
           "413": "Body larger than --max-request-body-bytes", "429": "Admission limit reached",
           "503": "No engine can serve, or the server is shutting down"}


def decimal_upto(n: int) -> str:
    """A regex matching the decimal numbers 0..n written without leading zeros."""
    digits, width = str(n), len(str(n))
    alternatives = [f"[0-{min(n, 9)}]"]
    if width > 2:
        alternatives.append(f"[1-9][0-9]{{1,{width - 2}}}")
    if width > 1:
        for i, digit in enumerate(digits):
            low, high = (1 if i == 0 else 0), int(digit) - 1
            if high >= low:
                rest = width - i - 1
                alternatives.append(f"{digits[:i]}[{low}-{high}]" + (f"[0-9]{{{rest}}}" if rest else ""))
        alternatives.append(digits)
    return "^(" + "|".join(alternatives) + ")$"


def _components(state: AppState) -> dict[str, Any]:
    structs = sorted({s for _, bodies, _ in _ROUTES.values() for s in bodies}, key=lambda s: s.__name__)
    _, components = msgspec.json.schema_components(structs, ref_template=_REF)
    ranks = state.client.server_info().get("managed_ranks") or []
    local = {"type": ["integer", "null"], "minimum": 0, "maximum": max(len(ranks) - 1, 0)}
    global_ = {"anyOf": [{"type": "null"}, {"enum": sorted(r["dp_rank"] for r in ranks)}]} if ranks else {
        "type": "null"}
    last_id = len(state.client.tokenizer) - 1
    token_ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0, "maximum": last_id}}
    prompt = {**_PROMPT, "anyOf": [*_PROMPT["anyOf"][:2], token_ids,
                                   {"type": "array", "minItems": 1, "items": token_ids}]}
    logprobs = {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 0, "maximum": state.logprobs_limit}],
                "description": "At most --max-logprobs; more is a 400."}
    for name, schema in components.items():
        props = schema.get("properties", {})
        if "logit_bias" in props:
            props["logit_bias"] = {"anyOf": [{"type": "null"}, {
                "type": "object", "propertyNames": {"pattern": decimal_upto(last_id)},
                "additionalProperties": {"type": "number", "minimum": -MAX_LOGIT_BIAS, "maximum": MAX_LOGIT_BIAS}}]}
        for field in ("logprobs", "top_logprobs", "prompt_logprobs"):  # (chat's logprobs is a bool)
            if field in props and not (name == "ChatRequest" and field == "logprobs"):
                props[field] = logprobs
        if "allowed_token_ids" in props:
            props["allowed_token_ids"] = {"anyOf": [{"type": "null"}, token_ids]}
            props["bad_words"] = _BAD_WORDS
        if name == "DetokenizeRequest":
            props["tokens"] = {"type": "array", "items": token_ids["items"]}
        for field, allowed in REFUSED.items():  # (/tokenize renders a chat request's tools too)
            if field in props and not (name in ("ChatRequest", "TokenizeChat") and field in CHAT_TOOLS):
                props[field] = {"enum": [None, *allowed], "description": "Not supported: only these values."}
        if "prompt" in props and name == "CompletionRequest":
            props["prompt"] = prompt
        if "content" in props:
            props["content"] = _CONTENT
        if "truncate_prompt_tokens" in props:  # (0 would leave no prompt: a 400)
            props["truncate_prompt_tokens"] = {"anyOf": [
                {"type": "null"}, {"const": -1}, {"type": "integer", "minimum": 1, "maximum": MAX_INT32}],
                "description": "Keep the prompt's last k tokens; -1: max_model_len minus max_tokens. A k above "
                               "that is a 400."}
        if "data_parallel_rank" in props:
            props["data_parallel_rank"] = local
            props["data_parallel_global_rank"] = global_
        if "model" in props:
            props["model"] = {"anyOf": [{"type": "null"}, {"enum": list(state.served_model_names)}]}
    components["CompletionRequest"]["required"] = ["prompt"]
    for name in ("CompletionRequest", "ChatRequest"):
        rules = [_when({"stream_options": {"type": "object"}}, {"stream": {"const": True}}),
                 _when({"best_of": {"type": "integer"}, "stream": {"const": True}}, {"best_of": {"type": "null"}})]
        if name == "CompletionRequest":
            rules.append(_when({"max_tokens": {"const": 0}}, {"echo": {"const": True}}))
            rules.append(_when({"max_completion_tokens": {"const": 0}}, {"echo": {"const": True}}))
        else:
            rules.append(_when({"top_logprobs": {"type": "integer"}}, {"logprobs": {"const": True}}))
            rules.append(_when({"continue_final_message": {"const": True}},
                               {"add_generation_prompt": {"enum": [False, None]}}, required=False))
        components[name]["allOf"] = rules
    components["ErrorResponse"] = _ERROR
    components.update(chat_response_schemas(reasoning=state.reasoning_parser is not None))
    return components


# Each word needs a character Python's str.lstrip keeps (a word of whitespace tokenizes to nothing: a 400); the
# pattern means that read by an ECMA or a Python regex engine (their \s differ by \x1c-\x1f, \x85, \ufeff).
_BAD_WORDS = {"anyOf": [{"type": "null"}, {"type": "array", "items": {
    "type": "string", "pattern": "[^\\s\\x1c-\\x1f\\x85]|\\ufeff"}}], "description": (
    f"Words never generated. More than {MAX_NUM_BAD_WORDS} token sequences in all (a word makes one or two) is a 400.")}


def _when(condition: dict[str, Any], then: dict[str, Any], *, required: bool = True) -> dict[str, Any]:
    """JSON Schema ``if``/``then``: when the properties match ``condition``, they must also match ``then``."""
    rule: dict[str, Any] = {"if": {"properties": condition, "required": sorted(condition)},
                            "then": {"properties": then}}
    if required:
        rule["then"]["required"] = sorted(then)
    return rule


def _operation(path: str, summary: str, bodies: tuple[type[msgspec.Struct], ...], content_types: tuple[str, ...],
               ) -> dict:
    answers = {ct: {"schema": {"$ref": _REF.format(name=_ANSWERS[path, ct])}} if (path, ct) in _ANSWERS else {}
               for ct in content_types}
    op: dict[str, Any] = {"summary": summary, "responses": {
        "200": {"description": "OK", "content": answers},
        **{code: {"description": text, "content": {"application/json": {"schema": {
            "$ref": _REF.format(name="ErrorResponse")}}}} for code, text in _ERRORS.items()},
    }}
    if bodies:
        refs = [{"$ref": _REF.format(name=b.__name__)} for b in bodies]
        op["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": refs[0] if len(refs) == 1 else {"anyOf": refs}}}}
    return op


def openapi_document(app: Any) -> dict[str, Any]:
    """The document for every route of ``app`` (Quart's URL map), bodies from ``_ROUTES``."""
    state: AppState = app.extensions["asyncdp"]
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = rule.rule.replace("<path:model_id>", "{model_id}")
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            key = (method.lower(), path)
            default = (f"{method} {path}", (), _CONTENT_TYPES.get(path, ("application/json",)))
            summary, bodies, types = _ROUTES.get(key, default)
            op = _operation(path, summary, bodies, types)
            if "{model_id}" in path:
                op["parameters"] = [{"name": "model_id", "in": "path", "required": True,
                                     "schema": {"type": "string"}}]
            if path == "/pause":
                op["parameters"] = [{"name": "mode", "in": "query", "required": False,
                                     "schema": {"enum": ["abort", "wait", "keep"]}}]
            if path == "/server_info":
                op["parameters"] = [{"name": "config_format", "in": "query", "required": False,
                                     "schema": {"enum": ["json", "text"]}}]
            if path == "/reset_prefix_cache":
                op["parameters"] = [{"name": name, "in": "query", "required": False, "schema": {"type": "boolean"}}
                                    for name in ("reset_running_requests", "reset_external")]
            if path in ("/pause", "/resume", "/reset_prefix_cache"):
                op["tags"] = ["control"]
            paths.setdefault(path, {})[key[0]] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "asyncdp OpenAI-compatible API", "version": __version__},
        "paths": paths,
        "components": {"schemas": _components(state)},
    }
