"""Per-request sampling parameters (vLLM's shape), validated in one place.

``SamplingParams`` travels inside ``AddRequest`` on the wire, so it is a frozen msgspec struct. ``validate()``
raises :class:`~asyncdp.errors.InvalidSamplingParams` naming the field and its allowed range; the API layer and
the offline ``LLM`` both call it before a request reaches an engine. ``structured`` (``StructuredOutputs``) is
checked by compiling its grammar with llguidance (tokenizer-free, cached by text; ``grammar_text`` and
``check_grammar`` live here so that this wire type imports nothing of the engine), so an uncompilable schema or
regex is refused there too, naming ``structured.<field>``. The engine's matchers build from the same
``grammar_text``, under the same ``grammar_limits``.

Limits. A grammar can compile and still fail once tokens flow: llguidance builds its lexer lazily, so a counted
repetition with a large count (``a{99999999}``, or one in a JSON schema's ``pattern``) exhausts the library's
lexer fuel at the first mask or token, a choice list wider than a parser row its row limit, and the matcher
enters an error state. ``check_grammar`` therefore runs a bounded probe after compiling: a matcher over a 256-byte tokenizer,
under ``GRAMMAR_LIMITS`` (a fifth of the library's default lexer fuel, which also bounds the probe to ~0.1 s
and ~30 MB), walks ``PROBE_STEPS`` bytes, each the lowest the grammar allows. What fails there
is refused like an uncompilable grammar. What the probe cannot see (a branch it did not take, a limit hit after
many tokens) still fails in the engine, which ends the request with an error, never a quiet ``stop``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from typing import Any

import msgspec

from asyncdp.errors import InvalidSamplingParams

# Logprobs beyond this many alternatives are refused, as in vLLM's default.
MAX_LOGPROBS = 20
# Most sequences one request may ask for (n, best_of), as OpenAI caps them.
MAX_N = 128
# Integer fields that name token ids or counts travel as msgpack ints and index tensors: keep them in int32.
MAX_INT32 = 2**31 - 1
# OpenAI's ranges: penalties in [-2, 2], logit_bias values in [-100, 100].
MAX_PENALTY = 2.0
# The smallest repetition_penalty: logits are fp32, where a smaller divisor (1e-40 is subnormal, 1e-300 rounds to
# 0) turns the penalised logits into inf and the distribution into NaN. 1e-6 keeps logits / penalty finite.
MIN_REPETITION_PENALTY = 1e-6
MAX_LOGIT_BIAS = 100.0
INSTALL_HINT = "structured outputs need the 'llguidance' package on the server; install it with: pip install llguidance"
# JSON is generated compact (no optional whitespace): small models otherwise loop on spaces and newlines.
_JSON_OPTIONS = {"whitespace_flexible": False}
# llguidance's parser limits for every compile, probe and matcher (``LLParserLimits``; the rest are the library's
# defaults). The initial lexer fuel is a fifth of its default 1_000_000: a regex's counted repetition {n} takes
# about 4n, so n up to ~50_000, JSON schemas of hundreds of properties and enums of thousands of values fit, and
# exhausting it takes ~0.05-0.12 s and ~15-30 MB instead of ~0.3-0.8 s and ~90-170 MB (measured on 2 cores; the
# engine's per-token mask cost of such a repetition grows with n too).
GRAMMAR_LIMITS: dict[str, int] = {"initial_lexer_fuel": 200_000}
# Bytes the validation probe feeds a fresh matcher (see the module docstring).
PROBE_STEPS = 16
# Deepest nesting of arrays and objects a JSON schema may have. The grammar library refuses schemas deeper than
# ~124 levels itself (its JSON parser's recursion limit of 128), so nothing it would compile is refused here;
# checking first, without recursion, keeps Python's ``json`` (recursive, bounded by the interpreter's recursion
# limit like the request decoder) from ever seeing a deeper value.
MAX_SCHEMA_DEPTH = 128


def sample_seed(seed: int | None, index: int) -> int | None:
    """Sample ``index``'s seed (HTTP ``n``/``best_of``, offline ``n``): ``seed + index``, wrapped into 64 bits."""
    child = None if seed is None else seed + index
    return child - 2**64 if child is not None and child >= 2**64 else child


def json_depth(value: Any) -> int:
    """How deeply ``value`` (decoded JSON: dicts, lists, scalars) nests; 0 for a scalar. Iterative, so a value
    nested deeper than the interpreter's recursion limit is measured, not a RecursionError."""
    depth, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            depth = max(depth, level)
            stack.extend((child, level + 1) for child in children)
    return depth


