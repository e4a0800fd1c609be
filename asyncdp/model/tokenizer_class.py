"""Which tokenizer class ``AutoTokenizer`` would load for a local checkpoint, decided without importing it.

``transformers.AutoTokenizer`` lives in ``transformers.models.auto``, whose import pulls in torch: about a second of
CPU and 185 MiB in every API server, which runs no model. Its choice (transformers 5.x,
``models/auto/tokenization_auto.py``) for a local folder that declares ``tokenizer_class`` and no remote code
depends on a few facts only: the declared class, ``config.json``'s ``model_type`` (the class registered for it, and
whether the Hub is known to declare a wrong class for it), whether ``tokenizer.json`` is ByteLevel (a declared
``LlamaTokenizer`` on a ByteLevel tokenizer becomes ``TokenizersBackend``), and the path's name (some Hub ids are
forced to ``TokenizersBackend``). :func:`tokenizer_class_name` replays those rules for the model types asyncdp runs and
the classes their checkpoints declare, and answers ``None`` for anything else, which keeps going through
``AutoTokenizer``. The tables below are copied from transformers and pinned against it by
``tests/model/test_tokenizer_user_class.py``, so an upgrade that changes them fails a test instead of a request.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

# model_type -> the tokenizer class transformers registers for it (TOKENIZER_MAPPING_NAMES), for the families asyncdp
# runs; Mixtral's entry is MistralCommonBackend where mistral-common is installed, which only AutoTokenizer handles.
REGISTERED_CLASSES: dict[str, str | None] = {
    "llama": None, "qwen2": "Qwen2Tokenizer", "qwen3": "Qwen2Tokenizer", "qwen3_moe": "Qwen2Tokenizer",
    "mixtral": "TokenizersBackend"}
# Those of them in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS: their registered class wins over the declared one.
WRONG_HUB_CLASS_TYPES = frozenset({"qwen2"})
# MODEL_IDS_TO_TOKENIZERS_BACKEND: a path whose name matches one of these loads TokenizersBackend whatever it declares.
TOKENIZERS_BACKEND_IDS = (
    "deepseek-ai/deepseek-r1-distill-llama-*", "deepseek-ai/deepseek-coder-*", "allenai/dolma2-tokenizer",
    "google/umt5-small", "naver-clova-ix/donut-*", "salesforce/blip2-opt-*", "salesforce/blip2-flan-t5-*",
    "salesforce/instructblip-flan-t5-*", "stepfun-ai/step-3.7-*")
# A declared name -> the ``__name__`` of the class ``tokenizer_class_from_name`` resolves it to, which is also the
# ``transformers`` attribute of that name (both pinned by the test); only these names take the direct route.
RESOLVED_CLASSES = {
    "GPT2Tokenizer": "GPT2Tokenizer", "GPT2TokenizerFast": "GPT2Tokenizer",
    "LlamaTokenizer": "LlamaTokenizer", "LlamaTokenizerFast": "LlamaTokenizer",
    "Qwen2Tokenizer": "Qwen2Tokenizer", "Qwen2TokenizerFast": "Qwen2Tokenizer",
    "PreTrainedTokenizerFast": "TokenizersBackend", "PreTrainedTokenizer": "PythonBackend",
    "TokenizersBackend": "TokenizersBackend"}
_GENERIC = ("TokenizersBackend", "PythonBackend", "PreTrainedTokenizerFast")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _is_byte_level(folder: Path) -> bool:
    """transformers' own test (``TokenizersBackend._tokenizer_json_has_byte_level``): the text appears in the file."""
    try:
        return '"ByteLevel"' in (folder / "tokenizer.json").read_text(encoding="utf-8")
    except OSError:
        return False


def choose(declared: str, model_type: str, byte_level: bool) -> str:
    """The class ``AutoTokenizer.from_pretrained`` ends with, given facts :func:`tokenizer_class_name` checked are
    enough: ``declared`` in RESOLVED_CLASSES, ``model_type`` in REGISTERED_CLASSES, no remote code."""
    base = declared.removesuffix("Fast")
    registered = REGISTERED_CLASSES[model_type]
    hub_is_wrong = model_type in WRONG_HUB_CLASS_TYPES
    if base == "LlamaTokenizer" and not hub_is_wrong and byte_level:
        return "TokenizersBackend"
    if registered is not None and registered.removesuffix("Fast") != base:
        if registered not in _GENERIC:
            resolved = RESOLVED_CLASSES[registered if hub_is_wrong else declared]
            if resolved not in _GENERIC:
                return resolved
        return "TokenizersBackend"
    resolved = RESOLVED_CLASSES[base]
    return "TokenizersBackend" if resolved == "PythonBackend" else resolved


def tokenizer_class_name(path: Path | str) -> str | None:
    """The ``transformers`` attribute naming the class ``AutoTokenizer`` would load ``path``'s tokenizer with, or
    ``None`` where that cannot be told from the files alone (no or another declared class, remote code, a model type
    outside asyncdp's families, a model type whose registered class depends on optional packages)."""
    folder = Path(path)
    tokenizer_config = _read_json(folder / "tokenizer_config.json")
    config = _read_json(folder / "config.json")
    if tokenizer_config is None or config is None or "auto_map" in tokenizer_config or "auto_map" in config:
        return None
    declared, model_type = tokenizer_config.get("tokenizer_class"), config.get("model_type")
    if not isinstance(declared, str) or declared not in RESOLVED_CLASSES or not isinstance(model_type, str) \
            or model_type not in REGISTERED_CLASSES or "model_name" in config:
        return None
    if any(fnmatch.fnmatch(str(path).lower(), pattern) for pattern in TOKENIZERS_BACKEND_IDS):
        return None
    if model_type == "mixtral":
        from transformers.utils.import_utils import is_mistral_common_available

        if is_mistral_common_available():
            return None
    # (tokenizer.json is megabytes that the load reads again: read here only where the choice depends on it)
    byte_level = declared.removesuffix("Fast") == "LlamaTokenizer" and _is_byte_level(folder)
    return choose(declared, model_type, byte_level)
