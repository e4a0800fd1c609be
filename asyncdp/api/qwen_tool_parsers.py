"""The ``qwen3_coder`` tool-call format, Qwen3-Coder's XML calls (its rules are in :mod:`asyncdp.api.tool_parsers`'
doc, with the registry that names it). Arguments are text there, typed by the tool's JSON schema as vLLM's
``Qwen3CoderToolParser._convert_param_value`` types them."""

from __future__ import annotations

import ast
import json
import re
import warnings
from typing import Any

from asyncdp.api.tool_parser_base import ParsedCall, TaggedBlockParser

_FUNCTION = re.compile(r"\s*<function=([^>]*)>(.*)</function>\s*", re.DOTALL)
# a parameter runs to its closing tag, or (left unclosed) to the next parameter or the end, as vLLM's pattern reads
_PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)
_FUNCTION_END = "</function>"
_NOT_IN_NAMES = frozenset("{}<>\"' \t\n\r")  # vLLM's _is_valid_function_name
_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_NULLS = ("null", "none")


class Qwen3CoderParser(TaggedBlockParser):
    """``<tool_call><function=F><parameter=P>value</parameter>...</function></tool_call>`` blocks, values typed
    by the tool's schema (see the module doc), and the same ``<function=F>...</function>`` without the
    ``<tool_call>`` around it (Qwen3-Coder often leaves it out) when ``F`` is one of the request's tools."""

    name = "qwen3_coder"
    START, END = "<tool_call>", "</tool_call>"
    tags = (START, END)

    def blocks(self) -> dict[str, str]:
        """``<tool_call>``'s blocks, and a bare ``<function=F>`` for each tool ``F`` whose name vLLM takes for a
        function's (no whitespace, quotes, braces or angle brackets), closed by ``</function>``."""
        bare = {f"<function={name}>": _FUNCTION_END for name in sorted(self.tool_names)
                if name and not _NOT_IN_NAMES.intersection(name)}
        return {self.START: self.END, **bare}

    def trailer(self, opener: str) -> str:
        """A bare call is often followed by the ``</tool_call>`` whose opening tag the model left out."""
        return "" if opener == self.START else self.END

    def _call(self, body: str, opener: str) -> ParsedCall | None:
        """The call a block describes: one function of the request's tools, its parameters typed; else None."""
        if opener != self.START:  # a bare function: the block is the call's text
            body = f"{opener}{body}{_FUNCTION_END}"
        match = _FUNCTION.fullmatch(body)
        if match is None or (name := match.group(1)) not in self.tool_names:
            return None
        schema = self.parameters.get(name)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(properties, dict):
            properties = {}
        arguments: dict[str, Any] = {}
        for param in _PARAMETER.findall(match.group(2)):
            key, gt, value = param.partition(">")
            if not gt:  # "<parameter=x" with no ">": no call
                return None
            value = value.removeprefix("\n").removesuffix("\n")
            arguments[key] = typed(value, properties.get(key)) if key in properties else value
        return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


def typed(value: str, schema: Any) -> Any:
    """A parameter's text as its schema's type wants it, as vLLM converts it: ``null``/``None`` is null unless
    the type is a string's; an integer or a number that does not parse stays the text (a number with no
    fraction is an integer); a boolean is ``true`` when the text is ``true`` (any case) and ``false`` otherwise;
    an object or an array is read as JSON, else as a Python literal, else stays the text; another type is read
    as a Python literal, else stays the text. A value JSON cannot write (NaN, a set) stays the text too (vLLM
    fails the whole answer then)."""
    allows_null = False
    kind = "string"
    if isinstance(schema, dict) and "type" in schema:
        kind = str(schema["type"]).strip().lower()
        allows_null = kind == "null"
    elif isinstance(schema, dict) and isinstance(schema.get("anyOf"), list):  # the first type that is not null
        picked = False
        for option in schema["anyOf"]:
            if isinstance(option, dict) and "type" in option:
                option_kind = str(option["type"]).strip().lower()
                if option_kind == "null":
                    allows_null = True
                elif not picked:
                    kind, picked = option_kind, True
    lowered = value.lower()
    if allows_null and lowered in _NULLS:
        return None
    if kind in _STRING_TYPES:
        return value
    if lowered in _NULLS:
        return None
    if kind.startswith(_INTEGER_PREFIXES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
            return number if number - int(number) != 0 else int(number)
        except (ValueError, OverflowError):  # (not a number, NaN, an infinity)
            return value
    if kind in ("boolean", "bool", "binary"):
        return lowered == "true"
    container = kind in ("object", "array", "arr") or kind.startswith(("dict", "list"))
    if container:
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            pass
        else:  # (a JSON string holding a Python literal, as a model trained on a faulty template writes it)
            return _jsonable(_literal(parsed) if isinstance(parsed, str) else parsed, value)
    parsed = _literal(value)
    if container and isinstance(parsed, str):
        parsed = _literal(parsed)
    return _jsonable(parsed, value)


def _literal(text: str) -> Any:
    """``text`` as a Python literal (never evaluated), or ``text`` itself when it is none."""
    try:
        with warnings.catch_warnings():  # ("\d" in a string: a SyntaxWarning, an error under -W error)
            warnings.simplefilter("ignore")
            return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return text


def _jsonable(value: Any, text: str) -> Any:
    """``value`` when JSON can write it, else the parameter's ``text``."""
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return text
    return value