def load_schema(text: str, field: str) -> Any:
    """``text`` decoded as JSON, no deeper than ``MAX_SCHEMA_DEPTH``; ``InvalidSamplingParams`` naming ``field``
    when it is not JSON or nests too deeply (never a RecursionError)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(field) from None
    except ValueError as exc:
        raise InvalidSamplingParams(f"{field} is not valid JSON ({exc}).", field=field) from None
    check_schema_depth(value, field)
    return value


def check_schema_depth(value: Any, field: str) -> None:
    """``InvalidSamplingParams`` naming ``field`` when the decoded schema ``value`` nests deeper than
    ``MAX_SCHEMA_DEPTH`` (the API answers it with a 400 whose ``param`` is ``field``)."""
    if json_depth(value) > MAX_SCHEMA_DEPTH:
        raise _too_deep(field)


def _too_deep(field: str) -> InvalidSamplingParams:
    return InvalidSamplingParams(f"{field} is nested too deeply (more than {MAX_SCHEMA_DEPTH} levels of arrays "
                                 "and objects).", field=field)


def llguidance_module() -> Any:
    """The grammar library (an optional extra, imported on first use)."""
    try:
        import llguidance
    except ImportError as exc:
        raise InvalidSamplingParams(INSTALL_HINT, field="structured") from exc
    return llguidance


def grammar_text(kind: str, text: str) -> str:
    """The llguidance grammar of a ``StructuredOutputs.kind()`` pair (the engine's matchers compile the same)."""
    llg = llguidance_module()
    matcher = llg.LLMatcher
    if kind in ("json_schema", "json_object"):
        return str(matcher.grammar_from_json_schema(text, defaults=_JSON_OPTIONS))
    if kind == "regex":
        return str(matcher.grammar_from_regex(text))
    if kind == "choice":
        return str(matcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in json.loads(text))))
    if kind == "grammar":
        return str(llg.grammar_from("grammar", text))  # Lark, or llama.cpp GBNF converted to Lark
    raise ValueError(f"unknown structured output kind {kind!r}")


@functools.cache
def grammar_limits() -> Any:
    """``GRAMMAR_LIMITS`` as the library's ``LLParserLimits``, with short error messages where it has the switch
    (verbose ones dump the parser state and the whole grammar)."""
    limits = llguidance_module().LLParserLimits
    try:
        return limits(**GRAMMAR_LIMITS, verbose_errors=False)
    except TypeError:  # an llguidance without verbose_errors
        return limits(**GRAMMAR_LIMITS)


def library_error(message: str) -> str:
    """The library's error without the state dump it may append (``<state>``, ``<non-verbose/>``...)."""
    head = str(message).split("\n<", 1)[0].strip()
    return head or str(message).strip()


def _hint(error: str) -> str:
    return "; a counted repetition {n} with a large n is the usual cause" if "lexer" in error else ""


def refuse_grammar(kind: str, message: str) -> InvalidSamplingParams:
    return InvalidSamplingParams(f"structured.{kind} cannot be compiled: {message}", field=f"structured.{kind}")


def grammar_failed(kind: str, message: str, param: str | None = None) -> InvalidSamplingParams:
    """The error of a request whose grammar failed in the engine after it was admitted; it names ``param``, the
    request parameter the grammar came from, when the API gave one (as the refusal at validation does)."""
    return InvalidSamplingParams(
        f"{param + ': ' if param else ''}structured.{kind} failed during generation: it exceeded the grammar "
        f"library's limits ({library_error(message)}){_hint(message)}; the text generated before it is incomplete.",
        field=param or f"structured.{kind}")


