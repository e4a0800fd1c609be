"""``GET /tokenizer_info`` (vLLM's, behind ``--enable-tokenizer-info-endpoint``): off, the route does not exist (a
404 in OpenAI's error shape); on, the tokenizer's configuration as vLLM builds it (the tokenizer's init kwargs less
its file paths, added tokens as their text, ``tokenizer_class``, and ``--chat-template``'s text over the
tokenizer's), which lm-evaluation-harness's remote tokenizer (``tokenizer_backend=remote``, and ``auto`` when a
server offers it) reads with ``/tokenize`` and ``/detokenize``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from tokenizers import AddedToken

from asyncdp.api.tokenizer_info import tokenizer_info
from asyncdp.testing import FakeEngineClient
from asyncdp.testing.tokenizer import CHATML_TEMPLATE
from tests.api.conftest import running

pytestmark = pytest.mark.anyio

KEY = "sk-test-key"
# What lm-eval's RemoteTokenizer reads of the answer (lm_eval/utils.py): eos_token, bos_token and pad_token (the
# strings it tokenizes for their ids), chat_template; check_remote_tokenizer_support wants "eos_token" present.
LM_EVAL_READS = ("eos_token", "bos_token", "pad_token", "chat_template")


async def test_without_the_flag_the_route_is_a_404_in_openai_s_shape() -> None:
    async with running() as srv:
        r = await srv.http.get("/tokenizer_info")
        doc = (await srv.http.get("/openapi.json")).json()
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == 404 and r.json()["error"]["type"] == "NotFoundError"
    assert "/tokenizer_info" not in doc["paths"]


async def test_with_the_flag_the_answer_is_the_tokenizers_configuration() -> None:
    fake = FakeEngineClient()
    async with running(fake, enable_tokenizer_info_endpoint=True) as srv:
        r = await srv.http.get("/tokenizer_info")
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["tokenizer_class"] == type(fake.tokenizer).__name__
    assert info["eos_token"] == "<|im_end|>" and info["pad_token"] == "<|endoftext|>"
    assert info["chat_template"] == CHATML_TEMPLATE
    assert "bos_token" not in info  # (not among the tokenizer's init kwargs: vLLM leaves it out too)
    assert next(iter(info)) == "tokenizer_class"  # first, as vLLM's response model dumps it


async def test_a_checkpoints_tokenizer_gives_every_field_lm_eval_reads() -> None:
    from asyncdp.model import load_tokenizer, resolve_model

    fake = FakeEngineClient(tokenizer=load_tokenizer(resolve_model("builtin:tiny-dense")))
    async with running(fake, enable_tokenizer_info_endpoint=True) as srv:
        info = (await srv.http.get("/tokenizer_info")).json()
    assert all(field in info for field in LM_EVAL_READS), sorted(info)
    assert (info["eos_token"], info["bos_token"], info["pad_token"]) == ("<|im_end|>", None, "<|endoftext|>")
    assert info["chat_template"] == fake.tokenizer.chat_template and info["model_max_length"] == 2048
    assert info["added_tokens_decoder"]["256"] == "<|endoftext|>"  # AddedTokens as their text, keys as JSON's
    assert "vocab_file" not in info and "merges_file" not in info


async def test_chat_template_is_the_servers_when_it_has_its_own() -> None:
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    fake = FakeEngineClient()
    async with running(fake, enable_tokenizer_info_endpoint=True, chat_template=template) as srv:
        info = (await srv.http.get("/tokenizer_info")).json()
        rendered = await srv.http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}],
                                                          "add_generation_prompt": False})
    assert info["chat_template"] == template
    assert fake.tokenizer.decode(rendered.json()["tokens"]) == "[user] hi\n"  # and prompts render with it


async def test_the_route_wants_the_api_key_and_the_schema_lists_it() -> None:
    async with running(enable_tokenizer_info_endpoint=True, api_key=KEY) as srv:
        denied = await srv.http.get("/tokenizer_info")
        allowed = await srv.http.get("/tokenizer_info", headers={"Authorization": f"Bearer {KEY}"})
        doc = (await srv.http.get("/openapi.json")).json()
    assert denied.status_code == 401 and allowed.status_code == 200
    assert doc["paths"]["/tokenizer_info"]["get"]["summary"] == "The tokenizer's configuration"


def test_added_tokens_become_their_text_and_other_values_json() -> None:
    class Tok:
        init_kwargs: dict[str, Any] = {
            "eos_token": AddedToken("</s>", special=True), "bos_token": None, "vocab_file": "/x/vocab.json",
            "merges_file": "/x/merges.txt", "added_tokens_decoder": {7: AddedToken("<pad>")},
            "extra_special_tokens": [AddedToken("<a>"), "<b>"], "pair": (AddedToken("<c>"), 1),
            "model_max_length": 2048, "path": Path("/x"), "flag": True, "ratio": 0.5,
        }

    info = tokenizer_info(Tok(), None)
    assert info == {"tokenizer_class": "Tok", "eos_token": "</s>", "bos_token": None,
                    "added_tokens_decoder": {"7": "<pad>"}, "extra_special_tokens": ["<a>", "<b>"],
                    "pair": ["<c>", 1], "model_max_length": 2048, "path": "/x", "flag": True, "ratio": 0.5}
    assert "chat_template" not in tokenizer_info(Tok(), None)  # (neither the tokenizer's nor the server's)
    assert tokenizer_info(Tok(), "T")["chat_template"] == "T"


LMEVAL_PYTHON = Path(os.environ.get("ASYNCDP_TOOLS_DIR", "/work/tools")) / "lmeval" / "bin" / "python"
# lm-eval's own client, as tokenizer_backend=auto and =remote run it against the server
LMEVAL_SCRIPT = """
import json, sys
from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support
url = sys.argv[1] + "/v1/completions"
tok = RemoteTokenizer(url)
ids = tok.encode("hello")
print(json.dumps({"auto": check_remote_tokenizer_support(url), "eos": tok.eos_token, "eos_id": tok.eos_token_id,
                  "bos_id": tok.bos_token_id, "ids": ids, "text": tok.decode(ids),
                  "chat": tok.apply_chat_template([{"role": "user", "content": "hi"}])}))
"""


@pytest.mark.skipif(not LMEVAL_PYTHON.exists(), reason=f"lm-evaluation-harness is not installed ({LMEVAL_PYTHON})")
async def test_lm_eval_s_remote_tokenizer_works_against_it() -> None:
    fake = FakeEngineClient()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    async with running(fake, enable_tokenizer_info_endpoint=True) as srv:
        with anyio.fail_after(60):
            done = await anyio.run_process([str(LMEVAL_PYTHON), "-c", LMEVAL_SCRIPT, srv.base_url], env=env,
                                           check=False)
    assert done.returncode == 0, done.stderr.decode()
    got = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert got["auto"] is True and got["eos"] == "<|im_end|>"
    assert got["eos_id"] == fake.tokenizer.convert_tokens_to_ids("<|im_end|>") and got["bos_id"] is None
    assert got["ids"] == list(b"hello") and got["text"] == "hello"
    assert got["chat"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
