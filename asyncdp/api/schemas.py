"""OpenAI (and vLLM) request bodies as msgspec structs, and the one decoder of request bodies.

Every parameter OpenAI or vLLM defines for these routes is declared, with its real type and, for numbers, the
range that is enforced: decoding checks JSON syntax, UTF-8, types and ranges (a violation is a 400 naming the
field), so the JSON Schema msgspec derives from these structs (``asyncdp.api.openapi``) states the rules the
server applies. ``None`` means "the default" for every field, as OpenAI marks them nullable. Parameters asyncdp
does not implement are declared too and refused by ``asyncdp.api.params.refuse_unsupported`` with a 400 naming
them; fields that neither OpenAI nor vLLM define are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from asyncdp.errors import HTTPError
from asyncdp.sampling_params import (
    MAX_INT32,
    MAX_LOGIT_BIAS,
    MAX_N,
    MAX_PENALTY,
    MIN_REPETITION_PENALTY,
)

Count = Annotated[int, Meta(ge=0, le=MAX_INT32)]
TokenId = Annotated[int, Meta(ge=0, le=MAX_INT32)]
Penalty = Annotated[float, Meta(ge=-MAX_PENALTY, le=MAX_PENALTY)]
NumSeqs = Annotated[int, Meta(ge=1, le=MAX_N)]
NumLogprobs = Annotated[int, Meta(ge=0, le=MAX_INT32)]  # at most --max-logprobs: asyncdp.api.params
StopString = Annotated[str, Meta(min_length=1)]
TokenIdKey = Annotated[str, Meta(pattern="^(0|[1-9][0-9]{0,9})$")]  # no leading zeros: one spelling per id
Bias = Annotated[float, Meta(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Json = dict[str, Any]
# vLLM's options for its media loaders, by modality ({"video": {"num_frames": 40}}): checked, and without effect
# here, where a message holds text only (asyncdp.api.chat_messages refuses media parts).
MediaIoKwargs = dict[str, Json]
# A request's own chat template (--trust-request-chat-template): the largest real ones are ~20 KB.
MAX_CHAT_TEMPLATE_CHARS = 128 * 1024
ChatTemplateSource = Annotated[str, Meta(
    max_length=MAX_CHAT_TEMPLATE_CHARS,
    description="A Jinja chat template for this request only (vLLM's): a 400 unless the server runs with "
                "--trust-request-chat-template.")]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM: usage on every chunk; needs include_usage


class JsonSchemaSpec(msgspec.Struct, kw_only=True):
    """``response_format.json_schema`` (OpenAI): the schema is required here, as vLLM requires it."""

    schema_: Json = msgspec.field(name="schema")
    name: str | None = None
    description: str | None = None
    strict: bool | None = None


class TextFormat(msgspec.Struct, kw_only=True, tag="text", tag_field="type"):
    pass


class JsonObjectFormat(msgspec.Struct, kw_only=True, tag="json_object", tag_field="type"):
    pass


class JsonSchemaFormat(msgspec.Struct, kw_only=True, tag="json_schema", tag_field="type"):
    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


class StructuredOutputsBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's ``structured_outputs``: exactly one of these (an unknown key is a 400, never ignored)."""

    json: str | Json | None = None
    regex: Annotated[str, Meta(min_length=1)] | None = None
    choice: Annotated[list[str], Meta(min_length=1)] | None = None
    grammar: Annotated[str, Meta(min_length=1)] | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None  # with json or json_object (asyncdp.api.structured)


