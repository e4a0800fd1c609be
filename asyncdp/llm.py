"""Offline batch inference in vLLM's shape: ``LLM(model, **engine_args).generate(prompts, params)``.

One in-process ``EngineCore`` (no DP, no processes). ``generate`` adds every prompt (``n > 1`` fans out into
``n`` sub-requests, with ``seed + k`` when a seed is set, wrapped into 64 bits as the HTTP API's samples:
``sample_seed``), steps the core until all finish, and returns one cumulative ``asyncdp.outputs.RequestOutput``
per prompt, in prompt order. Its ``num_cached_tokens`` is the prefix-cache hit of the request's first scheduling
(sample 0's, admitted first: later samples hit the blocks it computed, which were not cached when the prompt came). If stepping raises (or is
interrupted), the outstanding requests are aborted so the engine stays usable. A request the engine ends with an
error (its grammar failed mid-generation) raises ``InvalidRequestError`` naming its field the same way: no
output cut short is returned as if complete.

vLLM's engine arguments beyond ``EngineConfig``'s: ``generation_config`` and ``override_generation_config`` give the
sampling defaults (:mod:`asyncdp.config.generation_config`; the model's own under ``"auto"``) that
``get_default_sampling_params()`` returns and ``generate`` uses when given no sampling params (params given are used
as they are, as in vLLM); ``max_logprobs`` bounds a request's logprobs and prompt logprobs (vLLM's refusal; -1: the
vocabulary's size).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import reprlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from asyncdp.config.flags import EngineConfig
from asyncdp.config.generation_config import (
    generation_notice,
    generation_source,
    resolve_generation_defaults,
)
from asyncdp.config.vllm_flags import DEFAULT_MAX_LOGPROBS
from asyncdp.engine.build import build_engine_core
from asyncdp.engine.core import EngineCore
from asyncdp.errors import ConfigError, InvalidRequestError, ShuttingDownError
from asyncdp.outputs import CompletionOutput, RequestOutput
from asyncdp.sampling_params import (
    MAX_INT32,
    SamplingParams,
    check_logprobs,
    default_sampling_params,
    sample_seed,
)

log = logging.getLogger(__name__)

PromptType = str | list[int] | dict[str, Any]


_ACCEPTED = ("a string, a list of token ids (Python ints), a dict with 'prompt' (a string) or 'prompt_token_ids' "
             "(a list of token ids), or a list of these")


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list | tuple) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _check_prompt(prompt: object, where: str) -> PromptType:
    """``prompt`` as ``_tokenize`` takes it, or InvalidRequestError naming what is accepted (never bytes read as
    token ids, never a TypeError deep in the tokenizer or the detokenizer)."""
    if isinstance(prompt, str):
        return prompt
    if _is_token_ids(prompt):
        return list(prompt)  # type: ignore[call-overload]
    if isinstance(prompt, dict) and (
            _is_token_ids(prompt["prompt_token_ids"]) and isinstance(prompt.get("prompt"), str | None)
            if "prompt_token_ids" in prompt else isinstance(prompt.get("prompt"), str)):
        return prompt
    raise InvalidRequestError(f"{where} must be {_ACCEPTED}; got {type(prompt).__name__} {reprlib.repr(prompt)}.",
                              field="prompts")


def _normalize_prompts(prompts: object) -> list[PromptType]:
    if isinstance(prompts, str | dict) or (_is_token_ids(prompts) and prompts):
        return [_check_prompt(prompts, "prompts")]
    if isinstance(prompts, bytes | bytearray | memoryview) or not isinstance(prompts, Iterable):
        raise InvalidRequestError(f"prompts must be {_ACCEPTED}; got {type(prompts).__name__} "
                                  f"{reprlib.repr(prompts)}.", field="prompts")
    return [_check_prompt(prompt, f"prompts[{i}]") for i, prompt in enumerate(prompts)]


def _params_list(sampling_params: object, count: int, default: SamplingParams) -> list[SamplingParams]:
    if sampling_params is None:
        return [default] * count
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * count
    if not isinstance(sampling_params, list | tuple) or not all(
            isinstance(p, SamplingParams) for p in sampling_params):
        raise InvalidRequestError(
            "sampling_params must be a SamplingParams, a list of them (one per prompt) or None; got "
            f"{type(sampling_params).__name__} {reprlib.repr(sampling_params)}.", field="sampling_params")
    if len(sampling_params) != count:
        raise InvalidRequestError(
            f"got {len(sampling_params)} sampling params for {count} prompts", field="sampling_params")
    return list(sampling_params)


def _vocab_size(tokenizer: Any) -> int:
    """The vocabulary's size, ``max_logprobs=-1``'s limit: a Hugging Face tokenizer's ``len``, a ``tokenizers``
    one's ``get_vocab_size()`` (the built-in models'), or no limit without a tokenizer."""
    if tokenizer is None:
        return MAX_INT32
    return len(tokenizer) if hasattr(tokenizer, "__len__") else int(tokenizer.get_vocab_size())


class LLM:
    def __init__(self, model: str, *, generation_config: str = "auto",
                 override_generation_config: Mapping[str, Any] | None = None,
                 max_logprobs: int = DEFAULT_MAX_LOGPROBS, **engine_args: Any) -> None:
        config = EngineConfig(model=model, **engine_args).validate()
        if max_logprobs < -1:
            raise ConfigError(f"max_logprobs must be -1 (no limit) or >= 0 (got {max_logprobs}).")
        defaults = _generation_defaults(model, generation_config, dict(override_generation_config or {}))
        self.llm_engine: EngineCore = self._build(config)
        self.tokenizer = self.llm_engine.tokenizer
        self._default_params = defaults
        self.max_logprobs = max_logprobs
        self._counter = itertools.count()
        self._shut_down = False

    @staticmethod
    def _build(config: EngineConfig) -> EngineCore:
        return build_engine_core(config)

    @classmethod
    def from_engine_core(cls, core: EngineCore) -> LLM:
        """Wrap an already built core (tests, custom executors)."""
        self = cls.__new__(cls)
        self.llm_engine = core
        self.tokenizer = core.tokenizer
        self._default_params = SamplingParams()
        self.max_logprobs = DEFAULT_MAX_LOGPROBS
        self._counter = itertools.count()
        self._shut_down = False
        return self

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: what ``generate`` uses when given no sampling params, ``SamplingParams()`` with the sampling
        defaults of ``generation_config`` (and ``override_generation_config``) set."""
        return self._default_params

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidRequestError("text prompts need a tokenizer", field="prompt")
            return prompt, list(self.tokenizer.encode(prompt))
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            return self._tokenize(prompt["prompt"])
        return None, list(prompt)

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        if self._shut_down:  # its executor is gone: stepping would fail deep in the model
            raise ShuttingDownError("this LLM is shut down (shutdown() or its with block ended); create a new LLM.")
        items = _normalize_prompts(prompts)
        params_list = _params_list(sampling_params, len(items), self._default_params)
        limit = _vocab_size(self.tokenizer) if self.max_logprobs == -1 else self.max_logprobs
        core = self.llm_engine
        results: list[RequestOutput] = []
        children: dict[str, tuple[CompletionOutput, RequestOutput]] = {}
        added: list[str] = []
        try:
            for prompt, params in zip(items, params_list, strict=True):
                params.validate()
                check_logprobs(params, limit)  # (vLLM's engine refuses more than max_logprobs)
                text, token_ids = self._tokenize(prompt)
                rid = str(next(self._counter))
                result = RequestOutput(request_id=rid, prompt=text, prompt_token_ids=token_ids)
                results.append(result)
                for k in range(params.n):
                    sub = params if params.n == 1 else _child_params(params, k)
                    sub_id = rid if params.n == 1 else f"{rid}_{k}"
                    added.append(sub_id)  # first: an interrupt inside add_request may leave it added
                    core.add_request(sub_id, token_ids, sub, validated=True)  # validated once, above
                    completion = CompletionOutput(index=k, text="", token_ids=[])
                    result.outputs.append(completion)
                    children[sub_id] = (completion, result)
            self._run(children, len(results) if use_tqdm else 0)
        except BaseException:
            core.abort_requests(added)
            with contextlib.suppress(Exception):
                core.step()  # applies the aborts (all requests are ours, so nothing else is scheduled)
            raise
        for result in results:
            result.finished = all(c.finish_reason is not None for c in result.outputs)
        return results

    def _run(self, children: dict[str, tuple[CompletionOutput, RequestOutput]], progress_total: int) -> None:
        core = self.llm_engine
        remaining = set(children)
        bar = _progress_bar(progress_total)
        idle_steps = 0
        while remaining:
            step = core.step()
            idle_steps = 0 if step.executed or step.outputs else idle_steps + 1
            if idle_steps > 2:
                raise RuntimeError("the engine stopped making progress (is it paused?)")
            for delta in step.outputs:
                entry = children.get(delta.request_id)
                if entry is None:
                    continue
                if delta.error_type is not None:  # its grammar failed mid-generation: no cut-short answer
                    raise InvalidRequestError(delta.error or "the request failed", field=delta.error_field)
                completion, result = entry
                completion.token_ids.extend(delta.new_token_ids)
                completion.text += delta.new_text
                if delta.logprobs is not None:
                    completion.logprobs = (completion.logprobs or []) + list(delta.logprobs)
                if delta.prompt_logprobs is not None and result.prompt_logprobs is None:  # n > 1: same for all
                    result.prompt_logprobs = delta.prompt_logprobs
                if completion.index == 0:  # n > 1: the prompt's hit, not a sibling's on what sample 0 computed
                    result.num_cached_tokens = delta.num_cached_tokens
                if delta.finished:
                    completion.finish_reason = delta.finish_reason
                    completion.stop_reason = delta.stop_reason
                    remaining.discard(delta.request_id)
                    if bar is not None and all(c.finish_reason is not None for c in result.outputs):
                        bar.update(1)
        if bar is not None:
            bar.close()

    def shutdown(self) -> None:
        """Release the engine; idempotent. ``generate`` then raises ``ShuttingDownError``."""
        if not self._shut_down:
            self._shut_down = True
            self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _generation_defaults(model: str, generation_config: str, override: dict[str, Any]) -> SamplingParams:
    """The default sampling params of ``model`` under vLLM's ``generation_config`` and ``override_generation_config``
    (a ConfigError for a bad folder or value, before the model loads), said once where defaults apply."""
    from asyncdp.model import read_model_info, resolve_model  # lazy: asyncdp.model imports transformers

    model_fields = {}
    if generation_config == "auto":
        model_fields = dict(read_model_info(resolve_model(model)).generation_defaults)
    # (no cap: vLLM's LLM applies none, its serving layer does)
    defaults = resolve_generation_defaults(generation_config, override, model_fields)
    defaults = msgspec.structs.replace(defaults, max_tokens_cap=None)
    params = default_sampling_params(defaults, generation_source(generation_config, override))
    notice = generation_notice(defaults, generation_config)
    if notice is not None:
        log.warning("%s", notice)
    return params


def _child_params(params: SamplingParams, k: int) -> SamplingParams:
    return msgspec.structs.replace(params, n=1, seed=sample_seed(params.seed, k))  # as the HTTP API's samples


def _progress_bar(total: int) -> Any:
    if total <= 0:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Processed prompts")
