"""Structured outputs: ``StructuredOutputs`` and the grammar checks behind its ``validate()``.

``StructuredOutputs`` is checked by compiling its grammar with llguidance (tokenizer-free, cached by text;
``grammar_text`` and ``check_grammar`` live here so that this wire type imports nothing of the engine), so an
uncompilable schema or regex is refused, naming ``structured.<field>``. The engine's matchers build from the same
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
from typing import Any

import msgspec

from asyncdp.errors import InvalidSamplingParams

INSTALL_HINT = "structured outputs need the 'llguidance' package on the server; install it with: pip install llguidance"
# JSON is generated compact (no optional whitespace): small models otherwise loop on spaces and newlines.
_JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}
# The kinds a ``whitespace_pattern`` applies to (ignored with the others, as vLLM does).
JSON_KINDS = ("json_schema", "json_object")
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


def grammar_text(kind: str, text: str, whitespace_pattern: str | None = None) -> str:
    """The llguidance grammar of a ``StructuredOutputs.grammar_key()`` (the engine's matchers compile the same).
    ``whitespace_pattern`` (JSON kinds only) is the regex of the whitespace allowed between JSON tokens: the
    library's ``whitespace_pattern`` compile option, which replaces the compact default."""
    llg = llguidance_module()
    matcher = llg.LLMatcher
    if kind in JSON_KINDS:
        options = _JSON_OPTIONS if whitespace_pattern is None else {
            **_JSON_OPTIONS, "whitespace_pattern": whitespace_pattern}
        return str(matcher.grammar_from_json_schema(text, defaults=options))
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
def check_grammar(kind: str, text: str, whitespace_pattern: str | None = None) -> str:
    """The library's error message for this grammar, or "" when it compiles and passes the probe (cached by
    text and whitespace pattern)."""
    try:
        grammar = grammar_text(kind, text, whitespace_pattern)
    except ValueError as exc:
        return str(exc)
    error = str(llguidance_module().LLMatcher.validate_grammar(grammar, limits=grammar_limits())).strip()
    if error:
        return error
    error = probe_grammar(grammar)
    return f"it exceeds the grammar library's limits ({error}){_hint(error)}" if error else ""


def _token_ids(value: object) -> bool:
    return isinstance(value, tuple) and all(type(t) is int and t >= 0 for t in value)


class StartMarker(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A point in the generated ids after which a grammar starts (``StructuredOutputs.start_markers``): data the
    engine matches per sampled id.

    ``ids`` alone: the grammar starts after the generated ids contain ``ids`` (as ``start_after``). With
    ``closed_by``: ``ids`` opens a header that ``closed_by`` closes, the closing beginning at most ``max_gap_tokens``
    ids after the opening (a content type between them, say), with no ``cancelled_by`` between; the grammar starts
    after the closing. A later opening starts the header over. gpt-oss's final answer (``<|channel|>final``, up to
    19 ids, ``<|message|>``, not across ``<|end|>``) is one, as vLLM's gpt-oss reasoning parser ends the reasoning.
    """

    ids: tuple[int, ...]
    closed_by: tuple[int, ...] = ()
    max_gap_tokens: int = 0
    cancelled_by: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("ids", "closed_by", "cancelled_by"):
            if isinstance(getattr(self, name), list):
                msgspec.structs.force_setattr(self, name, tuple(getattr(self, name)))

    def validate(self) -> None:
        if not (_token_ids(self.ids) and self.ids and _token_ids(self.closed_by) and _token_ids(self.cancelled_by)
                and type(self.max_gap_tokens) is int and self.max_gap_tokens >= 0):
            raise InvalidSamplingParams(
                f"structured.start_markers: each marker has ids (a non-empty list of token ids, ints >= 0), and "
                f"may have closed_by and cancelled_by (lists of token ids) and max_gap_tokens (an int >= 0); got "
                f"{self!r}.", field="structured.start_markers")


class StructuredOutputs(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Constrain the output to a grammar (vLLM's ``StructuredOutputsParams``): set exactly one field.

    ``json_schema`` is a JSON schema as a JSON string, or a dict (serialised, as vLLM's ``json=``);
    ``json_object`` any JSON object (``response_format`` ``json_object``); ``regex`` a regular expression (Rust
    ``regex`` syntax); ``choice`` one of these strings exactly; ``grammar`` a Lark grammar (or llama.cpp GBNF).
    The engine masks every other token out, and the request finishes with ``stop`` once the grammar is complete.
    ``param`` is not a constraint: the API sets it to the request parameter the grammar came from
    (``response_format``, ``guided_regex``, ...), which an error during generation then names.

    ``start_after`` is not one either: token ids after which the grammar starts (empty: at the first generated
    token). Until the generated ids contain that sequence the request samples freely (no mask, the matcher is not
    advanced); from the next token the grammar applies from its start. The API sets it to a reasoning model's
    ``</think>`` (``--reasoning-parser``), so that the thinking stays free and the answer after it is constrained,
    as vLLM does. A request that ends before the sequence (EOS, ``max_tokens``) was never constrained.
    ``start_markers`` (:class:`StartMarker`) are more such points: the grammar starts after the first of them, or
    of ``start_after``, that the generated ids reach (gpt-oss's final-channel header, with or without a content
    type).

    ``whitespace_pattern`` (vLLM's, ``guided_whitespace_pattern`` over HTTP) qualifies a JSON constraint
    (``json_schema``, ``json_object``): a regex of the whitespace allowed between JSON tokens (``""``: none; unset:
    none either, JSON is generated compact). With the other kinds it is ignored, as vLLM's grammar backends do.
    """

    json_schema: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] = ()
    grammar: str | None = None
    param: str | None = None
    start_after: tuple[int, ...] = ()
    start_markers: tuple[StartMarker, ...] = ()
    whitespace_pattern: str | None = None

    def __post_init__(self) -> None:  # vLLM's shapes: a list of choices, a schema as a dict (its ``json=``)
        for name in ("choice", "start_after", "start_markers"):
            if isinstance(getattr(self, name), list):
                msgspec.structs.force_setattr(self, name, tuple(getattr(self, name)))
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

    def grammar_key(self) -> tuple[str, str, str | None]:
        """(field name, its text, whitespace pattern): what the grammar is compiled from (the pattern None where
        it does not apply), so what caches compiled grammars key on."""
        name, text = self.kind()
        return name, text, self.whitespace_pattern if name in JSON_KINDS else None

    def validate(self) -> None:
        """Check that exactly one field is set and that the grammar library compiles it (cached by text)."""
        for name in ("json_schema", "regex", "grammar", "param", "whitespace_pattern"):
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
        if not _token_ids(self.start_after):
            raise InvalidSamplingParams(f"structured.start_after must be a list or tuple of token ids (ints >= 0), "
                                        f"got {self.start_after!r}.", field="structured.start_after")
        if not isinstance(self.start_markers, tuple) or not all(
                isinstance(m, StartMarker) for m in self.start_markers):
            raise InvalidSamplingParams(f"structured.start_markers must be a list of StartMarker, got "
                                        f"{self.start_markers!r}.", field="structured.start_markers")
        for marker in self.start_markers:
            marker.validate()
        name, text = self.kind()
        if name == "json_schema":
            schema = load_schema(text, "structured.json_schema")
            if not isinstance(schema, dict | bool):
                raise InvalidSamplingParams("structured.json_schema must be a JSON object (a JSON schema).",
                                            field="structured.json_schema")
        pattern = self.grammar_key()[2]
        if pattern is not None:  # checked alone first, so that its error names it
            error = check_grammar("json_object", '{"type": "object"}', pattern)
            if error:
                raise InvalidSamplingParams(f"structured.whitespace_pattern is not a usable regex: {error}",
                                            field="structured.whitespace_pattern")
        error = check_grammar(name, text, pattern)
        if error:
            raise refuse_grammar(name, error)
