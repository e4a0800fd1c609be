"""Structured outputs from a request body: OpenAI's ``response_format``, vLLM's ``guided_*`` parameters and
``structured_outputs``, turned into the one ``StructuredOutputs`` the engine takes.

A request names at most one source (two are a 400 naming both). The grammar is compiled here, before any
sequence starts (``StructuredOutputs.validate``, cached by text), so a schema or regex the grammar library
cannot compile is a 400 naming the request's own parameter, not an engine error after admission.

``guided_whitespace_pattern`` (or ``structured_outputs.whitespace_pattern``, not both) becomes the constraint's
``whitespace_pattern``: the whitespace allowed between a JSON constraint's tokens. With a regex, choice or grammar
constraint, or none, it is ignored, as vLLM ignores it; a pattern the grammar library refuses is a 400 naming it.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from asyncdp.api.schemas import JsonObjectFormat, JsonSchemaFormat, StructuredOutputsBody, _Common
from asyncdp.errors import HTTPError, InvalidSamplingParams
from asyncdp.sampling_params.structured import StructuredOutputs, check_schema_depth, load_schema


def _schema_text(value: str | dict[str, Any], param: str) -> str:
    """The schema as JSON text; a 400 naming ``param`` when it is not JSON or nests deeper than
    ``MAX_SCHEMA_DEPTH`` (checked before ``json`` recurses into it: never a RecursionError's 500)."""
    if isinstance(value, str):
        try:
            load_schema(value, param)
        except InvalidSamplingParams as exc:
            raise HTTPError(400, f"{param} must be a JSON schema (an object, or a string holding one): {exc}",
                            param=param) from None
        return value
    check_schema_depth(value, param)  # a 400 naming param (InvalidSamplingParams)
    return json.dumps(value)


def _from_body(body: StructuredOutputsBody) -> StructuredOutputs:
    return StructuredOutputs(
        json_schema=None if body.json is None else _schema_text(body.json, "structured_outputs.json"),
        json_object=bool(body.json_object), regex=body.regex, choice=tuple(body.choice or ()),
        grammar=body.grammar, whitespace_pattern=body.whitespace_pattern)


def structured_outputs(req: _Common) -> StructuredOutputs | None:
    """The request's structured-output constraint, compiled and checked, or None when it asks for none."""
    sources: list[tuple[str, StructuredOutputs]] = []
    rf = req.response_format
    if isinstance(rf, JsonObjectFormat):
        sources.append(("response_format", StructuredOutputs(json_object=True)))
    elif isinstance(rf, JsonSchemaFormat):
        sources.append(("response_format", StructuredOutputs(
            json_schema=_schema_text(rf.json_schema.schema_, "response_format.json_schema.schema"))))
    if req.guided_json is not None:
        sources.append(("guided_json", StructuredOutputs(json_schema=_schema_text(req.guided_json, "guided_json"))))
    if req.guided_regex is not None:
        sources.append(("guided_regex", StructuredOutputs(regex=req.guided_regex)))
    if req.guided_choice is not None:
        sources.append(("guided_choice", StructuredOutputs(choice=tuple(req.guided_choice))))
    if req.guided_grammar is not None:
        sources.append(("guided_grammar", StructuredOutputs(grammar=req.guided_grammar)))
    if req.structured_outputs is not None:
        sources.append(("structured_outputs", _from_body(req.structured_outputs)))
    if not sources:
        return None
    if len(sources) > 1:
        names = [name for name, _ in sources]
        raise HTTPError(400, f"give at most one structured-output constraint; got {', '.join(names)}.",
                        param=names[1])
    param, constraint = sources[0]
    pattern_param = "structured_outputs" if constraint.whitespace_pattern is not None else param
    if req.guided_whitespace_pattern is not None:
        if constraint.whitespace_pattern is not None:
            raise HTTPError(400, "give at most one whitespace pattern; got guided_whitespace_pattern and "
                                 "structured_outputs.whitespace_pattern.", param="guided_whitespace_pattern")
        pattern_param = "guided_whitespace_pattern"
        constraint = msgspec.structs.replace(constraint, whitespace_pattern=req.guided_whitespace_pattern)
    try:
        constraint.validate()
    except InvalidSamplingParams as exc:
        named = pattern_param if exc.field == "structured.whitespace_pattern" else param
        raise HTTPError(400, f"{named}: {exc}", param=named) from None
    return msgspec.structs.replace(constraint, param=param)  # named again if the grammar fails mid-generation