class _Common(msgspec.Struct, kw_only=True):
    model: str | None = None
    temperature: Annotated[float, Meta(ge=0.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    n: NumSeqs | None = None
    best_of: NumSeqs | None = None  # not with stream (unless equal to n)
    seed: Seed | None = None
    stop: StopString | list[StopString] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[TokenIdKey, Bias] | None = None
    user: str | None = None  # a routing key when nothing more specific names one (asyncdp.api.routing_key)
    safety_identifier: str | None = None  # OpenAI's abuse-monitoring id: accepted, nothing to do with it here
    prompt_cache_key: str | None = None  # OpenAI's cache-affinity key: the request's routing key
    metadata: dict[str, str] | None = None  # OpenAI's tags for stored completions: nothing is stored (store: false)
    parallel_tool_calls: bool | None = None  # chat tool_choice "required"/"auto": false allows/keeps one call
    # vLLM sampling extras
    top_k: Annotated[int, Meta(ge=-1, le=MAX_INT32)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Meta(ge=MIN_REPETITION_PENALTY, le=MAX_PENALTY)] | None = None
    min_tokens: Count | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    prompt_logprobs: NumLogprobs | None = None
    add_special_tokens: bool | None = None
    echo: bool | None = None
    # vLLM's token-id parameters (asyncdp.api.token_ids); truncate_prompt_tokens 0 is a 400 there
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=MAX_INT32)] | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    data_parallel_rank: Any = None  # typed by parse_rank_hint, so a bad value gets the E1 message
    data_parallel_global_rank: Any = None
    # Structured outputs (asyncdp.api.structured): at most one of these per request.
    response_format: ResponseFormat | None = None
    guided_json: str | Json | None = None
    guided_regex: Annotated[str, Meta(min_length=1)] | None = None
    guided_choice: Annotated[list[str], Meta(min_length=1)] | None = None
    guided_grammar: Annotated[str, Meta(min_length=1)] | None = None
    structured_outputs: StructuredOutputsBody | None = None
    # vLLM's token filters (asyncdp.sampling_params.token_filters), checked by asyncdp.api.params
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # Isolates the request's prefix-cache blocks (SamplingParams.cache_salt); "" is a 400 (asyncdp.api.params).
    cache_salt: str | None = None
    # vLLM's detokenization option (SamplingParams.spaces_between_special_tokens; null: true).
    spaces_between_special_tokens: bool | None = None
    # Declared so a wrong type is a 400 too; refused unless absent, null or the value named in params.REFUSED
    # (but request_id, below: the response's id, asyncdp.api.request_ids).
    functions: list[Json] | None = None
    function_call: str | Json | None = None
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    logits_processors: list[Any] | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    priority: int | None = None
    request_id: str | None = None
    kv_transfer_params: Json | None = None
    vllm_xargs: Json | None = None
    store: bool | None = None
    service_tier: str | None = None


class CompletionRequest(_Common, kw_only=True):
    prompt: Any = None  # str | list[str] | list[int] | list[list[int]]; checked by params.prompts()
    max_tokens: Annotated[int, Meta(ge=0, le=MAX_INT32)] | None = None  # 0: the prompt only (with echo)
    # Chat's name for the limit, which clients also send here: it wins over max_tokens, as in chat.
    max_completion_tokens: Annotated[int, Meta(ge=0, le=MAX_INT32)] | None = None
    logprobs: NumLogprobs | None = None
    suffix: str | None = None
    prompt_embeds: str | list[str] | None = None
    tools: list[Json] | None = None  # refused (no tools for completions)
    tool_choice: str | Json | None = None


class FunctionDefinition(msgspec.Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1)]
    description: str | None = None
    parameters: Json | None = None  # a JSON schema of the arguments
    strict: bool | None = None


class ToolDefinition(msgspec.Struct, kw_only=True):
    """One of chat's ``tools`` (OpenAI's shape: functions only)."""

    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(msgspec.Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1)]


class NamedToolChoice(msgspec.Struct, kw_only=True):
    """``tool_choice`` naming the function to call."""

    type: Literal["function"]
    function: ToolChoiceFunction


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str
    content: Any = None  # str | list of text parts | None; checked by asyncdp.api.chat_messages
    # Passed to the chat template as they are (``message.name`` ...), when given, as vLLM does.
    name: str | None = None
    tool_calls: list[Json] | None = None
    tool_call_id: str | None = None
    # An assistant turn's reasoning, for templates that render it (chat_messages passes it under both names).
    reasoning: str | None = None
    reasoning_content: str | None = None


class ChatRequest(_Common, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    # Tool choices (asyncdp.api.tool_calls): "auto" with tools needs --enable-auto-tool-choice, else a 400.
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    max_tokens: Annotated[int, Meta(ge=1, le=MAX_INT32)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1, le=MAX_INT32)] | None = None
    logprobs: bool | None = None
    top_logprobs: NumLogprobs | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: Json | None = None
    chat_template: ChatTemplateSource | None = None  # needs --trust-request-chat-template (asyncdp.api.chat_render)
    documents: list[dict[str, str]] | None = None  # RAG documents, the template's ``documents`` (vLLM's shape)
    mm_processor_kwargs: Json | None = None
    media_io_kwargs: MediaIoKwargs | None = None
    modalities: list[str] | None = None
    audio: Json | None = None
    prediction: Json | None = None  # OpenAI's predicted output: a latency hint, the answer is the same without it
    # vLLM's (and the openai client's) efforts: the chat template's ``reasoning_effort`` (asyncdp.api.chat_render)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    web_search_options: Json | None = None
    verbosity: str | None = None
    include_reasoning: bool | None = None


