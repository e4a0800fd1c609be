"""A built-in checkpoint's tokenizer is loaded by its declared class, and is the tokenizer ``AutoTokenizer`` gives.

``load_tokenizer`` skips ``AutoTokenizer`` for the built-ins (its import pulls in torch, which an API server does
not need); these tests hold that the skip changes nothing a request sees: the same class, vocabulary, special
tokens, chat template, encodings and decodings, for every built-in the machine can materialise.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from asyncdp.model import builtin_names, load_tokenizer, resolve_model
from tests.model.test_model_smollm2 import HAVE_SMOLLM2

TEXTS = ["Hello, world!", "  leading spaces and\ttabs\n\nnewlines", "naïve café 東京 🙂", "<|im_start|>user\nhi",
         "12345 + 678 = ?", ""]
BUILTINS = [name for name in builtin_names() if "smollm2" not in name or HAVE_SMOLLM2]


@pytest.mark.parametrize("name", BUILTINS)
def test_a_builtins_tokenizer_is_the_one_autotokenizer_loads(name: str) -> None:
    path = resolve_model(name)
    ours = load_tokenizer(path)
    auto = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert type(ours) is type(auto)
    assert ours.get_vocab() == auto.get_vocab()
    assert ours.all_special_tokens == auto.all_special_tokens and ours.all_special_ids == auto.all_special_ids
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == \
        (auto.bos_token_id, auto.eos_token_id, auto.pad_token_id)
    assert ours.chat_template == auto.chat_template
    for text in TEXTS:
        ids = ours(text)["input_ids"]
        assert ids == auto(text)["input_ids"], text
        assert ours.decode(ids) == auto.decode(ids)
        assert ours.convert_ids_to_tokens(ids) == auto.convert_ids_to_tokens(ids)


def test_loading_a_builtins_tokenizer_does_not_import_torch() -> None:
    path = resolve_model("builtin:tiny-dense")
    code = ("import sys\nfrom asyncdp.model import load_tokenizer\n"
            f"load_tokenizer({str(path)!r})\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_checkpoint_outside_the_builtin_cache_still_loads(dense_path: Path) -> None:
    """An exported built-in is any user's checkpoint: ``AutoTokenizer`` loads it, and it is the same tokenizer."""
    assert load_tokenizer(dense_path).get_vocab() == load_tokenizer(resolve_model("builtin:tiny-dense")).get_vocab()


def test_a_folder_in_the_models_cache_that_declares_another_class_and_remote_code_goes_through_autotokenizer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCDP_CACHE_DIR", str(tmp_path))
    builtin = resolve_model("builtin:tiny-dense")  # materialised in this test's cache
    mine = tmp_path / "models" / "mine"  # a checkpoint someone put beside it by hand
    shutil.copytree(builtin, mine)
    config = json.loads((mine / "tokenizer_config.json").read_text())
    # Remote code (``auto_map``) is one thing that keeps a declared class on AutoTokenizer's route.
    auto_map = {"AutoTokenizer": ["tokenization_mine.MineTokenizer", None]}
    (mine / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "GPT2Tokenizer", "auto_map": auto_map}))
    asked: list[str] = []
    real = AutoTokenizer.from_pretrained
    monkeypatch.setattr(AutoTokenizer, "from_pretrained",
                        lambda path, *args, **kwargs: asked.append(path) or real(path, *args, **kwargs))
    load_tokenizer(builtin)
    assert asked == []
    assert type(load_tokenizer(mine)).__name__ == "GPT2Tokenizer"
    assert asked == [str(mine)]
