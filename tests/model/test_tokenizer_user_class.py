"""A user checkpoint that declares its tokenizer class is loaded by the class ``AutoTokenizer`` would pick, torch-free.

``asyncdp.model.tokenizer_class`` replays ``AutoTokenizer``'s choice from the checkpoint's files; these tests pin its
tables against transformers' own, hold on every (model type, declared class) pair it accepts that the tokenizer is the
one ``AutoTokenizer`` loads, and that the rest (remote code, no declared class) still goes through ``AutoTokenizer``.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer
from transformers.models.auto import tokenization_auto
from transformers.utils.import_utils import is_mistral_common_available

from asyncdp.model import load_tokenizer, resolve_model
from asyncdp.model.tokenizer_class import (
    REGISTERED_CLASSES,
    RESOLVED_CLASSES,
    TOKENIZERS_BACKEND_IDS,
    WRONG_HUB_CLASS_TYPES,
    tokenizer_class_name,
)
from tests.model.test_model_smollm2 import HAVE_SMOLLM2
from tests.model.test_tokenizer_builtin_class import TEXTS

SOURCES = ["builtin:tiny-dense", "metaspace"] + (["builtin:smollm2-135m"] if HAVE_SMOLLM2 else [])


def test_the_tables_are_transformers_own() -> None:
    for model_type, registered in REGISTERED_CLASSES.items():
        if model_type == "mixtral" and is_mistral_common_available():
            continue  # never read then: tokenizer_class_name sends Mixtral to AutoTokenizer
        assert tokenization_auto.TOKENIZER_MAPPING_NAMES.get(model_type) == registered, model_type
    wrong = tokenization_auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS
    assert set(REGISTERED_CLASSES) & wrong == WRONG_HUB_CLASS_TYPES
    assert list(TOKENIZERS_BACKEND_IDS) == tokenization_auto.MODEL_IDS_TO_TOKENIZERS_BACKEND
    assert not tokenization_auto.REGISTERED_TOKENIZER_CLASSES and not tokenization_auto.REGISTERED_FAST_ALIASES
    for declared, resolved in RESOLVED_CLASSES.items():
        cls = tokenization_auto.tokenizer_class_from_name(declared)
        assert cls is getattr(transformers, resolved) and cls.__name__ == resolved, declared


def metaspace_tokenizer(folder: Path) -> None:
    """A SentencePiece-style (Metaspace, not ByteLevel) tokenizer.json, as Llama 2 or Mixtral ship."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    corpus = TEXTS * 20 + ["the quick brown fox jumps over the lazy dog"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"]))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
        "chat_template": "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}</s>{% endfor %}"}))
    shutil.copy(resolve_model("builtin:tiny-dense") / "config.json", folder / "config.json")


@pytest.fixture(scope="module")
def source_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    dirs = {name: resolve_model(name) for name in SOURCES if name.startswith("builtin:")}
    dirs["metaspace"] = tmp_path_factory.mktemp("metaspace")
    metaspace_tokenizer(dirs["metaspace"])
    return dirs