class TokenizeCompletion(msgspec.Struct, kw_only=True):
    """``POST /tokenize`` with a prompt (vLLM's ``TokenizeCompletionRequest``)."""

    prompt: str
    model: str | None = None
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = None  # vLLM's: the answer's ``token_strs``, each token's string


class TokenizeChat(msgspec.Struct, kw_only=True):
    """``POST /tokenize`` with messages (vLLM's ``TokenizeChatRequest``): rendered as a chat request's prompt."""

    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    model: str | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    add_special_tokens: bool | None = None
    chat_template_kwargs: Json | None = None
    chat_template: ChatTemplateSource | None = None  # as a chat request's (vLLM's TokenizeChatRequest has it)
    tools: list[ToolDefinition] | None = None  # rendered by the chat template, as for a chat request
    return_token_strs: bool | None = None
    mm_processor_kwargs: Json | None = None  # refused, as chat's (asyncdp.api.params)
    media_io_kwargs: MediaIoKwargs | None = None  # as chat's
    # Chat's, beyond vLLM's /tokenize (which ignores them): rendered as a chat request renders them, so the count is
    # the chat request's prompt_tokens
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    documents: list[dict[str, str]] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[TokenId]
    model: str | None = None


def decode_body(data: bytes | str, kind: type[msgspec.Struct]) -> Any:
    """Decode and type-check one JSON body; every failure is a 400 (naming the field where one is at fault)."""
    if isinstance(data, bytes):
        try:
            data.decode("utf-8")  # msgspec skips unknown keys without checking them; the whole body must be text
        except UnicodeDecodeError as exc:
            raise HTTPError(400, f"The request body is not valid UTF-8 (byte {exc.start}).") from None
    if not data.strip():
        raise HTTPError(400, "The request body is empty; expected a JSON object.")
    try:
        try:
            return msgspec.json.decode(data, type=kind)
        except msgspec.ValidationError as exc:
            if "got `float`" not in str(exc):
                raise
            # JSON (and JSON Schema) has one number type: 2.0 is the integer 2. The strict decoder refuses it,
            # so retry, rarely, with integral floats turned into ints.
            return msgspec.convert(_integral(msgspec.json.decode(data)), kind, strict=True)
    except msgspec.ValidationError as exc:
        raise HTTPError(400, f"Invalid request body: {exc}", param=_field_of(str(exc))) from None
    except msgspec.DecodeError as exc:
        raise HTTPError(400, f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise HTTPError(400, "The request body is nested too deeply.") from None


def convert_at(value: Any, kind: Any, param: str) -> Any:
    """``value``, the part ``param`` of a decoded body, as the type ``kind``; else a 400 naming the place inside
    ``param`` that is at fault, as ``decode_body`` names a field (``chat_template_kwargs.documents[0]``)."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        message = message.replace("`$", f"`$.{param}", 1) if "`$" in message else f"{message} - at `$.{param}`"
        raise HTTPError(400, f"Invalid request body: {message}", param=_field_of(message)) from None


def _integral(obj: Any) -> Any:
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, list):
        return [_integral(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _integral(v) for k, v in obj.items()}
    return obj


def _field_of(message: str) -> str | None:
    # msgspec says "... - at `$.messages[0].role`", "Object missing required field `messages`", or, inside an
    # object, "Object missing required field `role` - at `$.messages[0]`" (the field is messages[0].role).
    if "missing required field `" in message and "`$." in message:
        missing = message.split("field `", 1)[1].split("`", 1)[0]
        return f"{message.split('`$.', 1)[1].split('`', 1)[0]}.{missing}"
    if "`$." in message:  # "[...]" is msgspec's placeholder for a dict's values ("logit_bias[...]"): the dict names it
        return message.split("`$.", 1)[1].split("`", 1)[0].split("[...]", 1)[0]
    if "field `" in message:
        return message.split("field `", 1)[1].split("`", 1)[0]
    return None
