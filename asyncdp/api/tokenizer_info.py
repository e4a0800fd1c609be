"""``GET /tokenizer_info``'s answer (``--enable-tokenizer-info-endpoint``, vLLM's flag and route): the tokenizer's
configuration, the equivalent of its ``tokenizer_config.json``, as vLLM builds it.

That is the keyword arguments the tokenizer was built with (Transformers' ``init_kwargs``: its special tokens,
``model_max_length``, ``added_tokens_decoder``, ``name_or_path``, its own ``chat_template``, ...) less the two file
paths ``vocab_file`` and ``merges_file``, made JSON as vLLM makes it: a value with a ``content`` (an
``AddedToken``) becomes that text, dicts and lists are walked. Then ``tokenizer_class``, the class's name (first in
the answer, as vLLM's response model dumps it), and the server's ``--chat-template`` over the tokenizer's own.
lm-evaluation-harness's remote tokenizer reads ``eos_token``, ``bos_token``, ``pad_token`` and ``chat_template``.

Where vLLM's answer would fail to encode (a 500), asyncdp's is JSON all the same: a tuple is a list, a dict key
that is no string is written as ``json.dumps`` writes it (``7`` -> ``"7"``), any other value is its ``str``.
vLLM names the class of its caching wrapper (``CachedLlamaTokenizerFast``); asyncdp the tokenizer's own class.
The answer is built once, when the app is (the tokenizer does not change).
"""

from __future__ import annotations

import json
from typing import Any

_FILE_PATHS = ("vocab_file", "merges_file")  # what vLLM leaves out


def tokenizer_info(tokenizer: Any, chat_template: str | None) -> dict[str, Any]:
    """The answer for ``tokenizer``; ``chat_template``: the server's ``--chat-template`` text (None: none given)."""
    config = {k: v for k, v in (getattr(tokenizer, "init_kwargs", None) or {}).items()
              if k not in (*_FILE_PATHS, "tokenizer_class")}
    info: dict[str, Any] = {"tokenizer_class": type(tokenizer).__name__, **_json(config)}
    if chat_template:
        info["chat_template"] = chat_template
    return info


def _json(value: Any) -> Any:
    if hasattr(value, "content"):  # (first, as vLLM tests it: an AddedToken is its text)
        return value.content
    if isinstance(value, dict):
        return {_key(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if value is None or isinstance(value, str | int | float):  # (bool is an int)
        return value
    return str(value)


def _key(key: Any) -> str:
    """A dict key as ``json.dumps`` writes it (vLLM's encoder): None and booleans as JSON, the rest as text."""
    return json.dumps(key) if key is None or isinstance(key, bool) else str(key)