def user_checkpoint(source: Path, dest: Path, model_type: str | None = None, **tokenizer_config: object) -> Path:
    """A copy of ``source``'s config and tokenizer files (no weights: a tokenizer needs none), with edits."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("*.safetensors"))
    if model_type is not None:
        config = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config = {k: v for k, v in {**config, **tokenizer_config}.items() if v is not None}
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


def assert_same_tokenizer(ours: Any, auto: Any) -> None:
    assert type(ours) is type(auto)
    assert ours.get_vocab() == auto.get_vocab()
    for attr in ("all_special_tokens", "all_special_ids", "bos_token_id", "eos_token_id", "pad_token_id",
                 "unk_token_id", "chat_template"):
        assert getattr(ours, attr) == getattr(auto, attr), attr
    for text in TEXTS:
        ids = ours(text)["input_ids"]
        assert ids == auto(text)["input_ids"], text
        assert ours.decode(ids) == auto.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == auto.decode(ids, skip_special_tokens=True)
        assert ours.convert_ids_to_tokens(ids) == auto.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("source", SOURCES)
def test_every_declared_class_on_every_model_type_loads_the_tokenizer_autotokenizer_loads(
        source: str, source_dirs: dict[str, Path], tmp_path: Path) -> None:
    # SmolLM2's 49 k-token tokenizer takes a fifth of a second a load: it is checked as the model type it is
    # (llama) with every declared class; the small tokenizers cover every model type's rules (ByteLevel and not).
    model_types = ["llama"] if source == "builtin:smollm2-135m" else list(REGISTERED_CLASSES)
    for model_type, declared in itertools.product(model_types, RESOLVED_CLASSES):
        if model_type == "mixtral" and is_mistral_common_available():
            continue
        path = user_checkpoint(source_dirs[source], tmp_path / f"{model_type}-{declared}", model_type,
                               tokenizer_class=declared)
        assert tokenizer_class_name(path) is not None, (model_type, declared)
        auto = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        try:
            assert_same_tokenizer(load_tokenizer(path), auto)
        except AssertionError as exc:
            raise AssertionError(f"{model_type} declaring {declared}: {exc}") from exc


def test_the_realistic_pairs_take_the_classes_autotokenizer_takes(source_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A few named outcomes, so that a change in the rules is visible as a class, not only as a mismatch."""
    byte_level, metaspace = source_dirs["builtin:tiny-dense"], source_dirs["metaspace"]
    cases = [(byte_level, "llama", "LlamaTokenizerFast", "TokenizersBackend"),  # Llama 3 style ByteLevel
             (metaspace, "llama", "LlamaTokenizer", "LlamaTokenizer"),  # Llama 2
             (metaspace, "mixtral", "LlamaTokenizerFast", "TokenizersBackend"),
             (byte_level, "qwen2", "PreTrainedTokenizerFast", "Qwen2Tokenizer"),  # the Hub's class is overridden
             (byte_level, "qwen3", "Qwen2Tokenizer", "Qwen2Tokenizer"),
             (byte_level, "llama", "GPT2Tokenizer", "GPT2Tokenizer"),  # SmolLM2 on the Hub
             (byte_level, "qwen3", "PreTrainedTokenizerFast", "TokenizersBackend")]  # the built-ins
    for i, (source, model_type, declared, expected) in enumerate(cases):
        if model_type == "mixtral" and is_mistral_common_available():
            continue
        path = user_checkpoint(source, tmp_path / str(i), model_type, tokenizer_class=declared)
        assert tokenizer_class_name(path) == expected
        assert type(AutoTokenizer.from_pretrained(str(path), local_files_only=True)).__name__ == expected


@pytest.mark.parametrize("declared", ["LlamaTokenizerFast", "Qwen2Tokenizer", "GPT2Tokenizer"])
def test_loading_a_user_checkpoints_tokenizer_does_not_import_torch(declared: str, tmp_path: Path) -> None:
    path = user_checkpoint(resolve_model("builtin:tiny-dense"), tmp_path / "mine", tokenizer_class=declared)
    code = ("import sys\nfrom asyncdp.model import load_tokenizer\n"
            f"print(type(load_tokenizer({str(path)!r})).__name__)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split("\n")[1] == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("edit", [
    {"auto_map": {"AutoTokenizer": ["tokenization_mine.MineTokenizer", None]}},
    {"tokenizer_class": None},
    {"tokenizer_class": "CodeLlamaTokenizer"},  # a class the direct route does not know
])
def test_remote_code_or_no_known_declared_class_goes_through_autotokenizer(
        edit: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = user_checkpoint(resolve_model("builtin:tiny-dense"), tmp_path / "mine", **edit)
    asked: list[str] = []
    real = AutoTokenizer.from_pretrained
    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        lambda path, *args, **kwargs: asked.append(path) or real(path, *args, **kwargs))
    assert tokenizer_class_name(path) is None
    load_tokenizer(path)
    assert asked == [str(path)]


def test_other_model_types_and_hub_ids_forced_to_the_generic_class_go_through_autotokenizer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dense = resolve_model("builtin:tiny-dense")
    assert tokenizer_class_name(user_checkpoint(dense, tmp_path / "gemma", "gemma")) is None
    monkeypatch.chdir(tmp_path)  # AutoTokenizer matches these Hub ids against the path as given, relative here
    user_checkpoint(dense, tmp_path / "deepseek-ai" / "deepseek-coder-1.3b", tokenizer_class="GPT2Tokenizer")
    assert tokenizer_class_name("deepseek-ai/deepseek-coder-1.3b") is None
    auto = AutoTokenizer.from_pretrained("deepseek-ai/deepseek-coder-1.3b", local_files_only=True)
    assert_same_tokenizer(load_tokenizer("deepseek-ai/deepseek-coder-1.3b"), auto)