class _ByteTokens:
    """A tokenizer for the probe, in the shape ``llguidance.TokenizerWrapper`` takes: the 256 bytes, then EOS."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


@functools.cache
def _probe_tokenizer() -> Any:
    llg = llguidance_module()
    return llg.LLTokenizer(llg.TokenizerWrapper(_ByteTokens()))


def probe_grammar(grammar: str) -> str:
    """The library's error when a matcher over single bytes fails within ``PROBE_STEPS`` bytes of this compiled
    grammar (each step the lowest byte its mask allows, EOS only when nothing else is), or ""."""
    import numpy as np

    matcher = llguidance_module().LLMatcher(_probe_tokenizer(), grammar, log_level=0, limits=grammar_limits())
    eos = _ByteTokens.eos_token_id
    for _ in range(PROBE_STEPS):
        if matcher.is_error() or matcher.is_stopped():
            break
        mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        if matcher.is_error():
            break
        allowed = np.flatnonzero(np.unpackbits(mask, bitorder="little")[:eos])
        if not allowed.size:
            break  # only EOS (the grammar is complete) or nothing at all
        matcher.consume_token(int(allowed[0]))
    return library_error(matcher.get_error()) if matcher.is_error() else ""


@functools.lru_cache(maxsize=256)
def check_grammar(kind: str, text: str) -> str:
    """The library's error message for this grammar, or "" when it compiles and passes the probe (cached by
    text)."""
    try:
        grammar = grammar_text(kind, text)
    except ValueError as exc:
        return str(exc)
    error = str(llguidance_module().LLMatcher.validate_grammar(grammar, limits=grammar_limits())).strip()
    if error:
        return error
    error = probe_grammar(grammar)
    return f"it exceeds the grammar library's limits ({error}){_hint(error)}" if error else ""


class StructuredOutputs(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Constrain the output to a grammar (vLLM's ``StructuredOutputsParams``): set exactly one field.

    ``json_schema`` is a JSON schema as a JSON string, or a dict (serialised, as vLLM's ``json=``);
    ``json_object`` any JSON object (``response_format`` ``json_object``); ``regex`` a regular expression (Rust
    ``regex`` syntax); ``choice`` one of these strings exactly; ``grammar`` a Lark grammar (or llama.cpp GBNF).
    The engine masks every other token out, and the request finishes with ``stop`` once the grammar is complete.
    ``param`` is not a constraint: the API sets it to the request parameter the grammar came from
    (``response_format``, ``guided_regex``, ...), which an error during generation then names.
    """

    json_schema: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] = ()
    grammar: str | None = None
    param: str | None = None

    def __post_init__(self) -> None:  # vLLM's shapes: a list of choices, a schema as a dict (its ``json=``)
        if isinstance(self.choice, list):
            msgspec.structs.force_setattr(self, "choice", tuple(self.choice))
        if isinstance(self.json_schema, dict) and json_depth(self.json_schema) <= MAX_SCHEMA_DEPTH:
            with contextlib.suppress(TypeError, ValueError):  # not JSON: left for validate() to refuse
                msgspec.structs.force_setattr(self, "json_schema", json.dumps(self.json_schema))

    def kind(self) -> tuple[str, str]:
        """(field name, its text) of the one field set; InvalidSamplingParams when none or several are."""
        given = [(name, value) for name, value in (
            ("json_schema", self.json_schema), ("json_object", '{"type": "object"}' if self.json_object else None),
            ("regex", self.regex), ("choice", json.dumps(list(self.choice)) if self.choice else None),
            ("grammar", self.grammar)) if value is not None]
        if len(given) != 1:
            raise InvalidSamplingParams(
                "structured outputs take exactly one of json_schema, json_object, regex, choice, grammar; got "
                f"{[name for name, _ in given] or 'none'}.", field="structured")
        return given[0]

    def validate(self) -> None:
        """Check that exactly one field is set and that the grammar library compiles it (cached by text)."""
        for name in ("json_schema", "regex", "grammar", "param"):
            if not isinstance(getattr(self, name), str | None):
                raise InvalidSamplingParams(f"structured.{name} must be a string"
                                            f"{' or a dict of JSON values' if name == 'json_schema' else ''}, got "
                                            f"{type(getattr(self, name)).__name__}.", field=f"structured.{name}")
        if not isinstance(self.json_object, bool):
            raise InvalidSamplingParams(f"structured.json_object must be a bool, got {self.json_object!r}.",
                                        field="structured.json_object")
        if not isinstance(self.choice, tuple) or not all(isinstance(c, str) for c in self.choice):
            raise InvalidSamplingParams(  # a str would be read as its characters: choice="yes" allows y, e or s
                f"structured.choice must be a list or tuple of strings, got {self.choice!r}.",
                field="structured.choice")
        name, text = self.kind()
        if name == "json_schema":
            schema = load_schema(text, "structured.json_schema")
            if not isinstance(schema, dict | bool):
                raise InvalidSamplingParams("structured.json_schema must be a JSON object (a JSON schema).",
                                            field="structured.json_schema")
        error = check_grammar(name, text)
        if error:
            raise refuse_grammar(name, error)


