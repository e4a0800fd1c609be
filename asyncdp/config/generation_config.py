"""vLLM's server-wide sampling defaults: ``--generation-config`` and ``--override-generation-config`` (docs/reference/
cli.md, "vLLM flags that carry over"; docs/reference/http-api.md, "Sampling defaults").

Theory of operation, as vLLM's ``ModelConfig.get_diff_sampling_param`` and its OpenAI serving layer. The defaults are
the fields of a ``generation_config.json`` among :data:`GENERATION_FIELDS` that are set (not null): the model's own
under ``auto`` (vLLM's default), none under ``vllm``, a folder's under a path; the JSON object of
``--override-generation-config`` overrides or adds to them (under ``vllm`` too). ``max_new_tokens`` is the default
``max_tokens``. A request that leaves one of these unset (absent or null) gets its default; its own value, even
the neutral one (``temperature: 1.0``), wins. The override's ``max_new_tokens`` (under ``auto`` or ``vllm``), or
a folder's (after the override), also caps every request's ``max_tokens`` (vLLM's ``override_max_tokens``).

:func:`resolve_generation_defaults` reads a folder's file when given one and is otherwise pure. The cli resolves the
defaults once, checks them (exit 2) and says at startup which apply (:func:`generation_notice`); each API server
gets them in its role (:class:`GenerationDefaults` is a frozen struct that travels as it is); the offline ``LLM``
resolves its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from asyncdp.errors import ConfigError

# The fields of generation_config.json vLLM applies (its available_params, in its order).
GENERATION_FIELDS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")
MODES = ("auto", "vllm")  # or a folder holding a generation_config.json
_OVERRIDE = "--override-generation-config"


class GenerationDefaults(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The sampling defaults a request's unset fields take (None: the field's neutral value, as without)."""

    repetition_penalty: float | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    max_tokens: int | None = None  # a request's max_tokens where it sets none (max_new_tokens)
    max_tokens_cap: int | None = None  # the most max_tokens of every request (None: no cap)

    def values(self) -> dict[str, Any]:
        """The defaults set, by their ``SamplingParams`` names (the cap left out)."""
        return {name: value for name in _SAMPLING if (value := getattr(self, name)) is not None}

    def pick(self, name: str, given: Any, neutral: Any) -> Any:
        """A request's ``name``: its own value where it gave one, else this default, else ``neutral``."""
        if given is not None:
            return given
        default = getattr(self, name)
        return neutral if default is None else default

    def max_tokens_for(self, given: int | None) -> int | None:
        """vLLM's ``get_max_tokens`` but the room the prompt leaves (the engine's bound): the request's
        ``max_tokens``, else the default, at most the cap; None where none is set (up to ``max_model_len``)."""
        limit = given if given is not None else self.max_tokens
        if self.max_tokens_cap is None:
            return limit
        return self.max_tokens_cap if limit is None else min(limit, self.max_tokens_cap)

    def for_beam_search(self) -> GenerationDefaults:
        """What vLLM's ``BeamSearchParams`` take of them: the temperature and max_tokens."""
        return GenerationDefaults(temperature=self.temperature, max_tokens=self.max_tokens,
                                  max_tokens_cap=self.max_tokens_cap)


_SAMPLING = tuple(f.name for f in msgspec.structs.fields(GenerationDefaults) if f.name != "max_tokens_cap")


def sampling_fields(document: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a generation_config.json ``document`` vLLM applies, those set (not null), in its order."""
    return {name: document[name] for name in GENERATION_FIELDS if document.get(name) is not None}


def parse_override(raw: str) -> dict[str, Any]:
    """``--override-generation-config``'s JSON object (vLLM's flag type), or a ConfigError saying what it must be."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(f"""{_OVERRIDE} must be a JSON object such as '{{"temperature": 0.5}}' (got {raw!r}).""")
    return value


def _read_folder(folder: str) -> dict[str, Any]:
    """The sampling fields of ``folder``'s generation_config.json; none where the folder has no such file, as vLLM
    (whose fallback, the folder's config.json, holds no sampling default in a current checkpoint)."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConfigError(f"--generation-config must be {', '.join(MODES)} or a folder holding generation_config.json "
                          f"(got {folder!r}: no such folder).")
    file = path / "generation_config.json"
    if not file.is_file():
        return {}
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{file}: invalid JSON ({exc}).") from exc
    return sampling_fields(document) if isinstance(document, dict) else {}


def resolve_generation_defaults(generation_config: str, override: Mapping[str, Any],
                                model_fields: Mapping[str, Any]) -> GenerationDefaults:
    """The defaults vLLM applies under ``--generation-config generation_config`` (``auto``, ``vllm`` or a folder)
    and ``--override-generation-config override``, ``model_fields`` being the model's own (:func:`sampling_fields`
    of its generation_config.json)."""
    if generation_config == "auto":
        found = dict(model_fields)
    else:
        found = {} if generation_config == "vllm" else _read_folder(generation_config)
    found = sampling_fields({**found, **override})
    max_tokens = found.pop("max_new_tokens", None)
    cap = override.get("max_new_tokens") if generation_config in MODES else max_tokens
    return GenerationDefaults(**found, max_tokens=max_tokens, max_tokens_cap=cap)


def generation_source(generation_config: str, override: Mapping[str, Any]) -> str:
    """Where the defaults come from, for an error about them."""
    files = {"auto": ["the model's generation_config.json"], "vllm": []}.get(
        generation_config, [f"{Path(generation_config) / 'generation_config.json'}"])
    return " and ".join([*files, *([_OVERRIDE] if override else [])]) or "the generation config"


def generation_notice(defaults: GenerationDefaults, generation_config: str) -> str | None:
    """vLLM's startup warning where defaults apply, with them (its INFO line's), or None where none does."""
    values = defaults.values()
    if not values and defaults.max_tokens_cap is None:
        return None
    source = "model" if generation_config == "auto" else generation_config
    cap = "" if defaults.max_tokens_cap is None else f", every request's max_tokens at most {defaults.max_tokens_cap}"
    return ("Default sampling parameters have been overridden by the model's Hugging Face generation config "
            "recommended from the model creator. If this is not intended, please relaunch with "
            f"`--generation-config vllm`. Using default sampling params from {source}: {values}{cap}")