_INT_FIELDS = ("n", "top_k", "min_tokens", "seed", "max_tokens", "logprobs", "prompt_logprobs")
_OPTIONAL = ("seed", "max_tokens", "logprobs", "prompt_logprobs")
_NUMBER_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top-n alternatives per generated token (0: only the sampled token)
    prompt_logprobs: int | None = None  # top-n alternatives per prompt token (0: only the prompt token)
    skip_special_tokens: bool = True
    # Penalties, vLLM semantics: presence/frequency subtract from the logits of tokens already generated
    # (frequency scaled by the count); repetition divides positive (multiplies negative) logits of tokens in the
    # prompt or the output. 0 / 0 / 1 disable them.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # (token_id, bias) pairs added to the logits before sampling, sorted by token id, ids unique (a dict: sorted).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # A grammar the output must follow (JSON schema, regex, choice, Lark); None: unconstrained.
    structured: StructuredOutputs | None = None

    def __post_init__(self) -> None:
        # vLLM's shapes: stop="x" is one stop string (never its characters), lists are kept as tuples.
        if isinstance(self.stop, str | list):
            msgspec.structs.force_setattr(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if isinstance(self.stop_token_ids, list):
            msgspec.structs.force_setattr(self, "stop_token_ids", tuple(self.stop_token_ids))
        if isinstance(self.logit_bias, dict):  # vLLM's {token_id: bias}; the struct keeps sorted pairs
            pairs = self.logit_bias.items()
            if all(_is_int(t) for t, _ in pairs):
                msgspec.structs.force_setattr(self, "logit_bias", tuple(sorted(pairs)))

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def validate(self) -> SamplingParams:
        """Check every range; return self so calls can be chained."""
        def bad(field: str, allowed: str, value: object) -> InvalidSamplingParams:
            return InvalidSamplingParams(f"{field} must be {allowed}, got {value!r}.", field=field)

        self._check_types(bad)
        if not 1 <= self.n <= MAX_N:
            raise bad("n", f"in [1, {MAX_N}]", self.n)
        if not 0.0 <= self.temperature < math.inf:  # also catches NaN
            raise bad("temperature", ">= 0 and finite", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]", self.top_p)
        if not -1 <= self.top_k <= MAX_INT32:
            raise bad("top_k", f"-1, 0 (disabled) or in [1, {MAX_INT32}]", self.top_k)
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]", self.min_p)
        if self.max_tokens is not None and not 1 <= self.max_tokens <= MAX_INT32:
            raise bad("max_tokens", f"in [1, {MAX_INT32}]", self.max_tokens)
        if not 0 <= self.min_tokens <= MAX_INT32:
            raise bad("min_tokens", f"in [0, {MAX_INT32}]", self.min_tokens)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"<= max_tokens ({self.max_tokens})", self.min_tokens)
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise bad("logprobs", f"in [0, {MAX_LOGPROBS}]", self.logprobs)
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise bad("prompt_logprobs", f"in [0, {MAX_LOGPROBS}]", self.prompt_logprobs)
        if not isinstance(self.stop, tuple) or any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "a string or a list of non-empty strings", self.stop)
        if any(not 0 <= t <= MAX_INT32 for t in self.stop_token_ids):
            raise bad("stop_token_ids", f"token ids in [0, {MAX_INT32}]", list(self.stop_token_ids))
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise bad("seed", "a 64-bit integer", self.seed)
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise bad(name, f"in [{-MAX_PENALTY:g}, {MAX_PENALTY:g}]", value)
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_PENALTY:
            raise bad("repetition_penalty", f"in [{MIN_REPETITION_PENALTY:g}, {MAX_PENALTY:g}]",
                      self.repetition_penalty)
        ids = [t for t, _ in self.logit_bias]
        if any(not 0 <= t <= MAX_INT32 for t in ids) or len(set(ids)) != len(ids):
            raise bad("logit_bias", f"unique token ids in [0, {MAX_INT32}]", ids)
        if any(not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS for _, b in self.logit_bias):
            raise bad("logit_bias", f"biases in [{-MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
                      [b for _, b in self.logit_bias])
        if self.structured is not None:
            self.structured.validate()
        return self

    def _check_types(self, bad: Any) -> None:
        """Each field's type, before the ranges compare them (a bool is no number; ``stop``: with its range)."""
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not (_is_int(value) or value is None and name in _OPTIONAL):
                raise bad(name, "an integer" + (" or None" if name in _OPTIONAL else ""), value)
        for name in _NUMBER_FIELDS:
            if not _is_number(getattr(self, name)):
                raise bad(name, "a number", getattr(self, name))
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "a bool", getattr(self, name))
        if not isinstance(self.stop_token_ids, tuple) or not all(map(_is_int, self.stop_token_ids)):
            raise bad("stop_token_ids", "a list of integer token ids", self.stop_token_ids)
        if not isinstance(self.logit_bias, tuple) or not all(
                isinstance(p, tuple) and len(p) == 2 and _is_int(p[0]) and _is_number(p[1]) for p in self.logit_bias):
            raise bad("logit_bias", "a dict {token_id: bias} of integer ids and numbers", self.logit_bias)
        if not isinstance(self.structured, StructuredOutputs | None):
            raise bad("structured", "a StructuredOutputs or None", self.structured)

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)
